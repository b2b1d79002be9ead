"""The metric kinds the gateway declares its families with, and their hot-path children.

:class:`Memo` wraps a prometheus-client metric and caches its ``labels()`` children by
label values; the children it hands out (:class:`_Observer`, :class:`_Count`,
:class:`_Level`) write straight to the child's own value, per-process or ``--workers``'
multiprocess alike. The gateway asks for the same few children on every request, so
this is the per-request cost of every metric (docs/performance.md).

One writer: a family declared ``one_writer=True`` is written only from the event loop's
thread (never from ``asyncio.to_thread``, an executor, or another thread of any kind), and
its per-process children (:class:`_OneCount`, :class:`_OneLevel`, :class:`_OneObserver`)
add to the value without its lock: a lock only orders writers, and a scrape (any thread)
reads a float that is whole before or after a write. The rule is the declaring code's to
keep; it holds for the families written per request (the middleware, a reply's
:class:`~gateway.messages.from_chat.figures.Figures`, the upstream call). Families written
from a thread too (the memory budgets, taken from signature restores off the loop) keep the
lock. Under ``--workers`` every child keeps the multiprocess value's own ``inc``.
:func:`check_writers` (the test suite turns it on) makes the one-writer children made
afterwards note any write from a thread other than their first writer's.

:class:`Families` declares families on one registry with the ``llm_gateway_`` prefix,
each wrapped in a :class:`Memo`: what gateway/ops/metrics.py builds ``Metrics`` with.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.values import MutexValue

# how a gauge's values from --workers' live (or all) workers combine into one series
Mode = Literal["livesum", "livemax", "livemin", "max"]


def _adder(value: Any) -> Callable[[float], None]:
    """What adds to a metric child's ``value``: its own ``inc``, or for the per-process
    value (not ``--workers``' multiprocess one) the same sum under the same lock, taken by
    ``acquire``/``release``: a ``with`` on a lock costs twice that, and the gateway adds to
    a value about twenty times a request."""
    if type(value) is not MutexValue:
        return value.inc  # type: ignore[no-any-return]
    acquire = value._lock.acquire
    release = value._lock.release

    def add(amount: float) -> None:
        acquire()
        try:
            value._value += amount
        finally:
            release()

    return add


class _Observer:
    """A histogram child whose ``observe`` finds the bucket by bisection.

    prometheus-client's ``observe`` walks the bounds in Python (up to 16 steps here) and
    checks the metric's type again; this one does what it does, in one C call, on the
    child's own values (per-process or multiprocess alike). Everything else is the child's.
    """

    __slots__ = ("_bounds", "_buckets", "_sum", "child")

    def __init__(self, child: Histogram) -> None:
        self.child = child
        self._bounds = list(child._upper_bounds)  # ends with +Inf: every amount has a bucket
        self._buckets = [_adder(b) for b in child._buckets]
        self._sum = _adder(child._sum)

    def observe(self, amount: float) -> None:
        self._sum(amount)
        self._buckets[bisect_left(self._bounds, amount)](1)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.child, name)


class _Count:
    """A counter child whose ``inc`` goes straight to the child's value.

    prometheus-client's ``inc`` checks the metric's type again and for an exemplar on every
    call; the gateway counts a dozen times a request. The value is the child's own (its lock,
    per-process or multiprocess alike); everything else is the child's.
    """

    __slots__ = ("_add", "child")

    def __init__(self, child: Counter) -> None:
        self.child = child
        self._add = _adder(child._value)

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._add(amount)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.child, name)


class _Level:
    """A gauge child whose ``inc``, ``dec`` and ``set`` go straight to the child's value
    (as :class:`_Count`; no gauge here is in ``mostrecent`` mode, which needs a timestamp)."""

    __slots__ = ("_add", "_value", "child")

    def __init__(self, child: Gauge) -> None:
        self.child = child
        self._value = child._value
        self._add = _adder(child._value)

    def inc(self, amount: float = 1) -> None:
        self._add(amount)

    def dec(self, amount: float = 1) -> None:
        self._add(-amount)

    def set(self, value: float) -> None:
        self._value.set(float(value))

    def read_from(self, read: Callable[[], float]) -> bool:
        """Show ``read()`` at scrape time, when the value is this process's own: True, and
        whoever changes the figure need not ``set`` it. Under ``--workers`` the scrape reads
        the multiprocess files, not this process: False, the caller keeps setting it."""
        if type(self._value) is not MutexValue:
            return False
        self.child.set_function(read)
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.child, name)


class _OneObserver:
    """:class:`_Observer` for a one-writer family's per-process child: no lock (module
    docstring)."""

    __slots__ = ("_bounds", "_buckets", "_sum", "child")

    def __init__(self, child: Histogram) -> None:
        self.child = child
        self._bounds = list(child._upper_bounds)
        self._buckets = list(child._buckets)
        self._sum = child._sum

    def observe(self, amount: float) -> None:
        self._sum._value += amount
        self._buckets[bisect_left(self._bounds, amount)]._value += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.child, name)


class _OneCount:
    """:class:`_Count` for a one-writer family's per-process child: no lock."""

    __slots__ = ("_value", "child")

    def __init__(self, child: Counter) -> None:
        self.child = child
        self._value = child._value

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._value._value += amount

    def __getattr__(self, name: str) -> Any:
        return getattr(self.child, name)


