"""The web_search server tool, run by the gateway: the Messages call in a loop with searches.

A request offering a web search tool (validated with ``[web_search]`` configured) is served
in rounds, all of them one reply to the client:

1. the Messages call (:mod:`gateway.messages.call`) streams the model's answer; the model
   was offered a function ``web_search(query)`` (:mod:`gateway.messages.search_blocks`);
2. its events are rewritten on their way to the client (:meth:`WebSearchReply._rewrite`):
   only the first round's ``message_start`` passes, block indexes continue across rounds, a
   call of the search function becomes a ``server_tool_use`` block (``srvtoolu_`` id, its
   query streamed as ``input_json_delta``), the round's ``message_delta`` and
   ``message_stop`` are held;
3. when the round ends with searches, each runs (:mod:`.searches`, bounded) and its
   ``web_search_tool_result`` block is sent complete at ``content_block_start``: results
   (``encrypted_content`` sealing what the model saw) or ``web_search_tool_result_error``;
   the round's blocks and results become an assistant turn of the next round's request,
   which the translation turns into the tool call and the ``tool`` message, and the model is
   called again (a forced ``tool_choice`` is relaxed to ``auto`` after the first round);
4. a round without searches ends the reply: its ``message_delta`` with the usage of all
   rounds summed and ``usage.server_tool_use.web_search_requests``, then ``message_stop``.
   A round that also calls client tools ends it too (``stop_reason: tool_use``), after its
   searches' results, as does one cut by ``max_tokens`` (one budget for all rounds: each
   round is asked for what the earlier ones left, and none left ends the reply). Searches
   past the tool's ``max_uses`` (and the gateway's ``web_search.max_searches``) get
   ``max_uses_exceeded``; two rounds past that, the reply ends with ``stop_reason:
   pause_turn``, which the API uses for a turn the client resumes by sending the reply back.

The rewriter reads the round translator's output by its frames' prefixes
(:mod:`gateway.messages.stream.frames`, pre-encoded: the index respliced, the rest passed as
it is) and the translator's state (usage, stop reason), never decoding an event whole: a
block's text, signature and input are kept as the encoded delta bodies and decoded once, as
the round ends, for the next round's request. Those blocks are also the buffered reply
(:meth:`WebSearchReply.message`), equal to the stream's events folded as the SDKs fold them
(:func:`gateway.messages.from_chat.aggregate.aggregate`), without folding them again.
A failure inside a round ends the stream with the round translator's envelope, rewritten
the same way; one between rounds (the next upstream call refused) with an ``error`` event.
Citations (:mod:`.citations`): a passage of the model's text that is a result's whole
snippet, verbatim, becomes a text block of its own with a ``web_search_result_location``
citation; nothing else is cited, so none is invented.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway import errors
from gateway.messages import search_blocks as blocks
from gateway.messages.call import Call, MessagesDeps, Timing, restore
from gateway.messages.continuation import relay
from gateway.messages.from_chat.figures import Figures
from gateway.messages.stream import frames
from gateway.messages.stream.translator import StreamTranslator
from gateway.ops.config import ModelRoute
from gateway.text import ids, jsonutil
from gateway.text.sse import encode_event
from gateway.tools.web_search.citations import Piece
from gateway.tools.web_search.searches import Searches
from gateway.upstream.client import UpstreamResponse

__all__ = ["WebSearchReply"]

_ROUNDS_PAST_LIMIT = 2  # rounds after the search limit before the reply pauses

# the translator's frames (gateway/messages/stream/frames.py), recognised by their prefix
_CBS_LEN = len(frames.CBS)
_CBD_LEN = len(frames.CBD)
_CB_STOP = frames.CB_STOP.split(b"%d")[0]
_CB_STOP_LEN = len(_CB_STOP)
_TEXT_SHELL = frames.TEXT_SHELL.removesuffix(b"\n\n")
_THINKING_SHELL = frames.THINKING_SHELL.removesuffix(b"\n\n")
_TEXT_DELTA, _TEXT_DELTA_LEN = frames.TEXT_DELTA, len(frames.TEXT_DELTA)
_THINKING_DELTA, _THINKING_DELTA_LEN = frames.THINKING_DELTA, len(frames.THINKING_DELTA)
_SIGNATURE_DELTA, _SIGNATURE_DELTA_LEN = frames.SIGNATURE_DELTA, len(frames.SIGNATURE_DELTA)
_JSON_DELTA, _JSON_DELTA_LEN = frames.JSON_DELTA, len(frames.JSON_DELTA)
_MESSAGE_START = b"event: message_start\n"
_MESSAGE_DELTA = b"event: message_delta\n"
_MESSAGE_STOP = b"event: message_stop\n"
_ERROR = b"event: error\n"

Write = Callable[[bytes], Awaitable[None]]


class WebSearchReply:
    """One reply with web search: the rounds' driver and their events' rewriter.

    The :class:`~gateway.messages.reply.Reply`'s rounds, and its stream's source
    (:class:`gateway.http.streaming.Source`): ``termination``, ``usage`` and ``fail``."""

    def __init__(self, deps: MessagesDeps, call: Call, searches: Searches, name: str, *,
                 request_id: str | None, session: str | None) -> None:
        self._deps = deps
        self._call = call
        self._route: ModelRoute = call.route
        self._base = call.req  # the first round's request (replays restored, PDFs as text)
        self._searches = searches
        self._name = name
        # a call of the search function: the end of its tool_use shell (tool_blocks.shell)
        self._search_tail = b',"name":' + frames.jstr(name) + b',"input":{}}}'
        self._message_id = self._model = ""
        self._stop_sequence: str | None = None
        self._usage: dict[str, Any] = {}
        self._request_id = request_id
        self._session = session
        self.translator: StreamTranslator | None = None
        self.termination: str | None = None
        self.error: errors.GatewayError | None = None
        self.stop_reason: str | None = None
        self.rounds = 0
        self._started = False
        self._errored = False
        self._next = 0  # the client's next block index
        self._history: list[dict[str, Any]] = []
        self._input = self._output = self._cache_read = 0
        self._new_round()

    # --- Source ---------------------------------------------------------------------------

    @property
    def usage(self) -> tuple[int, int]:
        return (self._input + self._round_in + self._cache_read + self._round_cache,
                self._output + self._round_out)

    def fail(self, err: errors.GatewayError, reason: str) -> bytes:
        self.termination = reason
        self.error = err
        translator = self.translator
        if translator is not None and not translator.done:
            return self._rewrite(translator.fail(err, reason))
        self._errored = True
        out = b"" if self._started else self._call.translator().fail(err, reason)
        return out or errors.sse_error_event(err) + frames.MESSAGE_STOP

    # --- the rounds -----------------------------------------------------------------------

    async def run(self, up: UpstreamResponse, write: Write, figures: Figures,
                  t0: float = 0.0) -> None:
        """Every round, from the first round's open upstream response ``up`` (closed here).

        Each round's translator's figures go into the reply's one record (``figures``, as
        the round ends, however it ended): what it normalised, its decode time, the reply's
        first token (``t0``: the request's arrival) if no round had one before; the
        gateway's own time (translation, rewriting, the next rounds' requests) adds up in
        its overhead; the search's wait is in neither."""
        metrics = self._deps.metrics
        max_rounds = self._searches.limit + _ROUNDS_PAST_LIMIT
        clock = time.perf_counter
        while True:
            self.rounds += 1
            translator = self.translator = self._call.translator()
            if self.rounds == 1:
                self._message_id, self._model = translator.message_id, translator.model
            timing = Timing(0.0)

            async def sink(data: bytes) -> None:
                began = clock()
                out = self._rewrite(data)
                figures.add_overhead(clock() - began)
                if out:
                    await write(out)

            try:
                async with up:
                    await relay(self._call, up, translator, sink, timing,
                                metrics.inter_chunk.labels(self._route.name),
                                request_id=self._request_id)
            finally:
                figures.add_stream(translator, timing, t0)
            if translator.termination != "completed":
                self.termination = translator.termination
                self.error = translator.error
                return
            calls = self._end_round()
            if not calls:
                await write(self._finish(None))
                return
            await write(await self._search(calls))
            if self._client_tools or self._cut_short():
                await write(self._finish(None))  # tool_use for the client, or max_tokens
                return
            if self._output >= self._base["max_tokens"]:  # one budget for all rounds
                await write(self._finish("max_tokens"))
                return
            if self.rounds >= max_rounds:
                await write(self._finish("pause_turn"))
                return
            began = clock()
            self._call = await self._next_call()
            self._new_round()
            figures.add_overhead(clock() - began)
            # the model that answered the first round finishes the reply: no fallback now
            up = await self._call.send(self._request_id, self._session, fall_back=False)

    def _cut_short(self) -> bool:
        """The round stopped for another reason than its calls (``max_tokens`` in the
        middle of one): the reply ends there, as the model's would."""
        held = self._held
        return held is not None and held[0] != "tool_use"

    async def _search(self, calls: list[dict[str, Any]]) -> bytes:
        """Each call's search run and its result block (complete at its start)."""
        out = []
        for block in calls:
            content, text = await self._searches.run(block["input"])
            result = {"type": "web_search_tool_result", "tool_use_id": block["id"],
                      "content": content}
            index = self._next
            self._next += 1
            out.append(encode_event("content_block_start", jsonutil.dumpb(
                {"type": "content_block_start", "index": index, "content_block": result})))
            out.append(frames.CB_STOP % index)
            self._history.append({**result, blocks.OPENED: text})
        return b"".join(out)

    async def _next_call(self) -> Call:
        """The next round's call: the request with this reply's blocks so far as the
        assistant's turn (after a prefill, appended to it)."""
        req = self._base
        messages = list(req["messages"])
        # copies: restoring the reasoning of earlier rounds writes into the request's blocks,
        # and the history is also the buffered reply's content (message())
        history = [dict(block) for block in self._history]
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            content = last["content"]
            earlier = [{"type": "text", "text": content}] if isinstance(content, str) else list(
                content)
            messages[-1] = {**last, "content": earlier + history}
        else:
            messages.append({"role": "assistant", "content": history})
        # the client's max_tokens bounds the whole reply: this round gets what is left
        nxt = {**req, "messages": messages, "max_tokens": req["max_tokens"] - self._output}
        nxt.pop("continue_final_message", None)
        choice = req.get("tool_choice")
        if choice is not None and (choice["type"] == "any" or (
                choice["type"] == "tool" and choice.get("name") == self._name)):
            nxt["tool_choice"] = {k: v for k, v in choice.items() if k != "name"} | {
                "type": "auto"}
        with self._deps.decoding.lease() as lease:  # the reasoning of earlier rounds
            await restore(self._deps, nxt, lease)
        return Call(self._deps, nxt, self._route)

    # --- the rewriter ---------------------------------------------------------------------

    def _new_round(self) -> None:
        self._map: dict[int, int] = {}
        self._blocks: dict[int, dict[str, Any]] = {}
        # the blocks' delta bodies as the translator encoded them (JSON strings), decoded
        # once per block as the round ends: the text (or thinking), the signature, the input
        self._parts: dict[int, list[bytes]] = {}
        self._signature: dict[int, bytes] = {}
        self._json: dict[int, list[bytes]] = {}
        self._calls: list[int] = []  # client indexes of this round's server_tool_use blocks
        self._client_tools = False
        self._held: tuple[str | None, str | None] | None = None  # stop reason, sequence
        self._round_in = self._round_out = self._round_cache = 0
        # the text block read for quotes: its translator index, held text, client index
        self._quoting: int | None = None
        self._quote_held = ""
        self._quote_open: int | None = None

    def _rewrite(self, data: bytes) -> bytes:
        """A round's events as the client gets them (see the module docstring).

        ``data`` is the round translator's output, in the frames of
        :mod:`gateway.messages.stream.frames`: each is recognised by its prefix and its
        index respliced, never decoded whole; what the round's end needs (usage, stop
        reason) is read from the translator itself."""
        out: list[bytes] = []
        for frame in data.split(b"\n\n"):
            if frame.startswith(frames.CBD):
                self._delta(frame, out)
            elif frame.startswith(frames.CBS):
                self._block_start(frame, out)
            elif frame.startswith(_CB_STOP):
                self._block_stop(frame, out)
            elif frame.startswith(_MESSAGE_START):
                translator = self.translator
                assert translator is not None
                self._round_in = translator.input_tokens
                if not self._started:
                    self._started = True
                    out.append(frame + b"\n\n")
            elif frame.startswith(_MESSAGE_DELTA):
                translator = self.translator
                assert translator is not None
                self._round_out = translator.output_tokens
                self._round_in = translator.input_tokens
                self._round_cache = (translator.cache_read or 0) if (
                    translator.prompt_reported) else 0
                self._held = (translator.stop_reason, translator.stop_sequence)
            elif frame.startswith(_MESSAGE_STOP):
                if self._errored:
                    out.append(frames.MESSAGE_STOP)
            elif frame:
                if frame.startswith(_ERROR):
                    self._errored = True
                out.append(frame + b"\n\n")
        return b"".join(out)

    def _block_start(self, frame: bytes, out: list[bytes]) -> None:
        comma = frame.index(b",", _CBS_LEN)
        upstream = int(frame[_CBS_LEN:comma])
        shell = frame[comma:]
        block: dict[str, Any]
        if shell == _TEXT_SHELL:
            if self._searches.quotes:
                self._quoting = upstream  # opened with its first plain text
                return
            block = {"type": "text", "text": ""}
        elif shell == _THINKING_SHELL:
            block = {"type": "thinking", "thinking": ""}
        elif shell.endswith(self._search_tail):  # a call of the search function
            block = {"type": "server_tool_use", "id": "srvtoolu_" + ids.b62(24),
                     "name": blocks.NAME, "input": {}}
            shell = b',"content_block":' + jsonutil.dumpb(block) + b"}"
        else:  # a client tool's call: its shell, decoded once for the next round's request
            block = jsonutil.loads(b"{" + shell[1:])["content_block"]
            self._client_tools = True
        index = self._map[upstream] = self._next
        self._next += 1
        if block["type"] == "server_tool_use":
            self._calls.append(index)
        self._blocks[index] = block
        out.append(frames.CBS + b"%d" % index + shell + b"\n\n")

    def _delta(self, frame: bytes, out: list[bytes]) -> None:
        comma = frame.index(b",", _CBD_LEN)
        upstream = int(frame[_CBD_LEN:comma])
        rest = frame[comma:]
        if upstream == self._quoting:
            if rest.startswith(_TEXT_DELTA):
                text = jsonutil.loads(rest[_TEXT_DELTA_LEN:-2])
                pieces, self._quote_held = self._searches.quotes.split(self._quote_held + text)
                self._text_pieces(pieces, out)
            return
        index = self._map[upstream]
        if rest.startswith(_TEXT_DELTA):
            self._parts.setdefault(index, []).append(rest[_TEXT_DELTA_LEN:-2])
        elif rest.startswith(_THINKING_DELTA):
            self._parts.setdefault(index, []).append(rest[_THINKING_DELTA_LEN:-2])
        elif rest.startswith(_SIGNATURE_DELTA):
            self._signature[index] = rest[_SIGNATURE_DELTA_LEN:-2]
        elif rest.startswith(_JSON_DELTA):
            self._json.setdefault(index, []).append(rest[_JSON_DELTA_LEN:-2])
        out.append(frames.CBD + b"%d" % index + rest + b"\n\n")

    def _block_stop(self, frame: bytes, out: list[bytes]) -> None:
        upstream = int(frame[_CB_STOP_LEN:-1])
        if upstream == self._quoting:
            if self._quote_held:
                self._text_pieces([(self._quote_held, None)], out)
            if self._quote_open is not None:
                out.append(frames.CB_STOP % self._quote_open)
            self._quoting, self._quote_held, self._quote_open = None, "", None
            return
        out.append(frames.CB_STOP % self._map[upstream])

    def _text_pieces(self, pieces: list[Piece], out: list[bytes]) -> None:
        """Plain text into the open text block (opened if need be); a quote into a text
        block of its own, its citation first (gateway/tools/web_search/citations.py)."""
        for text, citation in pieces:
            if citation is not None and self._quote_open is not None:
                out.append(frames.CB_STOP % self._quote_open)
                self._quote_open = None
            if self._quote_open is None:
                index = self._quote_open = self._next
                self._next += 1
                out.append(frames.CBS + b"%d" % index + frames.TEXT_SHELL)
                self._blocks[index] = {"type": "text", "text": ""}
            index = self._quote_open
            if citation is not None:
                self._blocks[index]["citations"] = [citation]
                out.append(encode_event("content_block_delta", jsonutil.dumpb({
                    "type": "content_block_delta", "index": index,
                    "delta": {"type": "citations_delta", "citation": citation}})))
            self._blocks[index]["text"] += text
            out.append(frames.CBD + b"%d" % index + frames.TEXT_DELTA + frames.jstr(text)
                       + frames.DELTA_END)
            if citation is not None:
                out.append(frames.CB_STOP % index)
                self._quote_open = None

    def _end_round(self) -> list[dict[str, Any]]:
        """The round's blocks into the history; its search calls (their blocks)."""
        for index in sorted(self._blocks):
            block = self._blocks[index]
            kind = block["type"]
            parts = self._parts.get(index)
            if parts:
                block["text" if kind == "text" else "thinking"] = _joined(parts)
            signature = self._signature.get(index)
            if signature is not None:
                block["signature"] = jsonutil.loads(signature)
            if kind in ("tool_use", "server_tool_use"):
                try:
                    value = jsonutil.loads(_joined(self._json.get(index, [])) or "{}")
                except ValueError:
                    value = {}
                block["input"] = value if isinstance(value, dict) else {}
            self._history.append(block)
        self._input += self._round_in
        self._output += self._round_out
        self._cache_read += self._round_cache
        self._round_in = self._round_out = self._round_cache = 0
        return [self._blocks[i] for i in self._calls]

    def _finish(self, stop_reason: str | None) -> bytes:
        """The reply's ``message_delta`` (usage of every round) and ``message_stop``."""
        held_reason, held_sequence = self._held or ("end_turn", None)
        if stop_reason is None:
            stop_reason, sequence = held_reason, held_sequence
        else:
            sequence = None
        self.stop_reason = stop_reason
        self._stop_sequence = sequence
        usage: dict[str, Any] = {"input_tokens": self._input}
        if self._cache_read:
            usage["cache_read_input_tokens"] = self._cache_read
        usage["output_tokens"] = self._output
        usage["server_tool_use"] = {"web_search_requests": self._searches.requests,
                                    "web_fetch_requests": 0}
        self._usage = usage
        body = {"type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": sequence},
                "usage": usage}
        self.termination = "completed"
        return encode_event("message_delta", jsonutil.dumpb(body)) + frames.MESSAGE_STOP

    def message(self) -> dict[str, Any]:
        """The reply as one buffered Message (after :meth:`run` completed it): the blocks
        its stream carried, as the SDKs would fold its events, made from what the rounds
        kept for their requests instead of folding the events again."""
        content = [{k: v for k, v in block.items() if k != blocks.OPENED}
                   for block in self._history]
        return {"id": self._message_id, "type": "message", "role": "assistant",
                "model": self._model, "content": content or [{"type": "text", "text": ""}],
                "stop_reason": self.stop_reason, "stop_sequence": self._stop_sequence,
                "usage": self._usage}


def _joined(parts: list[bytes]) -> str:
    """JSON strings' bodies, decoded once as one string (the text they hold, joined)."""
    if len(parts) == 1:
        return jsonutil.loads(parts[0])  # type: ignore[no-any-return]
    return jsonutil.loads(b'"' + b"".join([part[1:-1] for part in parts]) + b'"')  # type: ignore[no-any-return]
