"""One Messages reply, end to end: sent, run (plain, a cut stream continued, or in a server
tool's rounds), timed, and its figures written once.

The HTTP shell (:mod:`gateway.http.anthropic`) and the batch scheduler make a :class:`Reply`
of a prepared :class:`~gateway.messages.call.Call` and::

    await reply.send(session)
    async with reply:                        # the upstream's response, closed at the end
        message = await reply.buffered()     # or: await reply.stream_to(write), in the
                                             # shell's stream (source: reply.source, its
                                             # end: reply.end)

Every kind fills one :class:`~gateway.messages.from_chat.figures.Figures`, written once: a buffered
reply when its message is made, a stream when it ends (:meth:`Reply.end`, however it ended).
A reply with server tools (web search, web fetch: :mod:`gateway.tools.rounds.loop`, a layer above,
so it comes in as :class:`Rounds`) runs its rounds through the same record.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Protocol

from gateway import errors
from gateway.messages.call import Call
from gateway.messages.continuation import relay
from gateway.messages.from_chat.figures import Figures
from gateway.messages.stream.pump import Timing
from gateway.messages.stream.translator import StreamTranslator
from gateway.text.sse import SSEEventTooLarge
from gateway.upstream.client import UpstreamResponse

__all__ = ["Reply", "Rounds", "Write"]

Write = Callable[[bytes], Awaitable[None]]


class Rounds(Protocol):
    """A reply served in rounds by a server tool, and its stream's source (``termination``,
    ``usage``, ``fail``)."""

    termination: str | None
    error: errors.GatewayError | None
    stop_reason: str | None

    @property
    def usage(self) -> tuple[int, int] | None: ...

    @property
    def cache_read(self) -> int:
        """Of the usage's input tokens, those read from the engine's cache."""

    @property
    def web_searches(self) -> int:
        """Searches made (``usage.server_tool_use.web_search_requests``)."""

    def fail(self, err: errors.GatewayError, reason: str) -> bytes: ...

    def message(self) -> dict[str, Any]:
        """The completed reply as one buffered Message (its stream's events, folded)."""

    async def run(self, up: UpstreamResponse, write: Write, figures: Figures, t0: float) -> None:
        """Every round from the first's open response ``up`` (closed by it), each round's
        figures into ``figures``."""


class Reply:
    """One Messages reply (see the module docstring)."""

    __slots__ = (
        "_rounds",
        "_taken",
        "_timing",
        "_translator",
        "_up",
        "call",
        "figures",
        "make_rounds",
        "request_id",
        "stream",
        "t0",
    )

    def __init__(
        self,
        call: Call,
        *,
        stream: bool | None = None,
        t0: float | None = None,
        request_id: str | None = None,
        rounds: Callable[[Call, str | None], Rounds] | None = None,
    ) -> None:
        """``t0``: the request's arrival (perf_counter), from which the gateway's own time
        and the TTFT are measured; None: not timed (a batch request). ``stream``: whether
        the client reads a stream (default: as the call's request says). ``rounds``: the
        server tool that runs the reply in rounds, made once the call is sent."""
        self.call = call
        self.stream = call.stream if stream is None else stream
        self.t0 = t0
        self.request_id = request_id
        self.make_rounds = rounds
        # the gateway's setup, until now (the request read, validated, prepared)
        overhead = None if t0 is None else time.perf_counter() - t0
        self.figures = Figures(call.route.name, overhead=overhead, streamed=self.stream)
        self._rounds: Rounds | None = None
        self._up: UpstreamResponse | None = None
        self._taken = False  # the rounds own (and close) the first response
        self._translator: StreamTranslator | None = None
        self._timing: Timing | None = None

    async def send(self, session: str | Callable[[], str] | None = None) -> None:
        """Call the upstream (a fallback may answer: the reply is then its). ``session``:
        the request's session key or what makes it where the upstream needs one (see
        :meth:`Call.send`)."""
        call = self.call
        self._up = await call.send(self.request_id, session)
        figures = self.figures
        figures.model = call.route.name
        figures.upstream = call.route.upstream.name
        if self.make_rounds is not None:
            self._rounds = self.make_rounds(call, call.session)

    async def __aenter__(self) -> Reply:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        up = self._up
        if up is None or self._taken:
            return
        if self._rounds is not None:  # the stream never opened: drop the upstream's
            exc = None
        up.leave(exc)

    @property
    def source(self) -> StreamTranslator | Rounds:
        """What the client's stream relays from (its termination, usage, failure envelope)."""
        if self._rounds is not None:
            return self._rounds
        if self._translator is None:
            self._translator = self.call.translator()
            self._timing = Timing(0.0)
        return self._translator

    async def buffered(self) -> dict[str, Any]:
        """The reply's ``message`` (its figures written); a failure raises."""
        assert self._up is not None
        figures = self.figures
        if self._rounds is None:
            message = await self.call.reply(self._up, figures, self.request_id)
        else:
            message = await self._buffered_rounds(self._rounds)
        figures.add_message(message)
        figures.write(self.call.deps.upstreams.metrics)
        return message

    async def _buffered_rounds(self, rounds: Rounds) -> dict[str, Any]:
        assert self._up is not None

        async def drop(data: bytes) -> None:  # the rounds keep the blocks: message()
            pass

        self._taken = True
        figures = self.figures
        try:
            await rounds.run(self._up, drop, figures, self.t0 or 0.0)
        except SSEEventTooLarge:
            self._failed()
            raise errors.StreamProcessingError() from None
        except BaseException:
            self._failed()
            raise
        if rounds.error is not None:
            self._failed()
            raise rounds.error
        t1 = time.perf_counter()
        message = rounds.message()
        figures.add_overhead(time.perf_counter() - t1)
        return message

    def _failed(self) -> None:
        """A buffered reply that failed: what its rounds fixed is counted, nothing else."""
        figures = self.figures
        figures.overhead = None
        figures.write(self.call.deps.metrics)

    async def stream_to(self, write: Write) -> None:
        """Relay the reply to ``write`` (the client's stream, opened with :attr:`source`);
        a failure raises, for the stream's shell to end it with the source's envelope."""
        assert self._up is not None
        rounds = self._rounds
        if rounds is not None:
            self._taken = True
            await rounds.run(self._up, write, self.figures, self.t0 or 0.0)
            return
        translator = self.source
        assert isinstance(translator, StreamTranslator) and self._timing is not None
        call = self.call
        await relay(
            call,
            self._up,
            translator,
            write,
            self._timing,
            call.deps.metrics.inter_chunk.labels(call.route.name),
            request_id=self.request_id,
        )

    def end(self, termination: str) -> None:
        """The stream ended (``termination``: how): its figures, written."""
        figures = self.figures
        figures.termination = termination
        source = self.source
        figures.usage = source.usage
        figures.stop_reason = source.stop_reason
        rounds = self._rounds
        if rounds is not None:
            figures.cache_read = rounds.cache_read
            figures.web_searches = rounds.web_searches
        elif self._translator is not None:
            figures.cache_read = self._translator.cache_read or 0
            figures.message_id = self._translator.message_id
        if self._translator is not None and self._timing is not None:
            figures.add_stream(self._translator, self._timing, self.t0 or 0.0)
        figures.write(self.call.deps.metrics)
