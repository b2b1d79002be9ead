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

A buffered reply is the same events folded (:func:`gateway.messages.from_chat.aggregate.aggregate`).
A failure inside a round ends the stream with the round translator's envelope, rewritten
the same way; one between rounds (the next upstream call refused) with an ``error`` event.
Citations (:mod:`.citations`): a passage of the model's text that is a result's whole
snippet, verbatim, becomes a text block of its own with a ``web_search_result_location``
citation; nothing else is cited, so none is invented.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
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
from gateway.tools.citations import Piece
from gateway.tools.searches import Searches
from gateway.upstream.client import UpstreamResponse

__all__ = ["WebSearchReply"]

_ROUNDS_PAST_LIMIT = 2  # rounds after the search limit before the reply pauses

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
        return held is not None and held["delta"].get("stop_reason") != "tool_use"

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
        history = list(self._history)
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
        self._json: dict[int, list[str]] = {}
        self._calls: list[int] = []  # client indexes of this round's server_tool_use blocks
        self._client_tools = False
        self._held: dict[str, Any] | None = None
        self._round_in = self._round_out = self._round_cache = 0
        # the text block read for quotes: its translator index, held text, client index
        self._quoting: int | None = None
        self._quote_held = ""
        self._quote_open: int | None = None

    def _rewrite(self, data: bytes) -> bytes:
        """A round's events as the client gets them (see the module docstring)."""
        out: list[bytes] = []
        for frame in data.split(b"\n\n"):
            at = frame.find(b"\ndata: ")
            if at < 0:
                continue
            event = jsonutil.loads(frame[at + 7:])
            kind = event["type"]
            if kind == "message_start":
                self._round_in = event["message"]["usage"].get("input_tokens", 0)
                if self._started:
                    continue
                self._started = True
            elif kind == "content_block_start":
                block = event["content_block"]
                if block["type"] == "text" and self._searches.quotes:
                    self._quoting = event["index"]  # opened with its first plain text
                    continue
                index = self._map[event["index"]] = self._next
                self._next += 1
                if block["type"] == "tool_use" and block["name"] == self._name:
                    block = {"type": "server_tool_use", "id": "srvtoolu_" + ids.b62(24),
                             "name": blocks.NAME, "input": {}}
                    self._calls.append(index)
                elif block["type"] == "tool_use":
                    self._client_tools = True
                self._blocks[index] = dict(block)
                event = {**event, "index": index, "content_block": block}
            elif kind == "content_block_delta" and event["index"] == self._quoting:
                if event["delta"]["type"] == "text_delta":
                    pieces, self._quote_held = self._searches.quotes.split(
                        self._quote_held + event["delta"]["text"])
                    self._text_pieces(pieces, out)
                continue
            elif kind == "content_block_stop" and event["index"] == self._quoting:
                if self._quote_held:
                    self._text_pieces([(self._quote_held, None)], out)
                if self._quote_open is not None:
                    out.append(frames.CB_STOP % self._quote_open)
                self._quoting, self._quote_held, self._quote_open = None, "", None
                continue
            elif kind == "content_block_delta":
                index = self._map[event["index"]]
                self._fold(index, event["delta"])
                event = {**event, "index": index}
            elif kind == "content_block_stop":
                event = {**event, "index": self._map[event["index"]]}
            elif kind == "message_delta":
                usage = event.get("usage") or {}
                self._round_out = usage.get("output_tokens", 0)
                self._round_in = usage.get("input_tokens", self._round_in)
                self._round_cache = usage.get("cache_read_input_tokens", 0)
                self._held = event
                continue
            elif kind == "message_stop":
                if not self._errored:
                    continue
            elif kind == "error":
                self._errored = True
            out.append(encode_event(kind, jsonutil.dumpb(event)))
        return b"".join(out)

    def _text_pieces(self, pieces: list[Piece], out: list[bytes]) -> None:
        """Plain text into the open text block (opened if need be); a quote into a text
        block of its own, its citation first (gateway/tools/citations.py)."""
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

    def _fold(self, index: int, delta: Mapping[str, Any]) -> None:
        """A delta into the block kept for the next round's request."""
        block = self._blocks[index]
        kind = delta["type"]
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta["text"]
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta["thinking"]
        elif kind == "signature_delta":
            block["signature"] = delta["signature"]
        elif kind == "input_json_delta":
            self._json.setdefault(index, []).append(delta["partial_json"])

    def _end_round(self) -> list[dict[str, Any]]:
        """The round's blocks into the history; its search calls (their blocks)."""
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if block["type"] in ("tool_use", "server_tool_use"):
                try:
                    value = jsonutil.loads("".join(self._json.get(index, ())) or "{}")
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
        held = self._held or {"type": "message_delta",
                              "delta": {"stop_reason": "end_turn", "stop_sequence": None}}
        delta = dict(held["delta"])
        if stop_reason is not None:
            delta["stop_reason"] = stop_reason
            delta["stop_sequence"] = None
        self.stop_reason = delta["stop_reason"]
        usage: dict[str, Any] = {"input_tokens": self._input}
        if self._cache_read:
            usage["cache_read_input_tokens"] = self._cache_read
        usage["output_tokens"] = self._output
        usage["server_tool_use"] = {"web_search_requests": self._searches.requests,
                                    "web_fetch_requests": 0}
        body = {"type": "message_delta", "delta": delta, "usage": usage}
        self.termination = "completed"
        return encode_event("message_delta", jsonutil.dumpb(body)) + frames.MESSAGE_STOP
