"""Mid-stream continuation: an engine that cuts a text (or thinking) answer is asked again,
with the answer so far as an assistant prefill, and its continuation is spliced into the same
stream, so the client sees one well-formed reply.

A cut (see :class:`~gateway.messages.call.Cut`) is the body failing while it is read (a lost
connection), an in-band 5xx error chunk, or the body ending without a ``finish_reason``; a
stream that stopped sending (``idle_timeout``) is stuck, not cut, and is not asked again (the
client would wait ``idle_timeout`` more each time). When no tool call has started, the same
chat request is sent again through :func:`gateway.upstream.call.send` (the cut replica is
ejected first, so the session's next replica takes it when there is one; else the same upstream
again) with ``{"role": "assistant", "content": <the answer so far>}`` appended to its messages:

- vLLM and SGLang: with ``continue_final_message: true, add_generation_prompt: false``, so the
  chat template leaves the final assistant message open;
- llama.cpp (``llama-server``) and Ollama: a final assistant message is continued as it is;
- reasoning streamed as ``reasoning_content`` goes back inline (``<think>...</think>``, the
  text after it), which is what the engines' reasoning parsers read back (best effort: a
  template may drop reasoning from history).

``max_tokens`` is lowered by the tokens already generated. The continuation's chunks go
through :class:`Continued` and are fed to the *same* translator: its role-only first chunk
is dropped and its usage is rewritten (output tokens: both parts; the prompt: the first
part's), so the open block simply goes on. At most ``upstreams.X.max_continuations`` (2)
continuations per reply; past them (or when the continuation cannot be sent) the stream ends
as it would have without any: the translator's failure envelope (``upstream_truncated``, the
in-band error) or the read failure raised.

The translator stays pure: it is only read (what was streamed, whether a finish came).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import structlog

from gateway import errors
from gateway.messages.pump import Cut, Timing, pump
from gateway.messages.stream import StreamTranslator
from gateway.text import jsonutil
from gateway.text.sse import SSEDecoder
from gateway.upstream.call import send
from gateway.upstream.client import UpstreamResponse

if TYPE_CHECKING:
    from gateway.messages.call import Call

__all__ = ["Continued", "continuation_payload", "relay"]

_log = structlog.get_logger("gateway.messages")

# kinds whose chat template needs telling to continue the final assistant message
_CONTINUE_FLAG_KINDS = frozenset({"vllm", "sglang"})


async def relay(call: Call, up: UpstreamResponse, translator: StreamTranslator,
                write: Callable[[bytes], Awaitable[None]], timing: Timing, inter_chunk: Any,
                ttft: Any = None, t0: float = 0.0, *, request_id: str | None = None,
                budget: int | None = None) -> None:
    """:func:`~gateway.messages.call.pump` that continues a cut stream (see the module
    docstring); ``up`` stays the caller's to close, continuations are closed here."""
    if budget is None:
        budget = call.route.upstream.max_continuations
    cut = await pump(up, translator, write, timing, inter_chunk, ttft, t0, resumable=budget > 0)
    if cut is None:
        return
    current = up
    async with AsyncExitStack() as stack:
        while cut is not None:
            # a stream that stopped sending (idle_timeout) is not cut but stuck: asking again
            # would make the client wait idle_timeout more each time
            stuck = isinstance(cut.error, errors.UpstreamTimeout)
            if budget <= 0 or stuck or translator.done or translator.tool_call_started:
                await _give_up(cut, translator, write)
                return
            budget -= 1
            current.abandon()
            call.deps.metrics.stream_continuations.labels(call.route.name, _cause(cut)).inc()
            _log.warning("stream_continued", model=call.route.name,
                         upstream=call.route.upstream.name, cause=_cause(cut),
                         streamed_chars=len(translator.streamed_content)
                         + len(translator.streamed_reasoning))
            payload, max_tokens = continuation_payload(call, translator)
            try:
                nxt = await send(call.deps.upstreams, call.route, "/chat/completions", payload,
                                 stream=True, max_tokens=max_tokens, request_id=request_id,
                                 session=call.session)
            except errors.GatewayError:
                await _give_up(cut, translator, write)
                return
            current = await stack.enter_async_context(nxt)
            cut = await pump(Continued(nxt, translator), translator,  # type: ignore[arg-type]
                             write, timing, inter_chunk, None, t0, resumable=True)


