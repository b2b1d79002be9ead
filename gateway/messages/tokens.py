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
"""

from __future__ import annotations

from typing import Any

import structlog

from gateway import errors
from gateway.ops.config import ModelRoute
from gateway.text import jsonutil
from gateway.upstream.call import Upstreams, send

_log = structlog.get_logger("gateway.tokens")
_TEMPLATE_KEYS = ("tools", "chat_template_kwargs")
_NOT_SERVED = frozenset((404, 405, 501))  # the tokenizer route is not there


def estimate_from_bytes(size: int) -> int:
    """The one estimate rule: four bytes of request JSON per token."""
    return max(1, size // 4)


def estimate(chat_req: dict[str, Any]) -> int:
    """A rough prompt size from the translated messages and tools."""
    size = len(jsonutil.dumpb(chat_req.get("messages", ())))
    if chat_req.get("tools"):
        size += len(jsonutil.dumpb(chat_req["tools"]))
    return estimate_from_bytes(size)


async def _post_json(ups: Upstreams, route: ModelRoute, path: str, body: dict[str, Any],
                     request_id: str | None) -> Any:
    up = await send(ups, route, path, jsonutil.dumpb(body), stream=False, at_root=True,
                    request_id=request_id)
    async with up:
        raw = await up.read()
    try:
        return jsonutil.loads_upstream(raw)
    except ValueError:
        raise errors.UpstreamError(status=500) from None


async def count(ups: Upstreams, route: ModelRoute, chat_req: dict[str, Any],
                request_id: str | None = None) -> tuple[int, bool]:
    """(input_tokens, exact?) for a translated request."""
    kind = route.upstream.kind
    if kind in ("vllm", "llamacpp"):
        try:
            return await _exact(ups, route, chat_req, request_id), True
        except errors.GatewayError as exc:
            if exc.upstream_status not in _NOT_SERVED:
                raise
            _log.info("token_count_estimated", model=route.name, kind=kind,
                      reason="no_tokenizer_route", upstream_status=exc.upstream_status)
            return estimate(chat_req), False
    _log.info("token_count_estimated", model=route.name, kind=kind)
    return estimate(chat_req), False


async def _exact(ups: Upstreams, route: ModelRoute, chat_req: dict[str, Any],
                 request_id: str | None) -> int:
    """The count from a vLLM's or a llama.cpp server's own tokenizer routes."""
    extras = {k: chat_req[k] for k in _TEMPLATE_KEYS if k in chat_req}
    if route.upstream.kind == "vllm":
        body = {"model": route.upstream_model, "messages": chat_req["messages"],
                "add_generation_prompt": chat_req.get("add_generation_prompt", True), **extras}
        reply = await _post_json(ups, route, "/tokenize", body, request_id)
        if isinstance(reply, dict) and isinstance(reply.get("count"), int):
            return int(reply["count"])
        raise errors.UpstreamError(status=500)
    body = {"messages": chat_req["messages"], **extras}
    templ = await _post_json(ups, route, "/apply-template", body, request_id)
    prompt = templ.get("prompt") if isinstance(templ, dict) else None
    if not isinstance(prompt, str):
        raise errors.UpstreamError(status=500)
    toks = await _post_json(ups, route, "/tokenize",
                            {"content": prompt, "add_special": True, "parse_special": True},
                            request_id)
    if isinstance(toks, dict) and isinstance(toks.get("tokens"), list):
        return len(toks["tokens"])
    raise errors.UpstreamError(status=500)
