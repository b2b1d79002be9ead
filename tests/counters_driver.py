"""One process taking from shared counters: ``python -m tests.counters_driver URL KEY LIMIT
TAKES START_AT`` waits until the wall clock reads ``START_AT`` (so several such processes
start together), takes one unit ``TAKES`` times from the meter ``KEY`` (``LIMIT`` a minute)
through the real :class:`~gateway.tenancy.redis_counters.RedisCounters`, all at one ``now``
(no refill), and prints ``{"granted": n, "refused": n, "failed": n}``."""

from __future__ import annotations

import asyncio
import json
import sys
import time

from gateway.tenancy.counters import CountersUnavailable, Meter
from gateway.tenancy.redis_counters import RedisCounters

NOW = 1_764_000_000.0


async def drive(url: str, key: str, limit: int, takes: int, start_at: float) -> dict[str, int]:
    store = RedisCounters(url, 2.0)
    meter = Meter(key, limit, 60.0)
    out = {"granted": 0, "refused": 0, "failed": 0}
    await store.ping()
    await asyncio.sleep(max(0.0, start_at - time.time()))
    try:
        for _ in range(takes):
            try:
                got = await store.take([meter], [1], NOW)
            except CountersUnavailable:
                out["failed"] += 1
                continue
            out["granted" if got.ok else "refused"] += 1
    finally:
        await store.close()
    return out


def main(argv: list[str]) -> None:
    url, key, limit, takes, start_at = argv
    print(json.dumps(asyncio.run(drive(url, key, int(limit), int(takes), float(start_at)))))


if __name__ == "__main__":
    main(sys.argv[1:])
