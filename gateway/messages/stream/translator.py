"""OpenAI chat-completion stream chunks in, Anthropic Messages stream events out.

Pure: no I/O, no awaits, no logging. The caller decodes the upstream body with
``gateway.text.sse.SSEDecoder``, feeds each ``data:`` payload here and writes what comes back.

Upstream facts relied on (vLLM, SGLang, llama.cpp llama-server, Ollama ``/v1``):

- A chunk is ``{"choices":[{"index":0,"delta":{...},"finish_reason":null|str}], ...}``; the
  delta may carry ``content``, ``reasoning_content`` (vLLM, SGLang, llama.cpp) or
  ``reasoning`` (Ollama, newer vLLM) and ``tool_calls``. Absent and ``null`` mean the same.
- ``usage`` (``prompt_tokens``/``completion_tokens``) arrives on a chunk of its own after the
  finish chunk (``choices: []``, with ``stream_options.include_usage``), on the finish chunk
  itself (llama.cpp), or on every chunk (vLLM ``continuous_usage_stats``). llama.cpp asked
  for ``return_progress`` puts the prompt's token count in ``prompt_progress.total`` of its
  first chunk.
- A tool call is named (``id``, ``function.name``) in its first delta; later deltas carry only
  ``index`` and ``function.arguments`` pieces. Ollama reuses ``index: 0`` for every call, each
  with a new ``id``, so a new ``id`` at a used index is a new call.
- ``[DONE]`` ends the body; an in-band failure is ``{"error": {...}}`` (or vLLM's bare
  ``{"object": "error", ...}``), with a numeric ``code`` or without one.

Anthropic facts relied on (https://docs.anthropic.com/en/docs/build-with-claude/streaming; checked
on every stream test by ``tests/anthropic_stream_check.py``): ``message_start`` first; blocks one
at a time with indexes 0, 1, 2...; empty-shell starts; every block closed by
``content_block_stop``; one ``message_delta``, then ``message_stop``. ``message_delta.usage``
may carry the cumulative ``input_tokens`` and cache counts besides ``output_tokens``; the
Python SDK (``lib/streaming/_messages.py``, ``accumulate_event``) and the TypeScript SDK
(``MessageStream``) copy each one present into the final message.

Gateway decisions:

- ``message_start.usage.output_tokens`` is 0: no token is out yet, and on a failure path no
  ``message_delta`` follows to correct a made-up provisional figure.
- ``message_delta.usage.output_tokens`` is the upstream's ``completion_tokens``; an upstream
  that never reports usage gets the number of content-bearing chunks (about one token each).
- ``message_start.usage.input_tokens`` is the estimate (or a first chunk's prompt count);
  when the upstream reports the prompt's length, ``message_delta.usage`` carries
  ``input_tokens`` (the uncached part) and, if it reported cached tokens,
  ``cache_read_input_tokens``: the same table as the buffered reply (``tables.usage_from_chat``).
- Reasoning when no thinking was asked for (``show_thinking`` False) makes no block at all
  (the API would not think); ``reasoning_hidden`` tells the caller, which counts it. It
  still counts as a content chunk for the output-token fallback, as it was generated.
- Blocks are placed (opened, closed, a thinking block sealed with its ``signature_delta``,
  on the failure path too) by :mod:`.stream_blocks`; a tool block's contents are
  :mod:`.tool_blocks`'.
- A tool call's arguments are held while its block is open and sent as one
  ``input_json_delta`` when it closes, repaired into an object where they are not one
  (:mod:`gateway.local.tool_args`; ``{}`` for a call that sent none), so the input always
  parses and equals the buffered reply's.
- Parallel calls: the first named call's block opens at once; later ones wait and are sent
  whole, in upstream index order, right after its block closes (a text or thinking delta,
  or the end). Argument pieces for a call with no id/name yet, or for a call whose block is
  already closed, are dropped and counted in ``dropped_tool_deltas``.
- ``finish_reason: tool_calls`` with no tool block delivered is reported as ``end_turn``.
- ``match_stops`` (upstreams that cannot say which stop string matched, see
  ``tables.LOCAL_STOP_KINDS``): ``stop`` is not sent upstream; text is scanned for the
  stop sequences, a tail that may begin one is held back until it resolves, and a hit
  ends the message right there with ``stop_sequence`` (the caller then closes the upstream).
- The failure envelope: ``message_start`` if not yet sent, ``content_block_stop`` for the open
  block (an open tool block first gets the arguments it held, repaired; waiting calls are
  discarded), one ``error`` event, ``message_stop``.
- ``normaliser`` (:mod:`gateway.local.normalise`): what local engines leave in ``content``
  (inline ``<think>``, tool calls written as text) becomes thinking, text and tool_use
  blocks in order; at the end its held text is flushed before the blocks close. Reasoning
  in its own field (the engine's reasoning parser is on) before any content ends the look
  for inline ``<think>``; with no tools offered, content is then text, not fed to it.

Transitions (``State``; every ``_on_*`` method names the states it accepts and raises
``IllegalTransition`` otherwise)::

    method          PRE_START          BLOCK_OPEN                     FINISHED/ERRORED
    a chunk         -> BLOCK_OPEN      BLOCK_OPEN                     raise
    _on_text etc.   raise              BLOCK_OPEN                     raise
                                       -> FINISHED (_on_text: a stop sequence matched)
    _on_done        -> ERRORED         -> FINISHED (finish seen)      raise
                                       -> ERRORED (truncated)
    _on_eof         -> ERRORED         as _on_done                    raise (eof() returns b"")
    _on_failure     -> ERRORED         -> ERRORED                     raise (fail() returns b"")
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import Any

from gateway import errors
from gateway.local.normalise import TEXT_PIECE, THINKING_PIECE, ContentNormaliser
from gateway.messages.from_chat import tables
from gateway.messages.stream import frames
from gateway.messages.stream.blocks import Blocks
from gateway.messages.stream.stops import StopMatcher
from gateway.messages.stream.tool_blocks import TEXT, THINKING, TOOL, Malformed, ToolBlocks
from gateway.text import jsonutil
from gateway.text.redact import NO_SECRETS, Redactor
from gateway.text.sse import encode_event

__all__ = ["IllegalTransition", "State", "StreamTranslator"]


class State(enum.Enum):
    PRE_START = "pre_start"
    BLOCK_OPEN = "block_open"
    FINISHED = "finished"
    ERRORED = "errored"


class IllegalTransition(RuntimeError):
    """A translator method was called in a state that does not accept it (a caller bug)."""


_PRE_START = State.PRE_START
_BLOCK_OPEN = State.BLOCK_OPEN
_FINISHED = State.FINISHED
_ERRORED = State.ERRORED
_LIVE = (State.PRE_START, State.BLOCK_OPEN)
_OPEN_ONLY = (State.BLOCK_OPEN,)

_KEPT_PIECES = 16  # deltas kept as they came before they are joined into one string


class _Kept:
    """Text kept as it streams, in few objects: each :data:`_KEPT_PIECES` deltas are joined
    into one string (a delta's own ``str`` costs about 50 bytes besides its text), and no
    join copies what an earlier one made."""

    __slots__ = ("_joined", "_pieces")

    def __init__(self) -> None:
        self._joined: list[str] = []
        self._pieces: list[str] = []

    def add(self, text: str) -> None:
        pieces = self._pieces
        pieces.append(text)
        if len(pieces) >= _KEPT_PIECES:
            self._joined.append("".join(pieces))
            self._pieces = []

    def text(self) -> str:
        return "".join(self._joined) + "".join(self._pieces)

    def replace(self, text: str) -> None:
        self._joined = [text]
        self._pieces = []


class StreamTranslator:
    """One per streamed request; see the module docstring for the transition table."""

    # one per open stream, thousands at once: no per-instance dict (~1.6 KB)
    __slots__ = (
        "_before_calls",
        "_before_held",
        "_blocks",
        "_calls_seen",
        "_content",
        "_content_chunks",
        "_finish",
        "_hide_thinking",
        "_hosts",
        "_matched",
        "_message_id",
        "_model",
        "_norm",
        "_prompt_reported",
        "_reasoning",
        "_secrets",
        "_show_thinking",
        "_stop_sequences",
        "_stops",
        "_tools",
        "_usage_seen",
        "cache_read",
        "ended_by_done",
        "error",
        "input_tokens",
        "normaliser",
        "output_tokens",
        "reasoning_hidden",
        "started",
        "state",
        "stop_reason",
        "termination",
        "text_tool_calls",
    )

    def __init__(
        self,
        *,
        model: str,
        message_id: str,
        signing_key: bytes,
        stop_sequences: Sequence[str] = (),
        match_stops: bool = False,
        input_tokens: int = 0,
        hosts: Sequence[str] = (),
        secrets: Redactor = NO_SECRETS,
        hide_thinking: bool = False,
        show_thinking: bool = True,
        normaliser: ContentNormaliser | None = None,
        keep_streamed: bool = False,
    ) -> None:
        self.state = State.PRE_START
        self._model = model
        self._message_id = message_id
        self._stop_sequences = stop_sequences
        # the upstream cannot say which stop string matched (llama.cpp, Ollama): the gateway
        # matches text itself and holds back a tail that may be the start of one
        self._stops = StopMatcher(stop_sequences) if match_stops and stop_sequences else None
        self._hosts = hosts  # and every upstream's secrets: scrubbed from in-band errors
        self._secrets = secrets
        self._hide_thinking = hide_thinking  # thinking.display "omitted": signature only
        self._show_thinking = show_thinking  # False: no thinking asked for, so no block
        # results, read by the caller for metrics and logs
        self.termination: str | None = None
        self.stop_reason: str | None = None
        self.input_tokens = input_tokens  # the estimate until the upstream reports usage
        self.cache_read: int | None = None  # prompt tokens the upstream read from its cache
        self.output_tokens = 0
        self.started = False
        self.error: errors.GatewayError | None = None  # what the failure envelope carried
        self.reasoning_hidden = False  # reasoning arrived that nobody asked for (counted)
        # upstream facts so far
        self._finish: str | None = None
        self._matched: str | None = None
        self._usage_seen = False
        self._prompt_reported = False  # its usage said how long the prompt was
        self._content_chunks = 0
        # what the engine has streamed, as it sent it (read by a mid-stream continuation,
        # gateway/messages/continuation.py, to send it back as the answer's prefill); None:
        # kept nowhere (the route does not continue cut streams: ``keep_streamed`` False)
        self._content = _Kept() if keep_streamed else None
        self._reasoning = _Kept() if keep_streamed else None
        self._calls_seen = False
        self._before_calls = (0, 0)  # (tokens_so_far, content chunks) as the first call came
        # (tokens_so_far, content chunks) before the delta in which the normaliser began to
        # hold text that may be a tool call (see drop_held_call); with a usage mid-stream,
        # that delta is taken as one token
        self._before_held = (0, 0)
        self.ended_by_done = False  # the upstream's [DONE] ended it (its body ends next)
        # the open block
        self._tools = ToolBlocks()  # the tool calls: tool_use blocks' contents
        self._blocks = Blocks(signing_key, self._stops, self._tools, hide_thinking)
        # what local engines leave in content (inline <think>, tool calls written as text)
        self.normaliser = normaliser  # kept for the caller's counts once the stream ends
        self._norm = normaliser  # None once its content has ended
        self.text_tool_calls = 0

    def __repr__(self) -> str:
        return (
            f"<StreamTranslator state={self.state.name} block={self._blocks.index}"
            f" kind={('none', 'text', 'thinking', 'tool_use')[self._blocks.kind]}"
            f" termination={self.termination}>"
        )

    @property
    def message_id(self) -> str:
        return self._message_id

    @property
    def model(self) -> str:
        return self._model

    @property
    def stop_sequence(self) -> str | None:
        """The stop sequence that ended the message (its ``message_delta``'s), else None."""
        return self._matched if self.stop_reason == "stop_sequence" else None

    @property
    def output_started(self) -> bool:
        """A content block has been opened: the first token is on its way (TTFT)."""
        return self._blocks.next_index > 0

    @property
    def dropped_tool_deltas(self) -> int:
        """Tool-argument pieces that could not be delivered (warned about and counted)."""
        return self._tools.dropped

    @property
    def tool_arguments_fixed(self) -> tuple[int, int]:
        """(repaired, unrepairable) tool calls' arguments: see :mod:`gateway.local.tool_args`."""
        return self._tools.repaired, self._tools.unrepairable

    @property
    def tool_arguments_over_budget(self) -> int:
        """Of the unrepairable ones, those the reply's repair budget had no room for."""
        return self._tools.over_budget

    @property
    def usage(self) -> tuple[int, int]:
        """(prompt, output) tokens so far, the prompt's cached part included: the upstream's
        usage, else the estimates."""
        return self.input_tokens + (self.cache_read or 0), self.output_tokens

    @property
    def finish_seen(self) -> bool:
        """The upstream sent a ``finish_reason``: the answer is whole."""
        return self._finish is not None

    @property
    def keeps_streamed(self) -> bool:
        """What the engine streamed is kept (``keep_streamed``): the stream may be continued."""
        return self._content is not None

    @property
    def streamed_content(self) -> str:
        """The engine's ``content`` so far, as it sent it (before any normalising); "" when
        it is not kept."""
        return self._content.text() if self._content is not None else ""

    @property
    def streamed_reasoning(self) -> str:
        """The engine's reasoning so far, shown or not; "" when it is not kept."""
        return self._reasoning.text() if self._reasoning is not None else ""

    @property
    def tool_call_started(self) -> bool:
        """A tool call came (as ``tool_calls`` or written as text)."""
        return self._calls_seen or self.text_tool_calls > 0

    def regenerable_call(self) -> tuple[int, str | None, str] | None:
        """(upstream index, upstream id, name) of the tool call whose block is open, when the
        stream may be cut there and its calls generated again whole: no finish came, no
        tool block has closed (the client has seen that block's start and nothing of any
        call's arguments, which are held until a block closes) and no call was written as
        text; else None."""
        if (
            self.state is not _BLOCK_OPEN
            or self._blocks.kind != TOOL
            or self._finish is not None
            or self.text_tool_calls
        ):
            return None
        call = self._tools.regenerable()
        if call is None or call.name is None:
            return None
        return call.index, call.id, call.name

    @property
    def tokens_before_calls(self) -> int:
        """Output tokens generated before the first tool call (all of them when none came)."""
        return self._before_calls[0] if self._calls_seen else self.tokens_so_far

    def restart_tool_calls(self) -> None:
        """The tool calls are generated again (a mid-stream continuation): the open call's
        block stays open and its held arguments are forgotten, as are the calls waiting
        behind it and the chunks they counted; the caller feeds the new calls' deltas with
        the open call's index and id. See :meth:`regenerable_call`."""
        self._tools.restart()
        self._content_chunks = self._before_calls[1]

    def drop_held_call(self) -> bool:
        """Forget the text the normaliser holds as a possible tool call written as text (a
        mid-stream continuation, cut inside it): the client never saw it, so it leaves
        :attr:`streamed_content` (the prefill is what the client was shown) and the output
        tokens so far go back to before the delta it began in (that delta counted whole as
        held: its shown part, if any, is not counted); the model then writes the call again
        whole and the normaliser reads it as usual. True if anything was held."""
        norm = self._norm
        held = norm.held_call if norm is not None else ""
        content = self.streamed_content
        if norm is None or not held or not content.endswith(held) or self._content is None:
            return False  # (it always ends the content: see ContentNormaliser.held_call)
        norm.drop_held_call()
        self._content.replace(content[: len(content) - len(held)])
        tokens, self._content_chunks = self._before_held
        if self._usage_seen:
            self.output_tokens = tokens
        return True

    @property
    def prompt_reported(self) -> bool:
        """The upstream's usage said how long the prompt was."""
        return self._prompt_reported

    @property
    def tokens_so_far(self) -> int:
        """Output tokens generated so far: the upstream's count, else the content chunks."""
        return self.output_tokens if self._usage_seen else self._content_chunks

    @property
    def done(self) -> bool:
        return self.state is State.FINISHED or self.state is State.ERRORED

    # --- public entry points ------------------------------------------------------------

    def feed(self, payload: bytes) -> bytes:
        """One upstream ``data:`` payload -> the Anthropic SSE bytes it produces."""
        out: list[bytes] = []
        self._payload(payload, out)
        return b"".join(out)

    def feed_all(self, payloads: Iterable[bytes]) -> bytes:
        """:meth:`feed` of each payload in turn, up to the end of the message (what
        follows it is dropped): the bytes of all of them, joined once."""
        out: list[bytes] = []
        payload = self._payload
        for data in payloads:
            state = self.state
            if state is _FINISHED or state is _ERRORED:
                break
            payload(data, out)
        return b"".join(out)

    def _payload(self, payload: bytes, out: list[bytes]) -> None:
        if payload[:1] != b"{" and (payload == frames.DONE or payload.strip() == frames.DONE):
            out.append(self._on_done())
            self.ended_by_done = True
            return
        try:
            chunk = jsonutil.loads_upstream(payload)
        except ValueError:
            out.append(self._on_failure(errors.StreamProcessingError(), "malformed_chunk"))
            return
        if type(chunk) is not dict:
            out.append(self._on_failure(errors.StreamProcessingError(), "malformed_chunk"))
            return
        if chunk.get("error") is not None:
            out.append(
                self._on_failure(
                    errors.from_inband(chunk, hosts=self._hosts, secrets=self._secrets),
                    "upstream_error",
                )
            )
            return
        if chunk.get("object") == "error":
            out.append(
                self._on_failure(
                    errors.from_inband({"error": chunk}, hosts=self._hosts, secrets=self._secrets),
                    "upstream_error",
                )
            )
            return
        try:  # the chunk, read here (no call of its own: once per chunk)
            if self.state is not _BLOCK_OPEN:  # the common case checked inline
                self._expect(_LIVE, "chunk")
            usage = chunk.get("usage")  # (vLLM's and SGLang's: on every chunk)
            if usage is not None:
                counts = tables.usage_from_chat(usage, chunk.get("timings"))
                if counts is not None:
                    self._usage_seen = True
                    if counts.prompt_tokens:
                        self.input_tokens = counts.input_tokens
                        self.cache_read = counts.cache_read
                        self._prompt_reported = counts.prompt_reported
                    self.output_tokens = counts.output_tokens
            if self.state is _PRE_START:
                progress = chunk.get("prompt_progress")  # llama.cpp with return_progress
                if type(progress) is dict and type(progress.get("total")) is int:
                    self.input_tokens = progress["total"]
                self._start(out)
            choices = chunk.get("choices")
            if not choices:
                return
            if type(choices) is not list:
                raise Malformed
            for choice in choices:
                if type(choice) is not dict:
                    raise Malformed
                if choice.get("index", 0) == 0:  # the gateway never asks for n > 1
                    self._on_choice(choice, out)
        except Malformed:
            self._fail_into(out, errors.StreamProcessingError(), "malformed_chunk")

    def eof(self) -> bytes:
        """The upstream body ended (after the decoder's flush was fed)."""
        if self.done:
            return b""
        return self._on_eof()

    def fail(self, err: errors.GatewayError, reason: str = "upstream_error") -> bytes:
        """End the stream with ``err`` (its message must already be client-safe)."""
        if self.done:
            return b""
        return self._on_failure(err, reason)

    # --- transitions --------------------------------------------------------------------

    def _expect(self, accepted: tuple[State, ...], what: str) -> None:
        if self.state not in accepted:
            raise IllegalTransition(f"{what} in state {self.state.name}")

    def _on_done(self) -> bytes:
        self._expect(_LIVE, "[DONE]")
        out: list[bytes] = []
        self._end(out)
        return b"".join(out)

    def _on_eof(self) -> bytes:
        self._expect(_LIVE, "eof")
        out: list[bytes] = []
        self._end(out)
        return b"".join(out)

    def _on_failure(self, err: errors.GatewayError, reason: str) -> bytes:
        self._expect(_LIVE, "failure")
        out: list[bytes] = []
        self._fail_into(out, err, reason)
        return b"".join(out)

    def _on_choice(self, choice: dict[str, Any], out: list[bytes]) -> None:
        delta = choice.get("delta")
        if delta:
            if type(delta) is not dict:
                raise Malformed
            # newer vLLM may send the same text in both fields: take one
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            content = delta.get("content")
            calls = delta.get("tool_calls")
            if reasoning or content:
                self._content_chunks += 1
            if reasoning:
                if type(reasoning) is not str:
                    raise Malformed
                if self._reasoning is not None:
                    self._reasoning.add(reasoning)
                if self._norm is not None and self._norm.reasoning_parsed():
                    self._norm = None  # the engine parses reasoning: content is text
                if self._show_thinking:
                    self._on_thinking(reasoning, out)
                else:
                    self.reasoning_hidden = True
            if content:
                if type(content) is not str:
                    raise Malformed
                if self._content is not None:
                    self._content.add(content)
                norm = self._norm
                if norm is None or norm.plain(content):
                    self._on_text(content, out)
                else:
                    if not norm.holds_call:  # this delta may begin a held call: count before it
                        self._before_held = (
                            max(0, self.tokens_so_far - 1),
                            self._content_chunks - 1,
                        )
                    if not self._on_pieces(norm.feed(content), out):
                        return
                if self.state is not _BLOCK_OPEN:  # a stop sequence ended the message
                    return
            if calls:
                if type(calls) is not list:
                    raise Malformed
                if not self._calls_seen:
                    self._calls_seen = True
                    self._before_calls = (self.tokens_so_far, self._content_chunks)
                self._content_chunks += 1
                for call in calls:
                    self._on_tool_delta(call, out)
        finish = choice.get("finish_reason")
        if finish is not None:
            if type(finish) is not str:
                raise Malformed
            self._finish = finish
            self._matched = tables.matched_stop_sequence(choice, self._stop_sequences)

    def _on_text(self, text: str, out: list[bytes]) -> None:
        if self.state is not _BLOCK_OPEN:
            self._expect(_OPEN_ONLY, "text delta")
        blocks = self._blocks
        if blocks.kind != TEXT:
            blocks.close(out, flush=True)
            blocks.open(TEXT, frames.TEXT_SHELL, frames.TEXT_DELTA, out)
        if self._stops is not None:
            text, hit = self._stops.scan(text)
            if text:
                out.append(blocks.head + frames.jstr(text) + frames.DELTA_END)
            if hit is not None:  # a stop sequence: the message ends here
                self._finish, self._matched = "stop", hit
                self._norm = None  # what it holds comes after the stop
                self._end(out)
            return
        try:  # frames.jstr, inline: once per delta
            body = jsonutil.dumpb_str(text)
        except UnicodeEncodeError:
            body = jsonutil.dumpb(frames.clean(text))
        out.append(blocks.head + body + frames.DELTA_END)

    def _on_pieces(self, pieces: list[tuple[int, Any]], out: list[bytes]) -> bool:
        """The normaliser's pieces of content, in order; False once the message ended."""
        for kind, value in pieces:
            if kind == TEXT_PIECE:
                self._on_text(value, out)
                if self.state is not _BLOCK_OPEN:
                    return False
            elif kind == THINKING_PIECE:
                self._on_thinking(value, out)
            else:  # a tool call written as text: a tool_use block like any other
                self.text_tool_calls += 1
                self._on_tool_delta(
                    {
                        "index": -self.text_tool_calls,
                        "function": {"name": value.name, "arguments": value.arguments},
                    },
                    out,
                )
        return True

    def _on_tool_delta(self, delta: Any, out: list[bytes]) -> None:
        self._expect(_OPEN_ONLY, "tool call delta")
        call = self._tools.delta(delta, out)
        if call is not None:  # a named call and none streaming: its block opens now
            self._blocks.close(out, flush=True)
            self._blocks.open_tool(call, out)

    def _on_thinking(self, text: str, out: list[bytes]) -> None:
        if self.state is not _BLOCK_OPEN:
            self._expect(_OPEN_ONLY, "thinking delta")
        blocks = self._blocks
        if blocks.kind != THINKING:
            blocks.close(out, flush=True)
            blocks.open(THINKING, frames.THINKING_SHELL, frames.THINKING_DELTA, out)
        try:
            body = jsonutil.dumpb_str(text)
        except UnicodeEncodeError:
            text = frames.clean(text)
            body = jsonutil.dumpb(text)
        blocks.thinking.append(text)
        if not self._hide_thinking:
            out.append(blocks.head + body + frames.DELTA_END)

    # --- helpers ------------------------------------------------------------------------

    def _start(self, out: list[bytes]) -> None:
        message = {
            "type": "message_start",
            "message": {
                "id": self._message_id,
                "type": "message",
                "role": "assistant",
                "model": self._model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
            },
        }
        out.append(encode_event("message_start", jsonutil.dumpb(message)))
        self.started = True
        self.state = _BLOCK_OPEN

    def _end(self, out: list[bytes]) -> None:
        """[DONE] or EOF: complete if a finish_reason came, else the stream was truncated."""
        if self._finish is None:
            self._fail_into(out, errors.UpstreamError(status=500), "upstream_truncated")
            return
        if self._norm is not None:  # what the normaliser still holds ends the content
            norm, self._norm = self._norm, None
            if not self._on_pieces(norm.flush(), out):
                return
        self._blocks.close(out, flush=True)
        self._blocks.flush_waiting(out)
        self._tools.drop_unnamed()
        has_tools = self._tools.opened
        finish = self._finish
        if finish in ("tool_calls", "function_call") and not has_tools:
            finish = "stop"
        stop = tables.stop_reason(finish, self._matched, has_tools)
        self.stop_reason = stop
        if not self._usage_seen:
            self.output_tokens = self._content_chunks
        body = {
            "type": "message_delta",
            "delta": {
                "stop_reason": stop,
                "stop_sequence": self._matched if stop == "stop_sequence" else None,
            },
            "usage": self._final_usage(),
        }
        out.append(encode_event("message_delta", jsonutil.dumpb(body)))
        out.append(frames.MESSAGE_STOP)
        self.state = State.FINISHED
        self.termination = "completed"

    def _final_usage(self) -> dict[str, int]:
        """``message_delta.usage``: the output tokens, and the input side as the upstream
        reported it (both SDKs copy ``input_tokens`` and ``cache_read_input_tokens`` from it
        into the final message), so it equals the buffered reply's usage."""
        if not self._prompt_reported:
            return {"output_tokens": self.output_tokens}
        return tables.anthropic_usage(
            tables.Usage(self.input_tokens, self.output_tokens, self.cache_read, True)
        )

    def _fail_into(self, out: list[bytes], err: errors.GatewayError, reason: str) -> None:
        if self.state is _PRE_START:
            self._start(out)
        self._blocks.close(out, flush=False)
        out.append(errors.sse_error_event(err))
        out.append(frames.MESSAGE_STOP)
        self.state = State.ERRORED
        self.termination = reason
        self.error = err
        if not self._usage_seen:
            self.output_tokens = self._content_chunks
