"""The memoised children (the bisecting histogram, the counter and the gauge) count exactly as
prometheus-client's own, with the value's lock or (one-writer families) without it; a
one-writer child written from a second thread is told."""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.ops.metric_kinds import Memo, check_writers

BOUNDS = (0.001, 0.01, 0.1, 1.0, 10.0)
# each bound itself (le is "less than or equal"), either side of it, zero, negative, huge
AMOUNTS = [b + d for b in BOUNDS for d in (-1e-9, 0.0, 1e-9)] + [0.0, -1.0, 1e9, 10.0, 0.5]


def _counts(registry: CollectorRegistry) -> bytes:
    """The exposition without its ``_created`` series: the gateway turns them off
    (gateway/ops/metrics.py), and two children made apart are never created in the same
    instant, so alone (nothing has imported the gateway's metrics) they would differ."""
    lines = generate_latest(registry).splitlines(keepends=True)
    return b"".join(line for line in lines if b"_created" not in line)


def _exposition(observe_via_memo: bool, one_writer: bool = False) -> bytes:
    registry = CollectorRegistry()
    hist = Histogram("h", "h", ["model"], buckets=BOUNDS, registry=registry)
    child = Memo(hist, one_writer).labels("m") if observe_via_memo else hist.labels("m")
    for amount in AMOUNTS:
        child.observe(amount)
    return _counts(registry)


@pytest.mark.parametrize("one_writer", [False, True])
def test_same_buckets_count_and_sum_as_prometheus_client(one_writer: bool) -> None:
    assert _exposition(True, one_writer) == _exposition(False)
    assert b'h_bucket{le="0.01",model="m"} 7.0' in _exposition(True, one_writer)


def test_the_child_is_memoised_and_keeps_the_childs_other_methods() -> None:
    memo = Memo(Histogram("g", "g", ["model"], registry=CollectorRegistry()))
    child = memo.labels("m")
    assert memo.labels("m") is child
    assert child.child is memo.metric.labels("m")
    assert callable(child.time)  # anything else: the prometheus-client child's


# (metric type, operations on the child): the memoised child writes what prometheus-client's
# own child writes, and refuses what it refuses
COUNT_AND_LEVEL = [
    (Counter, [("inc", ()), ("inc", (2.5,)), ("inc", (0,))]),
    (
        Gauge,
        [
            ("inc", ()),
            ("inc", (3,)),
            ("dec", ()),
            ("dec", (0.5,)),
            ("set", (7,)),
            ("inc", (-2,)),
            ("set", (-1.25,)),
        ],
    ),
]


def _after(
    kind: type, ops: list[tuple[str, tuple[float, ...]]], via_memo: bool, one_writer: bool = False
) -> bytes:
    registry = CollectorRegistry()
    metric = kind("m", "m", ["model"], registry=registry)
    child = Memo(metric, one_writer).labels("a") if via_memo else metric.labels("a")
    for name, args in ops:
        getattr(child, name)(*args)
    return _counts(registry)


@pytest.mark.parametrize("one_writer", [False, True])
@pytest.mark.parametrize(("kind", "ops"), COUNT_AND_LEVEL)
def test_counter_and_gauge_children_write_what_prometheus_client_writes(
    kind: type, ops: list[tuple[str, tuple[float, ...]]], one_writer: bool
) -> None:
    assert _after(kind, ops, True, one_writer) == _after(kind, ops, False)


@pytest.mark.parametrize("one_writer", [False, True])
@pytest.mark.parametrize("kind", [Counter, Gauge])
def test_counter_and_gauge_children_skip_prometheus_clients_checks(
    kind: type, one_writer: bool
) -> None:
    """The memoised child's inc is the value's, not the metric's (which checks its type and
    looks for an exemplar on every call)."""
    memo = Memo(kind("c", "c", ["model"], registry=CollectorRegistry()), one_writer)
    child = memo.labels("a")
    calls: list[str] = []
    real = type(child.child)._raise_if_not_observable

    def counted(self: Any) -> None:
        calls.append("checked")
        real(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(child.child), "_raise_if_not_observable", counted)
        child.inc()
    assert calls == []
    assert memo.labels("a") is child
    assert child.child is memo.metric.labels("a")


