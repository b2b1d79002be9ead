"""gateway/batches/scheduler.py: retries follow the error model, backoff grows and is capped,
and each upstream's in-flight limit follows interactive use."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway import errors
from gateway.batches import scheduler
from gateway.ops import config


@pytest.mark.parametrize(
    ("err", "retry"),
    [
        (errors.UpstreamUnavailable(), True),
        (errors.UpstreamTimeout(), True),
        (errors.Overloaded(), True),
        (errors.GatewayError(status=500), True),
        (errors.GatewayError("slow", status=408), True),
        (errors.GatewayError("rate limited", status=429, error_type="rate_limit_error"), True),
        (errors.InvalidRequest("messages", "bad"), False),
        (errors.NotFound(), False),
        (errors.RequestTooLarge(), False),
    ],
)
def test_what_is_retried(err: errors.GatewayError, retry: bool) -> None:
    assert scheduler.retryable(err) is retry


def test_backoff_grows_and_is_capped() -> None:
    delays = [scheduler.backoff(n) for n in range(1, 12)]
    assert 1.5 <= delays[0] <= 2.5 and delays[3] > delays[0] * 4
    assert max(delays) <= 300 * 1.2


def _scheduler(**batches: Any) -> scheduler.Scheduler:
    cfg = config.parse(
        {
            "upstreams": {
                "u": {"base_url": "http://127.0.0.1:9/v1"},
                "v": {"base_url": "http://127.0.0.1:9/v1"},
            },
            "models": [
                {"name": "m", "upstream": "u", "upstream_model": "x"},
                {"name": "n", "upstream": "v", "upstream_model": "x"},
            ],
            "batches": {"database": "sqlite:////tmp/unused.sqlite3", **batches},
        },
        "test.toml",
        {"HOME": "/nonexistent"},
    )
    # neither the Messages call nor the store is used by these tests
    return scheduler.Scheduler(
        cfg.batches,
        None,
        None,  # type: ignore[arg-type]
        routes=cfg.models,
        in_flight={},
        draining=lambda: False,
    )


async def test_an_idle_upstream_takes_max_in_flight_idle() -> None:
    s = _scheduler(max_in_flight=2, max_in_flight_idle=6, idle_after=5.0)
    now = s._last_interactive["u"]
    assert s._limit("u", now + 1) == 2  # start counts as interactive use
    assert s._limit("u", now + 5) == 6
    s.interactive_ended("m")  # an interactive request on u ended: u is busy again
    assert s._limit("u", now + 5) == 2 and s._limit("v", now + 5) == 6
    assert _scheduler(max_in_flight=2)._limit("u", now + 1e6) == 2  # 0: as max_in_flight


async def test_held_back_work_is_looked_at_when_the_upstream_frees() -> None:
    s = _scheduler()
    in_flight = s._in_flight
    s._wake.clear()
    s.interactive_ended("m")
    assert not s._wake.is_set()  # nothing was held back: no round for it
    s._deferred.add("u")
    in_flight["m"] = 1
    s.interactive_ended("m")
    assert not s._wake.is_set()  # still at the threshold
    in_flight["m"] = 0
    s.interactive_ended("n")
    assert not s._wake.is_set()  # another upstream's request
    s.interactive_ended("m")
    assert s._wake.is_set()


async def test_an_empty_queue_is_not_looked_at_per_interactive_request() -> None:
    """Once a claim comes back short, interactive requests ending do not each start a round
    (a store query per request); a batch created here, or the poll, looks again."""

    class Store:
        claims = 0

        async def claim(self, *args: Any) -> list[Any]:
            Store.claims += 1
            return []

        async def next_due(self, *args: Any) -> None:
            return None

    s = _scheduler()
    s._store = Store()  # type: ignore[assignment]
    s._last_sweep = float("inf")  # no sweep in this test
    await s._round()
    assert Store.claims == 2 and s._has_work == {"u": False, "v": False}
    s._in_flight["m"] = 1
    await s._round()  # u busy: not deferred, nothing queued
    assert "u" not in s._deferred
    s._in_flight["m"] = 0
    s._wake.clear()
    s.interactive_ended("m")
    assert not s._wake.is_set()
    s.wake()  # a batch was created here
    assert s._has_work == {"u": True, "v": True}


class _BackoffStore:
    """Every request waits in back-off until ``due``; counts every query."""

    def __init__(self, due: float) -> None:
        self.due = due
        self.queries: list[str] = []
        self.claimed = asyncio.Event()

    async def claim(self, *args: Any) -> list[Any]:
        self.queries.append("claim")
        self.claimed.set()
        return []

    async def next_due(self, *args: Any) -> float:
        self.queries.append("next_due")
        return self.due


async def test_nothing_due_costs_no_store_query_until_a_retry_falls_due() -> None:
    """With every batch request in back-off, the scheduler sleeps until the earliest due
    retry instead of claiming every ``poll_interval`` (150 batches in back-off kept an idle
    gateway at a third of a core); a wake still looks at once."""
    s = _scheduler(poll_interval=0.01)
    s._last_sweep = time.time()  # the next sweep (expiry, gauges) is 30 s away
    store = _BackoffStore(time.time() + 3600)
    s._store = store  # type: ignore[assignment]
    task = asyncio.create_task(s.run())
    try:
        for _ in range(1000):  # the first round: one claim + next_due per upstream
            if store.queries.count("next_due") == 2:
                break
            await asyncio.sleep(0.01)
        assert store.queries.count("claim") == 2 and store.queries.count("next_due") == 2
        first = len(store.queries)
        await asyncio.sleep(0.5)  # fifty poll intervals, nothing due
        assert len(store.queries) == first, store.queries[first:]

        # a retry released here falls due soon: the scheduler wakes for it by itself
        store.claimed.clear()
        s._due["u"] = time.time() + 0.2
        s._wake.set()  # a batch request ended (as _run_one does), nothing else changed
        await asyncio.wait_for(store.claimed.wait(), 10)  # generous hang guard
        assert store.queries[first : first + 1] == ["claim"]

        # a batch created here is looked at at once, whatever is due
        store.claimed.clear()
        before = store.queries.count("claim")
        s.wake()
        await asyncio.wait_for(store.claimed.wait(), 10)
        assert store.queries.count("claim") > before
    finally:
        await s.stop()
        await asyncio.wait_for(task, 10)


class _DeadlineStore:
    """Nothing is ever claimable; ``next_due`` answers the first of ``deadlines`` still
    ahead (epoch seconds), None past the last. Counts claims."""

    def __init__(self, deadlines: list[float]) -> None:
        self.deadlines = deadlines
        self.claims = 0

    async def claim(self, *args: Any) -> list[Any]:
        self.claims += 1
        return []

    async def next_due(self, _models: Any, now: float) -> float | None:
        return next((d for d in self.deadlines if d > now), None)


def _interactive(s: scheduler.Scheduler) -> None:
    s._in_flight["m"] = s._in_flight["n"] = 1  # one slow stream on each upstream


def _at_capacity(s: scheduler.Scheduler) -> None:
    # the upstream is down and slow to say so: both batch requests hang in connect while
    # the back-off of the others falls due
    s._running["u"] = s._running["v"] = 2


# retries falling due inside the window, then one far beyond it
_DEADLINES = (0.1, 0.2, 0.3, 30.0)


@pytest.mark.parametrize(
    ("why", "setup", "deadlines", "most"),
    [
        # the poll that falls due while blocked (then held back), and a spare
        ("interactive stream in flight, nothing queued", _interactive, (), 2),
        ("interactive stream in flight, work in back-off", _interactive, _DEADLINES, 2),
        ("at capacity, work in back-off", _at_capacity, _DEADLINES, 2),
        # nothing blocks: one round per deadline inside the window, and a spare
        ("150 batches in back-off, three deadlines", lambda s: None, _DEADLINES, 3 + 1),
    ],
)
async def test_rounds_are_bounded_by_deadlines_not_time(
    why: str, setup: Any, deadlines: tuple[float, ...], most: int
) -> None:
    """While any request was in flight (or an upstream was at its limit), a deadline that
    fell due stayed due: every round found the upstream still blocked and ran again at
    once, a busy loop (one 6 s stream from a slow engine cost the gateway 5 CPU seconds).
    Now a blocked upstream waits for the wake that unblocks it, and the rounds in a window
    are bounded by the deadlines in it, however long the window."""
    s = _scheduler(poll_interval=0.05)
    s._last_sweep = time.time()  # the next sweep is 30 s away
    store = _DeadlineStore([time.time() + d for d in deadlines])
    s._store = store  # type: ignore[assignment]
    rounds = 0
    one_round = s._round

    async def counted() -> None:
        nonlocal rounds
        rounds += 1
        await one_round()

    s._round = counted  # type: ignore[method-assign]
    task = asyncio.create_task(s.run())
    try:
        for _ in range(500):  # the first look: a claim per upstream, both short
            if store.claims >= 2:
                break
            await asyncio.sleep(0.01)
        setup(s)  # then the stream starts, or the upstream fills
        rounds = 0
        await asyncio.sleep(0.8)  # every deadline and poll above falls inside
        assert rounds <= most, (why, rounds)
        if setup is _interactive:  # the stream ends: held-back work is looked at once
            before = store.claims
            s._in_flight["m"] = 0
            s.interactive_ended("m")
            for _ in range(500):
                if store.claims > before:
                    break
                await asyncio.sleep(0.01)
            assert store.claims == before + 1, why
    finally:
        await s.stop()
        await asyncio.wait_for(task, 10)