class _OneLevel:
    """:class:`_Level` for a one-writer family's per-process child: no lock."""

    __slots__ = ("_value", "child")

    def __init__(self, child: Gauge) -> None:
        self.child = child
        self._value = child._value

    def inc(self, amount: float = 1) -> None:
        self._value._value += amount

    def dec(self, amount: float = 1) -> None:
        self._value._value -= amount

    def set(self, value: float) -> None:
        self._value._value = float(value)

    def read_from(self, read: Callable[[], float]) -> bool:
        """:meth:`_Level.read_from`; this child's value is always this process's own."""
        self.child.set_function(read)
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.child, name)


# the writes from a second thread that checked one-writer children saw (check_writers)
_strays: list[str] | None = None


def check_writers() -> list[str]:
    """From now on, one-writer children are made checked: each write from a thread other
    than the child's first writer appends a line to the list returned (the same list on
    every call). For the test suite; a checked child costs a thread lookup per write."""
    global _strays
    if _strays is None:
        _strays = []
    return _strays


class _Checked:
    """A one-writer child (:class:`_OneCount`, ...) whose writes check their thread."""

    __slots__ = ("_inner", "_name", "_writer")

    def __init__(self, inner: Any, name: str) -> None:
        self._inner = inner
        self._name = name
        self._writer: int | None = None

    def _check(self) -> None:
        me = threading.get_ident()
        if self._writer is None:
            self._writer = me
        elif me != self._writer and _strays is not None:
            _strays.append(f"{self._name} written from {threading.current_thread().name}")

    def inc(self, amount: float = 1) -> None:
        self._check()
        self._inner.inc(amount)

    def dec(self, amount: float = 1) -> None:
        self._check()
        self._inner.dec(amount)

    def set(self, value: float) -> None:
        self._check()
        self._inner.set(value)

    def observe(self, amount: float) -> None:
        self._check()
        self._inner.observe(amount)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Memo:
    """A metric whose ``labels()`` children are cached by label values.

    prometheus-client validates and locks on every ``labels()`` call (several us); the
    gateway asks for the same few children on every request. Label values are bounded
    (config values, fixed enums, status codes), so the cache is too. ``one_writer``: the
    family is written from the event loop's thread only (module docstring).
    """

    __slots__ = ("labels", "metric", "one_writer")

    def __init__(self, metric: Any, one_writer: bool = False) -> None:
        self.metric = metric
        self.one_writer = one_writer
        # labels(*values): the child for those label values, made at the first call. The
        # cache is functools' C one (unbounded: the label values are): a hit runs no Python.
        self.labels: Callable[..., Any] = lru_cache(maxsize=None)(self._make)

    def _make(self, *values: str) -> Any:
        return self._wrap(self.metric.labels(*values))

    def _wrap(self, child: Any) -> Any:
        if isinstance(child, Histogram):
            if self.one_writer and type(child._sum) is MutexValue:
                return self._checked(_OneObserver(child))
            return _Observer(child)
        if isinstance(child, Counter):
            if self.one_writer and type(child._value) is MutexValue:
                return self._checked(_OneCount(child))
            return _Count(child)
        if isinstance(child, Gauge) and not child._is_most_recent:
            if self.one_writer and type(child._value) is MutexValue:
                return self._checked(_OneLevel(child))
            return _Level(child)
        return child

    def _checked(self, child: Any) -> Any:
        return child if _strays is None else _Checked(child, self.metric._name)

    def remove(self, *values: str) -> None:
        """Stop exposing one child's series (a replica that left). The cache forgets every
        child (it cannot drop one): the others are made again, on the same values."""
        if values in self.metric._metrics:
            self.metric.remove(*values)
            self.labels.cache_clear()  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.metric, name)


class Families:
    """Declares metric families on ``registry``, their names prefixed with ``prefix``,
    each one wrapped in a :class:`Memo` (labels as a sequence of label names)."""

    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        self.registry = registry
        self.prefix = prefix

    def counter(
        self, name: str, doc: str, labels: Sequence[str], *, one_writer: bool = False
    ) -> Memo:
        """``one_writer``: written from the event loop's thread only (module docstring)."""
        return Memo(Counter(self.prefix + name, doc, labels, registry=self.registry), one_writer)

    def histogram(
        self,
        name: str,
        doc: str,
        labels: Sequence[str],
        buckets: Sequence[float],
        *,
        one_writer: bool = False,
    ) -> Memo:
        return Memo(
            Histogram(self.prefix + name, doc, labels, buckets=buckets, registry=self.registry),
            one_writer,
        )

    def gauge(
        self, name: str, doc: str, labels: Sequence[str], mode: Mode, *, one_writer: bool = False
    ) -> Memo:
        """``mode``: the multiprocess mode, which matters only with ``--workers``."""
        return Memo(
            Gauge(self.prefix + name, doc, labels, registry=self.registry, multiprocess_mode=mode),
            one_writer,
        )