@pytest.mark.parametrize("one_writer", [False, True])
def test_a_counter_child_refuses_a_negative_amount(one_writer: bool) -> None:
    memo = Memo(Counter("c", "c", ["model"], registry=CollectorRegistry()), one_writer)
    child = memo.labels("a")
    with pytest.raises(ValueError):
        child.inc(-1)
    assert memo.metric.labels("a")._value.get() == 0


class _CountedLock:
    def __init__(self) -> None:
        self.taken = 0
        self._lock = threading.Lock()

    def acquire(self, *args: Any) -> bool:
        self.taken += 1
        return self._lock.acquire(*args)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


@pytest.mark.parametrize(("one_writer", "locks"), [(False, 4), (True, 0)])
def test_only_a_one_writer_familys_children_write_without_the_values_lock(
    one_writer: bool, locks: int
) -> None:
    registry = CollectorRegistry()
    counter = Counter("c", "c", ["model"], registry=registry)
    gauge = Gauge("g", "g", ["model"], registry=registry)
    hist = Histogram("h", "h", ["model"], buckets=BOUNDS, registry=registry)
    lock = _CountedLock()
    for metric in (counter, gauge):
        metric.labels("a")._value._lock = lock
    hist.labels("a")._sum._lock = lock
    for bucket in hist.labels("a")._buckets:
        bucket._lock = lock
    Memo(counter, one_writer).labels("a").inc(2)
    Memo(gauge, one_writer).labels("a").inc(3)
    Memo(hist, one_writer).labels("a").observe(0.5)  # its sum, then its bucket
    assert lock.taken == locks
    assert counter.labels("a")._value.get() == 2 and gauge.labels("a")._value.get() == 3


def test_a_one_writer_child_written_from_a_second_thread_is_told() -> None:
    strays = check_writers()  # on for the whole suite (tests/conftest.py): the same list
    assert check_writers() is strays
    registry = CollectorRegistry()
    one = Memo(Counter("one", "c", ["model"], registry=registry), one_writer=True)
    locked = Memo(Counter("locked", "c", ["model"], registry=registry))
    one.labels("a").inc()
    locked.labels("a").inc()
    before = len(strays)

    def elsewhere() -> None:
        one.labels("a").inc()
        locked.labels("a").inc()  # takes the lock: may be written from anywhere

    thread = threading.Thread(target=elsewhere, name="elsewhere")
    thread.start()
    thread.join(10)
    told = strays[before:]
    del strays[before:]  # told: not the suite's stray (tests/conftest.py)
    assert told == ["one written from elsewhere"]
    assert one.labels("a")._value.get() == 2 and locked.labels("a")._value.get() == 2


def test_a_memoised_child_is_found_without_running_python() -> None:
    memo = Memo(Counter("c", "c", ["model", "code"], registry=CollectorRegistry()))
    child = memo.labels("a", "200")
    calls: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        again = memo.labels("a", "200")
    finally:
        sys.setprofile(None)
    assert again is child
    assert calls == []


def test_removing_a_child_drops_its_series_only() -> None:
    registry = CollectorRegistry()
    memo = Memo(Counter("c", "c", ["replica"], registry=registry))
    memo.labels("a").inc()
    memo.labels("b").inc(2)
    memo.remove("a")
    memo.remove("a")  # gone already: nothing to do
    memo.remove("never")
    exposition = generate_latest(registry)
    assert b'replica="a"' not in exposition
    assert b'c_total{replica="b"} 2.0' in exposition
    memo.labels("b").inc()
    memo.labels("a").inc()  # back, from zero
    exposition = generate_latest(registry)
    assert b'c_total{replica="b"} 3.0' in exposition
    assert b'c_total{replica="a"} 1.0' in exposition
