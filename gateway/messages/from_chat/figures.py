"""One reply's figures, filled as the reply runs and written to the metrics once, at its end.

Every kind of Messages reply fills one :class:`Figures`: buffered or streamed, a cut stream
continued, a web search's rounds (each round's fixes and decode times added to the one
record), a batch request. :meth:`Figures.write` is the only place a reply's own series are
recorded: its tokens and stop reason, its TTFT and TPOT (a stream to the client only: a
buffered reply has no first token on the wire), the gateway's own time (``overhead``, when
the caller timed it: a batch request has none), what the gateway fixed in the engine's
answer (``local_fixes``, dropped tool-argument pieces, reasoning hidden) and, for a stream,
how it ended (``stream_terminations``). Nothing here runs per chunk: a stream's clock is
its :class:`~gateway.messages.stream.pump.Timing`, read once per round (:meth:`Figures.add_stream`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from gateway.ops.metrics import Metrics

if TYPE_CHECKING:
    from gateway.messages.stream.pump import Timing
    from gateway.messages.stream.translator import StreamTranslator

__all__ = ["Figures"]

_log = structlog.get_logger("gateway.messages")


class Figures:
    """What one reply did, for :meth:`write` (see the module docstring)."""

    __slots__ = (
        "api",
        "cache_read",
        "decode",
        "decoded",
        "dropped_tool_deltas",
        "inline_thinking",
        "message_id",
        "model",
        "on_end",
        "orphan_close",
        "over_budget",
        "overhead",
        "reasoning_hidden",
        "repaired",
        "stop_reason",
        "streamed",
        "termination",
        "text_calls",
        "ttft",
        "unrepairable",
        "upstream",
        "usage",
        "web_searches",
        "written",
    )

    def __init__(
        self,
        model: str,
        *,
        overhead: float | None = None,
        streamed: bool = False,
        api: str = "messages",
    ) -> None:
        self.api = api
        self.model = model  # the route that answered (a fallback's, if one did)
        self.upstream = ""  # its upstream's name (logged with an orphan </think>)
        self.streamed = streamed  # a stream to the client: TTFT, TPOT, a termination
        self.usage: tuple[int, int] | None = None  # (input incl. cache reads, output)
        self.cache_read = 0  # of usage's input, the tokens read from the engine's cache
        self.web_searches = 0  # usage.server_tool_use.web_search_requests
        self.stop_reason: str | None = None
        self.message_id: str | None = None  # the reply's id, as the client got it
        self.ttft: float | None = None
        self.decode = 0.0  # seconds from each round's first token to its last chunk
        self.decoded = 0  # output tokens after each round's first
        # the gateway's own time (its setup's, then its work's); None: not timed (a batch)
        self.overhead = overhead
        self.termination: str | None = None  # how the stream ended (streams only)
        self.repaired = self.unrepairable = self.over_budget = self.text_calls = 0
        self.inline_thinking = 0  # engine answers (rounds) whose inline reasoning was read
        self.orphan_close = False  # a </think> without <think> was seen
        self.dropped_tool_deltas = 0
        # called once, after the metrics are written: the client's limits settled and its
        # usage recorded (gateway/http/tenancy.py); None: nobody to tell
        self.on_end: Callable[[Figures], None] | None = None
        self.reasoning_hidden = 0
        self.written = False

    def add_overhead(self, seconds: float) -> None:
        if self.overhead is not None:
            self.overhead += seconds

    def add_message(self, message: dict[str, Any]) -> None:
        """A whole reply's stop reason and usage (a buffered one, or a stream's folded)."""
        self.stop_reason = message.get("stop_reason") or None
        self.message_id = message.get("id")
        usage = message["usage"]
        self.cache_read = cached = usage.get("cache_read_input_tokens", 0)
        self.usage = (usage["input_tokens"] + cached, usage["output_tokens"])
        tools = usage.get("server_tool_use")
        if tools is not None:
            self.web_searches = tools.get("web_search_requests", 0)

    def add_fixes(
        self,
        *,
        repaired: int = 0,
        unrepairable: int = 0,
        over_budget: int = 0,
        text_calls: int = 0,
        normaliser: Any = None,
    ) -> None:
        """What the normalisers fixed in one engine answer (gateway/local/)."""
        self.repaired += repaired
        self.unrepairable += unrepairable
        self.over_budget += over_budget
        self.text_calls += text_calls
        if normaliser is not None:
            self.inline_thinking += int(normaliser.thinking_found)
            self.orphan_close = self.orphan_close or normaliser.orphan_close

    def add_translator(self, translator: StreamTranslator) -> None:
        """What was fixed in one translated upstream stream."""
        repaired, unrepairable = translator.tool_arguments_fixed
        self.add_fixes(
            repaired=repaired,
            unrepairable=unrepairable,
            over_budget=translator.tool_arguments_over_budget,
            text_calls=translator.text_tool_calls,
            normaliser=translator.normaliser,
        )
        self.dropped_tool_deltas += translator.dropped_tool_deltas
        self.reasoning_hidden += int(translator.reasoning_hidden)

    def add_stream(self, translator: StreamTranslator, timing: Timing, t0: float) -> None:
        """One translated upstream stream (a reply, or a web search's round), however it
        ended: its fixes, the gateway's time, its decode time; the reply's first token
        (``t0``: the request's arrival) if none was seen before."""
        self.add_translator(translator)
        self.add_overhead(timing.translate)
        if timing.first_token:
            if self.ttft is None:
                self.ttft = timing.first_token - t0
            tokens = translator.output_tokens
            if tokens > 1:
                self.decode += timing.last_chunk - timing.first_token
                self.decoded += tokens - 1

    @property
    def tpot(self) -> float | None:
        """The mean decode time per output token after each round's first; None when no
        round decoded two."""
        return self.decode / self.decoded if self.decoded else None

    def write(self, metrics: Metrics) -> None:
        """Record the reply's figures (once: a second call does nothing) and log its fixes."""
        if self.written:
            return
        self.written = True
        model = self.model
        streamed = self.streamed
        metrics.reply_series(self.api, model).write(
            overhead=self.overhead,
            ttft=self.ttft if streamed else None,
            tpot=self.decode / self.decoded if streamed and self.decoded else None,
            reasoning_hidden=self.reasoning_hidden,
            stop_reason=self.stop_reason,
            termination=self.termination,
            usage=self.usage,
        )
        if self.dropped_tool_deltas:
            _log.warning("tool_arguments_dropped", model=model, count=self.dropped_tool_deltas)
            metrics.tool_arg_errors.labels(model).inc(self.dropped_tool_deltas)
        if (
            self.repaired
            or self.unrepairable
            or self.text_calls
            or self.inline_thinking
            or self.orphan_close
        ):
            self._write_fixes(metrics)
        if self.on_end is not None:
            self.on_end(self)

    def _write_fixes(self, metrics: Metrics) -> None:
        """Count and log what was normalised (per model, so an operator sees a model that
        writes broken calls); of the unrepairable calls, ``over_budget`` the reply's repair
        budget had no room for (gateway/local/tool_args.py)."""
        model = self.model
        fixes = metrics.local_fixes
        for fix, count in (
            ("tool_arguments_repaired", self.repaired),
            ("tool_arguments_unrepairable", self.unrepairable),
            ("text_tool_call", self.text_calls),
            ("inline_thinking", self.inline_thinking),
        ):
            if count:
                fixes.labels(model, fix).inc(count)
        if self.repaired or self.unrepairable:
            _log.warning(
                "tool_arguments_repaired",
                model=model,
                repaired=self.repaired,
                unrepairable=self.unrepairable,
                over_budget=self.over_budget,
            )
        if self.orphan_close:
            _log.warning(
                "inline_thinking_opened_by_template",
                model=model,
                upstream=self.upstream,
                detail="content had </think> without <think>: set "
                'inline_thinking = "opened" on this upstream',
            )
