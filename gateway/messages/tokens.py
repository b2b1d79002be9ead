"""Token counting for ``count_tokens`` and the stream's first usage estimate.

Exact counts use the upstream's own tokenizer and chat template:

* vLLM: ``POST /tokenize`` with the chat ``messages`` (and tools) -> ``count``;
* llama.cpp: ``POST /apply-template`` -> ``prompt``, then ``POST /tokenize``
  -> ``tokens`` (two round trips: the template is only applied server-side).

Other kinds (Ollama, SGLang, plain OpenAI) have no chat-aware tokenizer route;
they get an estimate of one token per four bytes of the translated request,
flagged by the ``x-token-count-estimated: true`` response header and a log line. So does a
vLLM or llama.cpp upstream that does not serve the route (404, 405 or 501: a router such as
sglang-router in front of the engines forwards the chat routes only): counting tokens is an
estimate there, never an error.

Large JSON work runs beside the event loop (:class:`OffLoop`: the decoder child past
``server.decode_offload_bytes``): the request's encode, the llama.cpp template reply's
check, the tokenize reply's decode (a 30 MiB prompt's tokens are some 60 MB of JSON). The
templated prompt is not encoded again (:mod:`gateway.text.tokenizer_json`): before, a 30 MiB
prompt was encoded twice and both replies decoded on the loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from gateway import errors
from gateway.ops.config import ModelRoute
from gateway.text import tokenizer_json
from gateway.text.tokenizer_json import encode, encoded_size, llamacpp_tokenize_body, token_count
from gateway.upstream.send import Upstreams, send

_log = structlog.get_logger("gateway.tokens")
_TEMPLATE_KEYS = ("tools", "chat_template_kwargs")
_NOT_SERVED = frozenset((404, 405, 501))  # the tokenizer route is not there
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class OffLoop:
    """Where JSON work on more than ``past`` bytes runs: ``run(fn, *args)`` (the decoder
    child, gateway/http/decoder.py); without ``run``, on the loop."""

    run: Callable[..., Awaitable[Any]] | None = None
    past: int = 0

    async def __call__(self, big: bool, fn: Callable[..., T], *args: Any) -> T:
        if big and self.run is not None:
            result: T = await self.run(fn, *args)
            return result
        return fn(*args)

    def weighs(self, value: Any) -> bool:
        """Whether encoding ``value`` is work for ``run`` (a bounded walk, not an encode)."""
        return self.run is not None and tokenizer_json.size_at_least(value, self.past)


ON_LOOP = OffLoop()


def estimate_from_bytes(size: int) -> int:
    """The one estimate rule: four bytes of request JSON per token."""
    return max(1, size // 4)


def estimate(chat_req: dict[str, Any]) -> int:
    """A rough prompt size from the translated messages and tools."""
    return estimate_from_bytes(encoded_size(*_estimated(chat_req)))


def _estimated(chat_req: dict[str, Any]) -> tuple[Any, ...]:
    messages = chat_req.get("messages", ())
    return (messages, chat_req["tools"]) if chat_req.get("tools") else (messages,)


async def _estimate(chat_req: dict[str, Any], off: OffLoop) -> int:
    values = _estimated(chat_req)
    return estimate_from_bytes(await off(off.weighs(values), encoded_size, *values))


async def _post(
    ups: Upstreams, route: ModelRoute, path: str, body: bytes, request_id: str | None
) -> bytes:
    up = await send(ups, route, path, body, stream=False, at_root=True, request_id=request_id)
    async with up:
        return await up.read()


async def count(
    ups: Upstreams,
    route: ModelRoute,
    chat_req: dict[str, Any],
    request_id: str | None = None,
    off: OffLoop = ON_LOOP,
) -> tuple[int, bool]:
    """(input_tokens, exact?) for a translated request."""
    kind = route.upstream.kind
    if kind in ("vllm", "llamacpp"):
        try:
            return await _exact(ups, route, chat_req, request_id, off), True
        except errors.GatewayError as exc:
            if exc.upstream_status not in _NOT_SERVED:
                raise
            _log.info(
                "token_count_estimated",
                model=route.name,
                kind=kind,
                reason="no_tokenizer_route",
                upstream_status=exc.upstream_status,
            )
            return await _estimate(chat_req, off), False
    _log.info("token_count_estimated", model=route.name, kind=kind)
    return await _estimate(chat_req, off), False


async def _exact(
    ups: Upstreams,
    route: ModelRoute,
    chat_req: dict[str, Any],
    request_id: str | None,
    off: OffLoop,
) -> int:
    """The count from a vLLM's or a llama.cpp server's own tokenizer routes."""
    extras = {k: chat_req[k] for k in _TEMPLATE_KEYS if k in chat_req}
    big = off.weighs((chat_req["messages"], extras))
    if route.upstream.kind == "vllm":
        body = {
            "model": route.upstream_model,
            "messages": chat_req["messages"],
            "add_generation_prompt": chat_req.get("add_generation_prompt", True),
            **extras,
        }
        raw = await _post(ups, route, "/tokenize", await off(big, encode, body), request_id)
        return _counted(await off(len(raw) > off.past, token_count, raw, "count"))
    body = {"messages": chat_req["messages"], **extras}
    raw = await _post(ups, route, "/apply-template", await off(big, encode, body), request_id)
    tokenize = await off(len(raw) > off.past, llamacpp_tokenize_body, raw)
    del raw
    if tokenize is None:
        raise errors.UpstreamError(status=500)
    raw = await _post(ups, route, "/tokenize", tokenize, request_id)
    del tokenize
    return _counted(await off(len(raw) > off.past, token_count, raw, "tokens"))


def _counted(found: int | None) -> int:
    if found is None:  # the reply is not the route's JSON
        raise errors.UpstreamError(status=500)
    return found
