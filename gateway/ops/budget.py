"""Process-wide memory budgets: bytes that requests in flight hold at once.

Two budgets, one inside the other (:func:`budgets` builds them from the config):

* ``memory`` (``server.memory_budget_mb``): everything below, plus what lives as long as
  a request does:

  - the reasoning a Messages request restores from thinking-block signatures
    (:mod:`gateway.messages.call`), counted twice (the text in the request and its copy in
    the upstream payload) from before it is inflated until the reply has ended: a 170 KB
    body can hold 4 MiB of a looping model's reasoning, and 150 of them in flight against a
    slow engine took the process to 1.3 GiB;
  - a Message Batches create (:mod:`gateway.http.batches`): its body and the encoded
    requests made from it, until they are in the store.

* ``decoding`` (``server.max_decoding_bytes``): request bodies while they are received and
  decoded (:mod:`gateway.http.body`). A body counts in both.

Each request holds a :class:`Lease`, a context manager: what it takes counts until it is
released, whatever ends the request (an error, a cancelled handler when the client hung
up). A take is made before the memory is: a caller reserves its bound, and gives back
what it did not use. A lease that holds nothing may take any size while nothing else is
held in a budget (a lone body or batch of any size gets through, as before: the size limits
are their own knobs); otherwise a take that would pass a budget's limit is refused, counted
in ``llm_gateway_memory_budget_sheds_total{budget}``, and the caller answers 529
``overloaded_error`` with ``retry-after``, which every SDK retries.
``llm_gateway_memory_budget_bytes{budget}`` is what is held now: read at scrape time from
the budget itself (nothing is published per take), or under ``--workers`` (the multiprocess
files) set on every change.

Takes may come from a worker thread (signatures opened off the event loop), so the count
is under a lock (one for both budgets); a lease released while its thread still runs takes
nothing more.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.ops.metrics import Metrics

__all__ = ["Budget", "Lease", "budgets"]

MIB = 1024 * 1024


class _Gauge(Protocol):
    def set(self, value: float) -> None: ...

    def read_from(self, read: Callable[[], float]) -> bool: ...


class _Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class Budget:
    """Bytes held at once across the process, at most ``limit`` (but see :class:`Lease`);
    a take counts in ``parent`` too, and must fit there as well."""

    __slots__ = ("_chain", "_lock", "_published", "held", "held_gauge", "limit", "parent", "sheds")

    def __init__(
        self,
        limit: int,
        parent: Budget | None = None,
        *,
        held_gauge: _Gauge | None = None,
        sheds: _Counter | None = None,
    ) -> None:
        self.limit = limit
        self.held = 0
        self.parent = parent
        self.sheds = sheds
        self._lock: threading.Lock = parent._lock if parent is not None else threading.Lock()
        self._chain: tuple[Budget, ...] = (self, *(parent._chain if parent else ()))
        if held_gauge is not None and held_gauge.read_from(self._held):
            held_gauge = None  # read at scrape time: nothing to set
        self.held_gauge = held_gauge
        # the gauges set on every change (--workers' only): the chain's that are not read
        self._published = tuple(b for b in self._chain if b.held_gauge is not None)

    def _held(self) -> float:
        return self.held

    def lease(self) -> Lease:
        return Lease(self)

    def _take(self, lease: Lease, size: int) -> bool:
        lock = self._lock  # acquire/release: a "with" costs twice that, twice a request
        lock.acquire()
        try:
            if lease.closed:
                return False
            for budget in self._chain:
                if budget.held > lease.held and budget.held + size > budget.limit:
                    if budget.sheds is not None:
                        budget.sheds.inc()
                    return False
            for budget in self._chain:
                budget.held += size
            lease.held += size
            if self._published:
                self._publish()
            return True
        finally:
            lock.release()

    def _give(self, lease: Lease, size: int) -> None:
        with self._lock:
            size = min(size, lease.held)
            for budget in self._chain:
                budget.held -= size
            lease.held -= size
            if self._published:
                self._publish()

    def _release(self, lease: Lease) -> None:
        lock = self._lock
        lock.acquire()
        try:
            lease.closed = True
            if not lease.held:  # most requests restore nothing: nothing to publish
                return
            for budget in self._chain:
                budget.held -= lease.held
            lease.held = 0
            if self._published:
                self._publish()
        finally:
            lock.release()

    def _publish(self) -> None:
        for budget in self._published:
            budget.held_gauge.set(budget.held)  # type: ignore[union-attr]


class Lease:
    """One request's share of a :class:`Budget`; a context manager that releases it."""

    __slots__ = ("_budget", "closed", "held")

    def __init__(self, budget: Budget) -> None:
        self._budget = budget
        self.held = 0
        self.closed = False

    def take(self, size: int) -> bool:
        """Count ``size`` more bytes; False (nothing counted) when they do not fit."""
        return self._budget._take(self, size)

    def give(self, size: int) -> None:
        """Stop counting ``size`` of the bytes taken (a reservation's unused part)."""
        self._budget._give(self, size)

    def release(self) -> None:
        self._budget._release(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._budget._release(self)  # as release(), a call fewer


def budgets(
    memory_mb: int, decoding_bytes: int, metrics: Metrics | None = None
) -> tuple[Budget, Budget]:
    """(memory, decoding): the two budgets, ``decoding`` inside ``memory``, published in
    ``metrics`` when given."""

    def made(name: str, limit: int, parent: Budget | None = None) -> Budget:
        if metrics is None:
            return Budget(limit, parent)
        metrics.budget_limit.labels(name).set(limit)
        return Budget(
            limit,
            parent,
            held_gauge=metrics.budget_held.labels(name),
            sheds=metrics.budget_sheds.labels(name),
        )

    memory = made("memory", memory_mb * MIB)
    return memory, made("decoding", decoding_bytes, memory)
