"""Mid-stream continuation: an engine that cuts a text (or thinking) answer is asked again,
with the answer so far as an assistant prefill, and its continuation is spliced into the same
stream, so the client sees one well-formed reply.

A cut (see :class:`~gateway.messages.call.Cut`) is the body failing while it is read (a lost
connection), an in-band 5xx error chunk, or the body ending without a ``finish_reason``; a
stream that stopped sending (``idle_timeout``) is stuck, not cut, and is not asked again (the
client would wait ``idle_timeout`` more each time). The same chat request is sent again
through :func:`gateway.upstream.send.send` (the cut replica is ejected first, so the session's
next replica takes it when there is one; else the same upstream again) with
``{"role": "assistant", "content": <the answer so far>}`` appended to its messages:

- vLLM and SGLang: with ``continue_final_message: true, add_generation_prompt: false``.
  vLLM refuses the first with ``add_generation_prompt: true`` and renders through
  transformers' ``apply_chat_template(continue_final_message=True)``, which cuts the
  rendered prompt right after the final message's *content* and refuses (a 400 here: the
  continuation is not sent, the stream ends as it would have) a content the template did not
  write out verbatim: Qwen3-style templates rewrite a content holding ``</think>`` into
  ``<think>\nR\n</think>\n\nTEXT``, so on vLLM a reply cut in its text after a thought
  is not continued with such a template (unverified against a real vLLM). SGLang
  (``serving_chat.py``, ``_handle_last_assistant_message``) removes the final assistant
  message, renders the others and appends the tokens of its string ``content`` alone (any
  ``reasoning_content`` is not read); without the flag it would make that message a *user*
  turn;
- llama.cpp (``llama-server``, prefill on unless started with ``--no-prefill-assistant``):
  the messages before it are rendered with the generation prompt and the final assistant
  message after it, no end of turn; its reasoning goes as ``reasoning_content``, see
  :data:`_REASONING_FIELD_KINDS` (verified against a real llama-server:
  tests/e2e/test_continuation_llama.py);
- Ollama (``/v1``: an assistant message's reasoning is its ``reasoning`` field, not
  ``reasoning_content``; its Go renderers, e.g. ``model/renderers/qwen35.go``, leave a final
  assistant message open, trim spaces around its content, and pull an inline
  ``<think>R</think>`` out of the content as the thought): continued as it is. Its parsers
  read the continuation as text when the prefill has content, so a cut mid-thought (sent as
  ``<think>R``) comes back as text there too (unverified against a real Ollama);
- elsewhere reasoning streamed as ``reasoning_content`` goes back inline
  (``<think>...</think>``, the text after it), which is what vLLM's and SGLang's reasoning
  parsers read back (best effort: a template may drop reasoning from history).

``max_tokens`` is lowered by the tokens already generated. The continuation's chunks go
through :class:`Continued` and are fed to the *same* translator: its role-only first chunk
is dropped and its usage is rewritten (output tokens: both parts; the prompt: the first
part's), so the open block simply goes on. At most ``upstreams.X.max_continuations`` (2)
continuations per reply; past them (or when the continuation cannot be sent) the stream ends
as it would have without any: the translator's failure envelope (``upstream_truncated``, the
in-band error) or the read failure raised.

A stream cut while a tool call's arguments stream (its block is open, no tool block has
closed: see :meth:`StreamTranslator.regenerable_call`) has shown the client that block's
start and none of its arguments, which the translator holds until a block closes. The calls
are generated again whole: the prefill is the text (and the closed reasoning) before them,
``max_tokens`` is lowered by the tokens before them, and :class:`Regenerated` splices the new
stream: its first call, which must name the same tool, goes into the open block in place of
the held arguments; a reply that does not fit (text, another tool, no call) is a cut like
any other. A call whose block has closed, or one written as text that has already made
its ``tool_use`` block, is not continued.

A call written as text (``<tool_call>{...}``, Llama's whole-message ``{"name": ...}``,
``[TOOL_CALLS]...``: :mod:`gateway.local.text_tools`) is held by the translator's
normaliser until it is whole, so a stream cut inside one has shown the client nothing of
it: not the possible opener (``<tool_``), not the open block, not a whole message held as a
possible call, not the start of the content held until it shows whether ``<think>`` opens
it (whitespace, ``<``); only what came before it (text, a thought). It is treated like a native call
cut mid-arguments: :meth:`StreamTranslator.drop_held_call` forgets the held text, so the
prefill is only what the client was shown (whitespace the normaliser holds before it stays
held, and in the prefill: text or a call decides it), ``max_tokens`` and the output tokens
count only the deltas before it, and the model writes the call again whole, which the
normaliser then makes a ``tool_use`` block as usual. Prefilled, the held text was resumed
imperfectly (a real llama.cpp: ``{"nam`` went on ``ame"...``) and the garbled call reached
the client as text. The same when the cut comes after a call is whole but before its
delivery (a closed body that waits for the end, before ``</tool_call>``). A cut inside a
second call written as text, after a first one made its block, is not continued (as above).

The translator stays pure: it is read (what was streamed, whether a finish came, which call
is open) and, when calls are generated again, told to forget the held ones.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack, nullcontext
from typing import Any, Protocol

import structlog

from gateway import errors
from gateway.messages.stream.pump import Body, Cut, Timing, pump
from gateway.messages.stream.splice import Continued, Regenerated
from gateway.messages.stream.translator import StreamTranslator
from gateway.ops.config import ModelRoute
from gateway.ops.metrics import Metrics
from gateway.ops.telemetry import CURRENT
from gateway.text import jsonutil
from gateway.upstream.send import Upstreams, send

__all__ = ["Continuable", "Upstream", "continuation_payload", "relay"]


class Upstream(Body, Protocol):
    """The reply a stream began with (:class:`~gateway.upstream.client.UpstreamResponse`)."""

    def abandon(self) -> None:
        """It cut the stream: its replica is ejected, so the continuation goes elsewhere."""


class _Deps(Protocol):
    @property
    def upstreams(self) -> Upstreams: ...

    @property
    def metrics(self) -> Metrics: ...


class Continuable(Protocol):
    """What a continuation needs of the Messages call (:class:`gateway.messages.call.Call`,
    which imports this module: the call is known by this shape only)."""

    @property
    def route(self) -> ModelRoute: ...

    @property
    def deps(self) -> _Deps: ...

    @property
    def session(self) -> str | None: ...

    def chat_request(self) -> dict[str, Any]:
        """The chat request the call sent, as a fresh dict the caller may change (made from
        the client's request again: the payload's bytes are not decoded)."""
        ...


_log = structlog.get_logger("gateway.messages")

# kinds whose chat template needs telling to continue the final assistant message
_CONTINUE_FLAG_KINDS = frozenset({"vllm", "sglang"})
# kinds that take the reasoning so far as the prefill message's ``reasoning_content``, not
# inline. llama-server (observed with xllamacpp 2026.10, tests/e2e/test_continuation_llama.py)
# writes a final assistant message itself after the generation prompt, with the template's
# reasoning markers: with ``reasoning_content`` and an empty content the reasoning is left
# open (``<think>\nREASONING``) and the reply is parsed as reasoning until the model's
# ``</think>``; with content too it is closed (``<think>\nREASONING\n</think>\n\nTEXT``).
# Without ``reasoning_content`` it writes an empty block (``<think>\n\n</think>\n\n``)
# before the content and parses nothing of the reply as reasoning, so an inline ``<think>``
# thought went on as text: its rest, its ``</think>`` and the answer. (Older
# llama-server answered 400 "Assistant response prefill is incompatible with
# enable_thinking" to any prefill with thinking on: the continuation is then not sent and the
# stream ends as it would have.)
_REASONING_FIELD_KINDS = frozenset({"llamacpp"})


async def relay(
    call: Continuable,
    up: Upstream,
    translator: StreamTranslator,
    write: Callable[[bytes], Awaitable[None]],
    timing: Timing,
    inter_chunk: Any,
    *,
    request_id: str | None = None,
    budget: int | None = None,
) -> None:
    """:func:`~gateway.messages.stream.pump.pump` that continues a cut stream (see the module
    docstring); ``up`` stays the caller's to close, continuations are closed here. Only a
    translator that keeps what was streamed (``keep_streamed``: the route continues cut
    streams) is continued; any other stream is pumped as it is."""
    if budget is None:
        budget = call.route.upstream.max_continuations
    if not translator.keeps_streamed:
        budget = 0
    cut = await pump(up, translator, write, timing, inter_chunk, resumable=budget > 0)
    if cut is None:
        return
    current: Upstream = up
    spliced: Continued | None = None
    async with AsyncExitStack() as stack:
        while cut is not None:
            # a stream that stopped sending (idle_timeout) is not cut but stuck: asking again
            # would make the client wait idle_timeout more each time
            stuck = isinstance(cut.error, errors.UpstreamTimeout)
            # a tool call cut mid-arguments is generated again whole (its arguments were
            # held); a call whose block closed, or one written as text and delivered, is not
            # continued
            regenerate = translator.regenerable_call() if translator.tool_call_started else None
            if (
                budget <= 0
                or stuck
                or translator.done
                or (translator.tool_call_started and regenerate is None)
            ):
                await _give_up(cut, translator, write)
                return
            budget -= 1
            # a tool call written as text, held (never shown) when the cut came, is written
            # again whole: the prefill is what came before it
            held_dropped = regenerate is None and translator.drop_held_call()
            if spliced is None or not spliced.ended:
                current.abandon()  # it cut the stream: not a new answer that did not fit
            await stack.aclose()  # the last continuation, if any, before the next is sent
            call.deps.metrics.stream_continuations.labels(call.route.name, _cause(cut)).inc()
            _log.warning(
                "stream_continued",
                model=call.route.name,
                upstream=call.route.upstream.name,
                cause=_cause(cut),
                streamed_chars=len(translator.streamed_content)
                + len(translator.streamed_reasoning),
                tool_call_regenerated=regenerate is not None,
                text_call_regenerated=held_dropped,
            )
            payload, max_tokens = continuation_payload(
                call, translator, tool_calls=regenerate is not None or held_dropped
            )
            telemetry = CURRENT.get()
            with (
                nullcontext()
                if telemetry is None
                else telemetry.span(
                    "continuation",
                    {"gateway.model": call.route.name, "gateway.continuation.cause": _cause(cut)},
                )
            ):
                try:
                    nxt = await send(
                        call.deps.upstreams,
                        call.route,
                        "/chat/completions",
                        payload,
                        stream=True,
                        max_tokens=max_tokens,
                        request_id=request_id,
                        session=call.session,
                    )
                except errors.GatewayError:
                    await _give_up(cut, translator, write)
                    return
                current = await stack.enter_async_context(nxt)
                spliced = (
                    Continued(nxt, translator)
                    if regenerate is None
                    else Regenerated(nxt, translator, regenerate, model=call.route.name)
                )
                cut = await pump(spliced, translator, write, timing, inter_chunk, resumable=True)


def _cause(cut: Cut) -> str:
    if cut.error is not None:
        return "read_failed"
    return "inband_error" if cut.payload is not None else "no_finish"


async def _give_up(
    cut: Cut, translator: StreamTranslator, write: Callable[[bytes], Awaitable[None]]
) -> None:
    """End the stream as it would have ended with no continuation."""
    if cut.error is not None:
        raise cut.error
    if cut.payload is not None:
        await write(translator.feed_all([cut.payload]))
    else:
        await write(translator.eof())


def continuation_payload(
    call: Continuable, translator: StreamTranslator, *, tool_calls: bool = False
) -> tuple[bytes, int | None]:
    """The call's chat request with the answer so far as an assistant prefill, and its
    ``max_tokens`` lowered by what was generated (None: the request set none).

    ``tool_calls``: the tool calls are to be generated again whole: the prefill is what came
    before them (the reasoning closed: it ended when the calls began; llama.cpp's only when
    text follows it, see :data:`_REASONING_FIELD_KINDS`), and only the tokens before them
    count as generated. (A call written as text and held is already out of
    ``streamed_content`` and the token count: :meth:`StreamTranslator.drop_held_call`.)"""
    body = call.chat_request()
    text = translator.streamed_content
    reasoning = translator.streamed_reasoning
    kind = call.route.upstream.kind
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning and kind in _REASONING_FIELD_KINDS:
        # open while no text follows it (before regenerated calls too: the calls' own
        # reasoning, if the model thinks again, is dropped by Regenerated)
        message["reasoning_content"] = reasoning
    elif reasoning:
        message["content"] = (
            f"<think>{reasoning}</think>{text}" if text or tool_calls else f"<think>{reasoning}"
        )
    if text or reasoning:
        body["messages"] = _extended(
            body["messages"], message, prefilled=body.get("continue_final_message") is not False
        )
        if kind in _CONTINUE_FLAG_KINDS:
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, int):
        spent = translator.tokens_before_calls if tool_calls else translator.tokens_so_far
        max_tokens = max(1, max_tokens - spent)
        body["max_tokens"] = max_tokens
    else:
        max_tokens = None
    return jsonutil.dumpb(body), max_tokens


def _extended(messages: list[Any], message: dict[str, Any], *, prefilled: bool) -> list[Any]:
    """``messages`` with the answer so far: appended, or, when they end in the client's own
    prefill (an assistant message without calls, not sent as a finished turn with
    ``continue_final_message: false``), added to it: one assistant turn, the prefill then
    what followed it (two would be a finished turn and a new one)."""
    last = messages[-1] if messages else None
    if not (
        prefilled
        and isinstance(last, dict)
        and last.get("role") == "assistant"
        and not last.get("tool_calls")
    ):
        return [*messages, message]
    content = last.get("content")
    if isinstance(content, list):  # content parts: their text
        content = "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    merged = {**last, "content": (content if isinstance(content, str) else "") + message["content"]}
    if "reasoning_content" in message:
        merged["reasoning_content"] = (last.get("reasoning_content") or "") + message[
            "reasoning_content"
        ]
    return [*messages[:-1], merged]
