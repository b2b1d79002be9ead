"""Where the clients' counters live: the :class:`CounterStore` interface and
:class:`LocalStore`, this process's own (the default). :mod:`.redis_counters` is the same
arithmetic in Redis, for gateway replicas that enforce one limit.

Every rate limit is a token bucket, as the API's are: a meter of ``limit`` units that refills
continuously at ``limit / period`` a second (``period`` 60 s for the per-minute limits,
86,400 s for ``tokens_per_day``), starting full. A request takes what it needs from all of
its client's meters at once or from none: it passes when each meter holds its need (a need
over the whole limit is capped at the limit, so a request larger than a minute's budget waits
for a full meter instead of never passing). What a reply really used is settled afterwards
(:meth:`CounterStore.settle`), which may leave a meter below zero: the client then waits until
it refills.

A concurrency limit is a set of leases (one per request in flight) of at most ``limit``; a
lease not returned within its ``ttl`` (a crashed process) lapses.

A request's admission and its end are one call each (one round trip to Redis):
:meth:`CounterStore.enter_take` takes the lease and the meters together, or nothing (a
concurrency refusal leaves the meters as they are; a meter refusal holds no lease), and
:meth:`CounterStore.settle_leave` settles and returns the lease.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Meter:
    """One limited quantity of one client, e.g. ``alice:rpm`` with 60 per 60 s."""

    key: str
    limit: int
    period: float

    @property
    def rate(self) -> float:
        return self.limit / self.period


@dataclass(frozen=True, slots=True)
class Reading:
    """What a take found, per meter in the order given: the units left (after the take when
    it passed, as they are when it did not) and the seconds until the meter is full again;
    ``retry_after``: seconds until every need fits (0 when it passed)."""

    ok: bool
    remaining: tuple[int, ...]
    reset: tuple[float, ...]
    retry_after: float = 0.0


@dataclass(frozen=True, slots=True)
class SlotLease:
    """One concurrency lease: ``name`` held in ``key`` (of at most ``limit``) for ``ttl`` s."""

    key: str
    limit: int
    name: str
    ttl: float


class CountersUnavailable(Exception):
    """The store could not answer (Redis down or slow); [limits] on_store_error decides."""


class CounterStore(Protocol):
    async def take(self, meters: Sequence[Meter], needs: Sequence[int], now: float) -> Reading:
        """Take ``needs[i]`` from ``meters[i]`` for every i, or nothing when one lacks it."""

    async def settle(self, meters: Sequence[Meter], amounts: Sequence[int], now: float) -> None:
        """Take ``amounts[i]`` more from ``meters[i]`` (a negative amount gives back)."""

    async def enter(self, key: str, limit: int, lease: str, now: float, ttl: float) -> bool:
        """Hold one of ``limit`` leases of ``key`` as ``lease``; False when all are held."""

    async def leave(self, key: str, lease: str) -> None:
        """Return the lease."""

    async def enter_take(
        self, meters: Sequence[Meter], needs: Sequence[int], now: float, lease: SlotLease | None
    ) -> Reading | None:
        """:meth:`enter` then :meth:`take` at once: None when every lease is held (no meter
        touched); a refused reading holds no lease. ``lease`` None: a take alone."""

    async def settle_leave(
        self, meters: Sequence[Meter], amounts: Sequence[int], now: float, lease: SlotLease | None
    ) -> None:
        """:meth:`settle` (nothing when ``meters`` is empty) then :meth:`leave`."""

    async def close(self) -> None: ...


def level_now(level: float, stamp: float, meter: Meter, now: float) -> float:
    """A meter's level at ``now`` from its level at ``stamp``: refilled, capped at the limit."""
    return min(float(meter.limit), level + max(0.0, now - stamp) * meter.rate)


def reading(
    ok: bool, meters: Sequence[Meter], levels: Sequence[float], needs: Sequence[int]
) -> Reading:
    """The :class:`Reading` of meters at ``levels`` (after the take when ``ok``)."""
    remaining = tuple(max(0, math.floor(lv)) for lv in levels)
    reset = tuple((m.limit - lv) / m.rate for m, lv in zip(meters, levels, strict=True))
    if ok:
        return Reading(True, remaining, reset)
    wait = max(
        (min(n, m.limit) - lv) / m.rate
        for m, lv, n in zip(meters, levels, needs, strict=True)
        if lv < min(n, m.limit)
    )
    return Reading(False, remaining, reset, wait)


class LocalStore:
    """The counters in this process's memory: each gateway process limits alone.

    Memory: two floats per meter used (a few hundred bytes per client); nothing expires
    because the key set is bounded by the configured clients.
    """

    __slots__ = ("_leases", "_levels")

    def __init__(self) -> None:
        self._levels: dict[str, tuple[float, float]] = {}  # key -> (level, stamp)
        self._leases: dict[str, dict[str, float]] = {}  # key -> lease -> expiry

    def _level(self, meter: Meter, now: float) -> float:
        got = self._levels.get(meter.key)
        if got is None:
            return float(meter.limit)
        return level_now(got[0], got[1], meter, now)

    async def take(self, meters: Sequence[Meter], needs: Sequence[int], now: float) -> Reading:
        levels = [self._level(m, now) for m in meters]
        for m, lv, n in zip(meters, levels, needs, strict=True):
            if lv < min(n, m.limit):
                return reading(False, meters, levels, needs)
        after = [lv - n for lv, n in zip(levels, needs, strict=True)]
        for m, lv in zip(meters, after, strict=True):
            self._levels[m.key] = (lv, now)
        return reading(True, meters, after, needs)

    async def settle(self, meters: Sequence[Meter], amounts: Sequence[int], now: float) -> None:
        for m, amount in zip(meters, amounts, strict=True):
            lv = min(float(m.limit), self._level(m, now) - amount)
            self._levels[m.key] = (lv, now)

    async def enter(self, key: str, limit: int, lease: str, now: float, ttl: float) -> bool:
        held = self._leases.setdefault(key, {})
        if len(held) >= limit:
            for name in [n for n, expiry in held.items() if expiry <= now]:
                del held[name]
            if len(held) >= limit:
                return False
        held[lease] = now + ttl
        return True

    async def leave(self, key: str, lease: str) -> None:
        held = self._leases.get(key)
        if held is not None:
            held.pop(lease, None)

    async def enter_take(
        self, meters: Sequence[Meter], needs: Sequence[int], now: float, lease: SlotLease | None
    ) -> Reading | None:
        # nothing awaited here yields: the two steps are atomic in this process
        if lease is not None and not await self.enter(
            lease.key, lease.limit, lease.name, now, lease.ttl
        ):
            return None
        try:
            got = await self.take(meters, needs, now)
        except BaseException:
            if lease is not None:
                await self.leave(lease.key, lease.name)
            raise
        if not got.ok and lease is not None:
            await self.leave(lease.key, lease.name)
        return got

    async def settle_leave(
        self, meters: Sequence[Meter], amounts: Sequence[int], now: float, lease: SlotLease | None
    ) -> None:
        try:
            if meters:
                await self.settle(meters, amounts, now)
        finally:
            if lease is not None:
                await self.leave(lease.key, lease.name)

    async def close(self) -> None:
        return None
