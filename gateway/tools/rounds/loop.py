"""The server tools, run by the gateway: the Messages call in a loop with searches and fetches.

A request offering a web search tool (validated with ``[web_search]`` configured) or a web
fetch tool (``[web_fetch] enabled``), or both, is served in rounds, all of them one reply to
the client (below "search" stands for a call of either tool; :class:`~.ServerTool`):

1. the Messages call (:mod:`gateway.messages.call`) streams the model's answer; the model
   was offered a function ``web_search(query)`` (:mod:`gateway.messages.search_blocks`)
   and/or ``web_fetch(url)`` (:mod:`gateway.messages.fetch_blocks`);
2. its events are rewritten on their way to the client (:mod:`.round_events`):
   only the first round's ``message_start`` passes, block indexes continue across rounds, a
   call of the search function becomes a ``server_tool_use`` block (``srvtoolu_`` id, its
   query streamed as ``input_json_delta``), the round's ``message_delta`` and
   ``message_stop`` are held;
3. when the round ends with searches, each runs (its tool's runner, bounded) and its
   result block (``web_search_tool_result``, ``web_fetch_tool_result``) is sent complete
   at ``content_block_start``;
   the round's blocks and results become an assistant turn of the next round's request,
   which the translation turns into the tool call and the ``tool`` message, and the model is
   called again (a forced ``tool_choice`` is relaxed to ``auto`` after the first round);
4. a round without searches ends the reply: its ``message_delta`` with the usage of all
   rounds summed and ``usage.server_tool_use`` (``web_search_requests``,
   ``web_fetch_requests``), then ``message_stop``.
   A round that also calls client tools ends it too (``stop_reason: tool_use``), after its
   searches' results, as does one cut by ``max_tokens`` (one budget for all rounds: each
   round is asked for what the earlier ones left, and none left ends the reply). Calls
   past a tool's ``max_uses`` (and the gateway's ``web_search.max_searches`` /
   ``web_fetch.max_fetches``) get ``max_uses_exceeded``; two rounds past the tools' limits
   summed, the reply ends with ``stop_reason: pause_turn``, which the API uses for a turn
   the client resumes by sending the reply back.

The rewriting reads each round translator's frames by their prefixes and its state (usage,
stop reason), never decoding an event whole; the blocks it keeps are the next round's
request's assistant turn and the buffered reply (:meth:`ServerToolsReply.message`), equal to
the stream's events folded (:func:`gateway.messages.from_chat.aggregate.aggregate`).
A failure inside a round ends the stream with the round translator's envelope, rewritten
the same way; one between rounds (the next upstream call refused) with an ``error`` event.
Citations (:mod:`gateway.tools.web_search.citations`, one :class:`Quotes` for the reply's
tools): a passage of the model's text that is a search result's whole snippet, or a whole
sentence of a fetched document with citations enabled, verbatim, becomes a text block of
its own with a ``web_search_result_location`` / ``char_location`` citation; nothing else is
cited, so none is invented.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from gateway import errors
from gateway.messages.call import Call, Timing
from gateway.messages.continuation import relay
from gateway.messages.deps import MessagesDeps
from gateway.messages.from_chat.figures import Figures
from gateway.messages.ready import restore
from gateway.messages.stream import frames
from gateway.ops.config import ModelRoute
from gateway.tools.rounds import ServerTool
from gateway.tools.rounds.round_events import RoundEvents
from gateway.tools.web_search.citations import Quotes
from gateway.upstream.client import UpstreamResponse

__all__ = ["ServerToolsReply"]

_ROUNDS_PAST_LIMIT = 2  # rounds after the search limit before the reply pauses

Write = Callable[[bytes], Awaitable[None]]


class ServerToolsReply:
    """One reply with server tools: the rounds' driver and their events' rewriter.

    The :class:`~gateway.messages.reply.Reply`'s rounds, and its stream's source
    (:class:`gateway.http.streaming.Source`): ``termination``, ``usage`` and ``fail``."""

    def __init__(
        self,
        deps: MessagesDeps,
        call: Call,
        tools: Sequence[ServerTool],
        quotes: Quotes,
        *,
        request_id: str | None,
        session: str | None,
    ) -> None:
        self._deps = deps
        self._call = call
        self._route: ModelRoute = call.route
        self._base = call.req  # the first round's request (replays restored, PDFs as text)
        self._tools = {tool.name: tool for tool in tools}
        self._request_id = request_id
        self._session = session
        self.translator = call.translator()  # the first round's
        self._events = RoundEvents(quotes, self._tools, self.translator)
        self.termination: str | None = None
        self.error: errors.GatewayError | None = None
        self.stop_reason: str | None = None
        self.rounds = 0

    # --- Source ---------------------------------------------------------------------------

    @property
    def usage(self) -> tuple[int, int]:
        return self._events.usage

    @property
    def cache_read(self) -> int:
        return self._events.cache_read + self._events.round_cache

    def _requests(self, key: str) -> int:
        return sum(tool.requests for tool in self._tools.values() if tool.usage_key == key)

    @property
    def web_searches(self) -> int:
        return self._requests("web_search_requests")

    @property
    def web_fetches(self) -> int:
        return self._requests("web_fetch_requests")

    def fail(self, err: errors.GatewayError, reason: str) -> bytes:
        self.termination = reason
        self.error = err
        translator = self.translator
        events = self._events
        if not translator.done:
            return events.rewrite(translator.fail(err, reason))
        events.errored = True
        out = b"" if events.started else self._call.translator().fail(err, reason)
        return out or errors.sse_error_event(err) + frames.MESSAGE_STOP

    # --- the rounds -----------------------------------------------------------------------

    async def run(
        self, up: UpstreamResponse, write: Write, figures: Figures, t0: float = 0.0
    ) -> None:
        """Every round, from the first round's open upstream response ``up`` (closed here).

        Each round's translator's figures go into the reply's one record (``figures``, as
        the round ends, however it ended): what it normalised, its decode time, the reply's
        first token (``t0``: the request's arrival) if no round had one before; the
        gateway's own time (translation, rewriting, the next rounds' requests) adds up in
        its overhead; the search's wait is in neither."""
        metrics = self._deps.metrics
        max_rounds = sum(tool.limit for tool in self._tools.values()) + _ROUNDS_PAST_LIMIT
        clock = time.perf_counter
        events = self._events
        while True:
            self.rounds += 1
            translator = self.translator
            timing = Timing(0.0)

            async def sink(data: bytes) -> None:
                began = clock()
                out = events.rewrite(data)
                figures.add_overhead(clock() - began)
                if out:
                    await write(out)

            try:
                async with up:
                    await relay(
                        self._call,
                        up,
                        translator,
                        sink,
                        timing,
                        metrics.inter_chunk.labels(self._route.name),
                        request_id=self._request_id,
                    )
            finally:
                figures.add_stream(translator, timing, t0)
            if translator.termination != "completed":
                self.termination = translator.termination
                self.error = translator.error
                return
            calls = events.end_round()
            if not calls:
                await write(self._finish(None))
                return
            await write(await self._search(calls))
            if events.client_tools or self._cut_short():
                await write(self._finish(None))  # tool_use for the client, or max_tokens
                return
            if events.output >= self._base["max_tokens"]:  # one budget for all rounds
                await write(self._finish("max_tokens"))
                return
            if self.rounds >= max_rounds:
                await write(self._finish("pause_turn"))
                return
            began = clock()
            self._call = await self._next_call()
            self.translator = self._call.translator()
            events.new_round(self.translator)
            figures.add_overhead(clock() - began)
            # the model that answered the first round finishes the reply: no fallback now
            up = await self._call.send(self._request_id, self._session, fall_back=False)

    def _cut_short(self) -> bool:
        """The round stopped for another reason than its calls (``max_tokens`` in the
        middle of one): the reply ends there, as the model's would."""
        held = self._events.held
        return held is not None and held[0] != "tool_use"

    async def _search(self, calls: list[dict[str, Any]]) -> bytes:
        """Each call run by its tool, in the model's order, and its result block (complete
        at its start); every tool sees each result (a fetched or found URL may be fetched
        next)."""
        out = []
        for block in calls:
            tool = self._tools[block["name"]]
            content, text = await tool.run(block["input"])
            out.append(self._events.result(block, tool.result_type, content, text))
            result = {"type": tool.result_type, "tool_use_id": block["id"], "content": content}
            for each in self._tools.values():
                each.seen(result)
        return b"".join(out)

    def _finish(self, stop_reason: str | None) -> bytes:
        """The reply's end: its ``message_delta`` (``stop_reason``: in place of the last
        round's) and ``message_stop``."""
        events = self._events
        counts: dict[str, int] = {}
        for tool in self._tools.values():
            counts[tool.usage_key] = counts.get(tool.usage_key, 0) + tool.requests
        out = events.finish(stop_reason, counts)
        self.stop_reason = events.stop_reason
        self.termination = "completed"
        return out

    def message(self) -> dict[str, Any]:
        """The completed reply as one buffered Message (:meth:`RoundEvents.message`)."""
        return self._events.message()

    async def _next_call(self) -> Call:
        """The next round's call: the request with this reply's blocks so far as the
        assistant's turn (after a prefill, appended to it)."""
        req = self._base
        messages = list(req["messages"])
        # copies: restoring the reasoning of earlier rounds writes into the request's blocks,
        # and the history is also the buffered reply's content (message())
        history = [dict(block) for block in self._events.history]
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            content = last["content"]
            earlier = (
                [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
            )
            messages[-1] = {**last, "content": earlier + history}
        else:
            messages.append({"role": "assistant", "content": history})
        # the client's max_tokens bounds the whole reply: this round gets what is left
        nxt = {**req, "messages": messages, "max_tokens": req["max_tokens"] - self._events.output}
        nxt.pop("continue_final_message", None)
        choice = req.get("tool_choice")
        if choice is not None and (
            choice["type"] == "any"
            or (choice["type"] == "tool" and choice.get("name") in self._tools)
        ):
            nxt["tool_choice"] = {k: v for k, v in choice.items() if k != "name"} | {"type": "auto"}
        with self._deps.decoding.lease() as lease:  # the reasoning of earlier rounds
            await restore(self._deps, nxt, lease)
        return Call(self._deps, nxt, self._route)
