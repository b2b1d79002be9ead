"""A reply's series: the children one (api, model)'s replies write, resolved once and kept.

:meth:`gateway.ops.metrics.Metrics.reply_series` hands out one :class:`ReplySeries` per
(api, model); the families it writes to are :class:`~gateway.ops.metrics.Metrics`' own,
named here by :class:`ReplyFamilies` (so this module does not import the declarations).
"""

from __future__ import annotations

from typing import Any, Protocol

from gateway.ops.metric_kinds import Memo

__all__ = ["ReplyFamilies", "ReplySeries"]


class ReplyFamilies(Protocol):
    """The families a reply writes (declared in gateway/ops/metrics.py)."""

    overhead: Memo
    ttft: Memo
    tpot: Memo
    reasoning_hidden: Memo
    stop_reasons: Memo
    terminations: Memo
    tokens: Memo


class ReplySeries:
    """The series one (api, model)'s replies write
    (:meth:`~gateway.messages.from_chat.figures.Figures.write`), in one call: each child is
    resolved at its first write and kept, so that a reply costs attribute loads rather than a
    ``labels()`` call a series. Nothing is created before it is written (the exposition is
    what the ``labels()`` calls would make). The families are never ``remove``d from."""

    __slots__ = (
        "_api",
        "_ends",
        "_hidden",
        "_input",
        "_metrics",
        "_model",
        "_output",
        "_overhead",
        "_stops",
        "_tpot",
        "_ttft",
    )

    def __init__(self, metrics: ReplyFamilies, api: str, model: str) -> None:
        self._metrics = metrics
        self._api = api
        self._model = model
        self._overhead: Any = None
        self._ttft: Any = None
        self._tpot: Any = None
        self._hidden: Any = None
        self._input: Any = None
        self._output: Any = None
        self._stops: dict[str, Any] = {}
        self._ends: dict[str, Any] = {}

    def write(
        self,
        *,
        overhead: float | None,
        ttft: float | None,
        tpot: float | None,
        reasoning_hidden: int,
        stop_reason: str | None,
        termination: str | None,
        usage: tuple[int, int] | None,
    ) -> None:
        """A reply's figures; None (or 0, or "") is nothing to write: ``overhead``,
        ``ttft``, ``tpot`` (seconds), ``reasoning_hidden`` (rounds), ``stop_reason``,
        ``termination`` (a stream's), ``usage`` ((input, output) tokens)."""
        m = self._metrics
        if overhead is not None:
            child = self._overhead
            if child is None:
                child = self._overhead = m.overhead.labels(self._api)
            child.observe(overhead)
        if ttft is not None:
            child = self._ttft
            if child is None:
                child = self._ttft = m.ttft.labels(self._api, self._model)
            child.observe(ttft)
        if tpot is not None:
            child = self._tpot
            if child is None:
                child = self._tpot = m.tpot.labels(self._model)
            child.observe(tpot)
        if reasoning_hidden:
            child = self._hidden
            if child is None:
                child = self._hidden = m.reasoning_hidden.labels(self._model)
            child.inc(reasoning_hidden)
        if stop_reason:
            child = self._stops.get(stop_reason)
            if child is None:
                child = self._stops[stop_reason] = m.stop_reasons.labels(self._model, stop_reason)
            child.inc()
        if termination is not None:
            child = self._ends.get(termination)
            if child is None:
                child = self._ends[termination] = m.terminations.labels(
                    self._api, self._model, termination
                )
            child.inc()
        if usage is not None:
            if self._input is None:
                self._input = m.tokens.labels(self._model, "input")
                self._output = m.tokens.labels(self._model, "output")
            self._input.inc(usage[0])
            self._output.inc(usage[1])
