"""gateway/ops/budget.py: process-wide memory budgets, leases that always give back what they
took (an error, a cancelled task), a budget inside another, and what they publish."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.ops.budget import MIB, Budget, budgets
from gateway.ops.metrics import Metrics

# (name, limit, bytes other leases hold, takes of one lease, what each returns)
TAKES = [
    ("fits", 100, 0, [40, 60], [True, True]),
    ("alone, any size", 100, 0, [500, 1], [True, True]),
    ("past the limit beside another", 100, 30, [70, 1], [True, False]),
    ("a refusal takes nothing", 100, 50, [60, 50], [False, True]),
    ("beside another, exactly full", 100, 99, [1, 1], [True, False]),
]


@pytest.mark.parametrize(
    ("limit", "others", "takes", "expected"), [c[1:] for c in TAKES], ids=[c[0] for c in TAKES]
)
def test_a_take_fits_or_is_refused(
    limit: int, others: int, takes: list[int], expected: list[bool]
) -> None:
    budget = Budget(limit)
    other = budget.lease()
    if others:
        assert other.take(others)
    with budget.lease() as lease:
        got = [lease.take(size) for size in takes]
        assert got == expected
        taken = sum(s for s, ok in zip(takes, got, strict=True) if ok)
        assert lease.held == taken and budget.held == others + taken
    assert budget.held == others
    other.release()
    assert budget.held == 0


def test_give_returns_part_of_a_reservation() -> None:
    budget = Budget(100)
    with budget.lease() as lease:
        assert lease.take(80)
        lease.give(50)
        assert lease.held == budget.held == 30
        lease.give(1000)  # never more than it holds
        assert lease.held == budget.held == 0
    assert budget.held == 0


def test_a_take_counts_in_the_parent_and_must_fit_there() -> None:
    """A body (decoding, inside memory) is refused when the memory budget is full of
    what other requests hold, though the decoding budget is empty."""
    memory = Budget(100)
    decoding = Budget(60, memory)
    held = memory.lease()
    assert held.take(70)  # restored reasoning of another request
    with decoding.lease() as body:
        assert body.take(30) and memory.held == 100 and decoding.held == 30
        assert not body.take(1)  # memory is full
        assert decoding.held == 30
    assert memory.held == 70 and decoding.held == 0
    held.release()
    with decoding.lease() as body:
        assert body.take(60)
        other = decoding.lease()
        assert not other.take(1)  # decoding is full
        other.release()
    assert memory.held == decoding.held == 0


def test_released_on_error() -> None:
    budget = Budget(100)
    with pytest.raises(ValueError), budget.lease() as lease:
        assert lease.take(90)
        raise ValueError
    assert budget.held == 0


async def test_released_when_the_task_holding_it_is_cancelled() -> None:
    """A handler whose client hung up is cancelled mid-await: the lease is given back, and
    a thread still working for it takes nothing more."""
    budget = Budget(100)
    inside = asyncio.Event()
    leases: list[Any] = []

    async def handler() -> None:
        with budget.lease() as lease:
            leases.append(lease)
            assert lease.take(60)
            inside.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(handler())
    await inside.wait()
    assert budget.held == 60
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert budget.held == 0
    assert not leases[0].take(1) and budget.held == 0


def test_takes_from_threads_are_counted_exactly() -> None:
    budget = Budget(10**9)
    leases = [budget.lease() for _ in range(8)]

    def work(lease: Any) -> None:
        for _ in range(2000):
            assert lease.take(3)
            lease.give(1)

    threads = [threading.Thread(target=work, args=(lease,)) for lease in leases]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert budget.held == 8 * 2000 * 2
    for lease in leases:
        lease.release()
    assert budget.held == 0


def test_the_budgets_publish_what_they_hold_and_shed() -> None:
    metrics = Metrics(CollectorRegistry())
    memory, decoding = budgets(2, 1024, metrics)
    assert memory.limit == 2 * MIB and decoding.limit == 1024 and decoding.parent is memory

    def value(name: str, budget: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"budget": budget})

    assert value("llm_gateway_memory_budget_limit_bytes", "memory") == 2 * MIB
    with decoding.lease() as body, memory.lease() as reasoning:
        assert body.take(1000) and reasoning.take(MIB)
        assert value("llm_gateway_memory_budget_bytes", "memory") == MIB + 1000
        assert value("llm_gateway_memory_budget_bytes", "decoding") == 1000
        second = decoding.lease()
        assert not second.take(100)  # decoding full
        second.release()
        assert not reasoning.take(MIB)  # memory full
    assert value("llm_gateway_memory_budget_bytes", "memory") == 0
    assert value("llm_gateway_memory_budget_bytes", "decoding") == 0
    assert value("llm_gateway_memory_budget_sheds_total", "memory") == 1
    assert value("llm_gateway_memory_budget_sheds_total", "decoding") == 1


class _Gauge:
    """A held gauge: read at scrape time (``reads``) or, like --workers', set on change."""

    def __init__(self, reads: bool) -> None:
        self.reads = reads
        self.read: Any = None
        self.sets: list[float] = []

    def set(self, value: float) -> None:
        self.sets.append(value)

    def read_from(self, read: Any) -> bool:
        if self.reads:
            self.read = read
        return self.reads


def test_a_read_gauge_is_never_set_and_a_multiprocess_one_on_every_change() -> None:
    read, written = _Gauge(reads=True), _Gauge(reads=False)
    outer = Budget(1000, held_gauge=read)
    inner = Budget(100, outer, held_gauge=written)
    with inner.lease() as lease:
        assert lease.take(60)
        assert read.read() == 60
        lease.give(10)
        assert read.read() == 50
    assert read.read() == 0 and read.sets == []
    assert written.sets == [60, 50, 0]
    with outer.lease() as lease:
        assert lease.take(7)  # not in inner: its gauge is not set
    assert written.sets == [60, 50, 0]
