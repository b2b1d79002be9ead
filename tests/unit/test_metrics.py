"""The bisecting histogram child counts exactly as prometheus-client's own observe."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from gateway.ops import metrics

BOUNDS = (0.001, 0.01, 0.1, 1.0, 10.0)
# each bound itself (le is "less than or equal"), either side of it, zero, negative, huge
AMOUNTS = [b + d for b in BOUNDS for d in (-1e-9, 0.0, 1e-9)] + [0.0, -1.0, 1e9, 10.0, 0.5]


def _exposition(observe_via_memo: bool) -> bytes:
    registry = CollectorRegistry()
    hist = Histogram("h", "h", ["model"], buckets=BOUNDS, registry=registry)
    child = metrics._Memo(hist).labels("m") if observe_via_memo else hist.labels("m")
    for amount in AMOUNTS:
        child.observe(amount)
    return generate_latest(registry)


def test_same_buckets_count_and_sum_as_prometheus_client() -> None:
    assert _exposition(True) == _exposition(False)
    assert b'h_bucket{le="0.01",model="m"} 7.0' in _exposition(True)


def test_the_child_is_memoised_and_keeps_the_childs_other_methods() -> None:
    memo = metrics._Memo(Histogram("g", "g", ["model"], registry=CollectorRegistry()))
    child = memo.labels("m")
    assert memo.labels("m") is child
    assert child.child is memo.metric.labels("m")
    assert callable(child.time)  # anything else: the prometheus-client child's