def _cause(cut: Cut) -> str:
    if cut.error is not None:
        return "read_failed"
    return "inband_error" if cut.payload is not None else "no_finish"


async def _give_up(cut: Cut, translator: StreamTranslator,
                   write: Callable[[bytes], Awaitable[None]]) -> None:
    """End the stream as it would have ended with no continuation."""
    if cut.error is not None:
        raise cut.error
    if cut.payload is not None:
        await write(translator.feed_all([cut.payload]))
    else:
        await write(translator.eof())


def continuation_payload(call: Call, translator: StreamTranslator) -> tuple[bytes, int | None]:
    """The call's chat request with the answer so far as an assistant prefill, and its
    ``max_tokens`` lowered by what was generated (None: the request set none)."""
    body = jsonutil.loads(call.payload)
    text = translator.streamed_content
    reasoning = translator.streamed_reasoning
    prefill = f"<think>{reasoning}</think>{text}" if reasoning and text else (
        f"<think>{reasoning}" if reasoning else text)
    if prefill:
        body["messages"] = [*body["messages"], {"role": "assistant", "content": prefill}]
        if call.route.upstream.kind in _CONTINUE_FLAG_KINDS:
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, int):
        max_tokens = max(1, max_tokens - translator.tokens_so_far)
        body["max_tokens"] = max_tokens
    else:
        max_tokens = None
    return jsonutil.dumpb(body), max_tokens


class Continued:
    """A continuation's response as the translator should read it: its role-only first
    chunk dropped, its usage made the whole reply's (output tokens: the part before the cut
    added; the prompt: the first part's as reported, else left out). Read on the failure
    path only: each payload is decoded here once more."""

    __slots__ = ("_before", "_cache", "_prompt", "_up", "progress")

    def __init__(self, up: UpstreamResponse, translator: StreamTranslator) -> None:
        self._up = up
        self.progress = up.progress
        self._before = translator.tokens_so_far
        prompt, _ = translator.usage
        reported = translator.prompt_reported
        self._prompt = prompt if reported else None
        self._cache = translator.cache_read if reported else None

    def release_if_complete(self, *, ended: bool = False) -> None:
        self._up.release_if_complete(ended=ended)

    async def chunks(self) -> AsyncIterator[bytes]:
        decoder = SSEDecoder()
        first = True
        async for raw in self._up.chunks():
            out: list[bytes] = []
            for payload in decoder.feed(raw):
                if first and _role_only(payload):
                    first = False
                    continue
                first = False
                out.append(b"data: " + self._rewrite(payload) + b"\n\n")
            if out:
                yield b"".join(out)
        # a partial last event is dropped: without a finish it is a cut like any other

    def _rewrite(self, payload: bytes) -> bytes:
        if b'"usage"' not in payload:
            return payload
        try:
            chunk = jsonutil.loads_upstream(payload)
        except ValueError:
            return payload
        usage = chunk.get("usage") if type(chunk) is dict else None
        if type(usage) is not dict:
            return payload
        usage = dict(usage)
        count = usage.get("completion_tokens")
        if isinstance(count, int):
            usage["completion_tokens"] = count + self._before
        usage.pop("prompt_tokens_details", None)
        if self._prompt is None:
            usage.pop("prompt_tokens", None)
        else:
            usage["prompt_tokens"] = self._prompt
            if self._cache is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": self._cache}
        if isinstance(usage.get("prompt_tokens"), int) and isinstance(
                usage.get("completion_tokens"), int):
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        chunk = {**chunk, "usage": usage}
        chunk.pop("timings", None)  # llama.cpp's cache figures are the continuation's
        return jsonutil.dumpb(chunk)


def _role_only(payload: bytes) -> bool:
    """A first chunk carrying only the assistant role (and empty content)."""
    if b'"role"' not in payload:
        return False
    try:
        chunk = jsonutil.loads_upstream(payload)
    except ValueError:
        return False
    if type(chunk) is not dict or chunk.get("usage") or chunk.get("error") is not None:
        return False
    choices = chunk.get("choices")
    if type(choices) is not list or len(choices) != 1 or type(choices[0]) is not dict:
        return False
    choice = choices[0]
    delta = choice.get("delta")
    if choice.get("finish_reason") is not None or type(delta) is not dict:
        return False
    return all(key == "role" or not value for key, value in delta.items())
