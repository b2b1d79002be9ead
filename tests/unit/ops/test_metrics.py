"""The memoised children (the bisecting histogram, the counter and the gauge) count exactly as
prometheus-client's own."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.ops.metric_kinds import Memo

BOUNDS = (0.001, 0.01, 0.1, 1.0, 10.0)
# each bound itself (le is "less than or equal"), either side of it, zero, negative, huge
AMOUNTS = [b + d for b in BOUNDS for d in (-1e-9, 0.0, 1e-9)] + [0.0, -1.0, 1e9, 10.0, 0.5]


def _exposition(observe_via_memo: bool) -> bytes:
    registry = CollectorRegistry()
    hist = Histogram("h", "h", ["model"], buckets=BOUNDS, registry=registry)
    child = Memo(hist).labels("m") if observe_via_memo else hist.labels("m")
    for amount in AMOUNTS:
        child.observe(amount)
    return generate_latest(registry)


def test_same_buckets_count_and_sum_as_prometheus_client() -> None:
    assert _exposition(True) == _exposition(False)
    assert b'h_bucket{le="0.01",model="m"} 7.0' in _exposition(True)


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


def _after(kind: type, ops: list[tuple[str, tuple[float, ...]]], via_memo: bool) -> bytes:
    registry = CollectorRegistry()
    metric = kind("m", "m", ["model"], registry=registry)
    child = Memo(metric).labels("a") if via_memo else metric.labels("a")
    for name, args in ops:
        getattr(child, name)(*args)
    return generate_latest(registry)


@pytest.mark.parametrize(("kind", "ops"), COUNT_AND_LEVEL)
def test_counter_and_gauge_children_write_what_prometheus_client_writes(
    kind: type, ops: list[tuple[str, tuple[float, ...]]]
) -> None:
    assert _after(kind, ops, True) == _after(kind, ops, False)


@pytest.mark.parametrize("kind", [Counter, Gauge])
def test_counter_and_gauge_children_skip_prometheus_clients_checks(kind: type) -> None:
    """The memoised child's inc is the value's, not the metric's (which checks its type and
    looks for an exemplar on every call)."""
    memo = Memo(kind("c", "c", ["model"], registry=CollectorRegistry()))
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


def test_a_counter_child_refuses_a_negative_amount() -> None:
    child = Memo(Counter("c", "c", ["model"], registry=CollectorRegistry())).labels("a")
    with pytest.raises(ValueError):
        child.inc(-1)
