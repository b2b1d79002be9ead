"""What a limited request costs in counters: one ``take`` then one ``settle`` per request,
through LocalStore and through RedisCounters on a real redis-server.

    python -m tests.benchmarks.counters [--requests 5000] [--json out.json]   # ~20 s

Each request takes from four meters (requests, input and output tokens a minute, tokens a
day; as a client with every limit set) and settles three, at concurrency 1 and 16, on uvloop
as the gateway runs. Reports requests/s, wall µs per request, the gateway side's CPU µs per
request (this process's CPU time, user + system, ``os.times``: the RESP client, the event
loop, the reading, the socket system calls) and redis-server's own CPU µs per request (from
``/proc/PID/stat``). The store runs in this process, so the figures are the counters' cost
alone, without HTTP. Loopback only; the redis-server is started on a free port and stopped by
PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from gateway.tenancy.counters import CounterStore, LocalStore, Meter
from gateway.tenancy.redis_counters import RedisCounters
from tests.redis_server import RedisServer

_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


async def _run(store: CounterStore, requests: int, concurrency: int, tag: str) -> float:
    """Wall seconds for ``requests`` take+settle pairs, ``concurrency`` at a time."""
    clients = 64  # spread over clients as a team would, each limit never reached
    big = 10**12
    meters = [
        [
            Meter(f"{tag}{c}:rpm", big, 60.0),
            Meter(f"{tag}{c}:itpm", big, 60.0),
            Meter(f"{tag}{c}:otpm", big, 60.0),
            Meter(f"{tag}{c}:tpd", big, 86400.0),
        ]
        for c in range(clients)
    ]
    per = requests // concurrency

    async def worker(w: int) -> None:
        for i in range(per):
            ms = meters[(w * per + i) % clients]
            now = time.time()
            got = await store.take(ms, [1, 1200, 4096, 5296], now)
            assert got.ok
            await store.settle(ms[1:], [-200, -3900, -4100], time.time())

    t = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return time.perf_counter() - t


async def _measure(
    store: CounterStore, requests: int, concurrency: int, tag: str, server_pid: int | None
) -> dict[str, float]:
    await _run(store, max(200, requests // 10), concurrency, tag + "w")  # warm up
    t0 = os.times()
    srv0 = _proc_cpu(server_pid) if server_pid else 0.0
    wall = await _run(store, requests, concurrency, tag)
    t1 = os.times()
    user, system = t1.user - t0.user, t1.system - t0.system
    cpu = user + system
    done = requests // concurrency * concurrency
    out = {
        "requests_per_s": round(done / wall),
        "wall_us_per_request": round(wall / done * 1e6, 1),
        "cpu_us_per_request": round(cpu / done * 1e6, 1),
        "system_cpu_us_per_request": round(system / done * 1e6, 1),
    }
    if server_pid:
        out["redis_cpu_us_per_request"] = round((_proc_cpu(server_pid) - srv0) / done * 1e6, 1)
    return out


async def _all(requests: int, server: RedisServer) -> dict[str, Any]:
    results: dict[str, Any] = {}
    assert server.proc is not None
    for c in (1, 16):
        results[f"local c{c}"] = await _measure(LocalStore(), requests * 5, c, f"l{c}:", None)
        redis = RedisCounters(server.url, 1.0)
        try:
            results[f"redis c{c}"] = await _measure(redis, requests, c, f"r{c}:", server.proc.pid)
        finally:
            await redis.close()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=5000, help="per Redis run (local: 5x)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import uvloop

    server = RedisServer()
    server.start()
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            results = runner.run(_all(args.requests, server))
    finally:
        server.close()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'':10} {'req/s':>9} {'wall µs':>9} {'CPU µs':>8} {'(system)':>9} {'redis CPU µs':>13}")
    for name, r in results.items():
        redis_cpu = r.get("redis_cpu_us_per_request", "")
        print(
            f"{name:10} {r['requests_per_s']:>9} {r['wall_us_per_request']:>9} "
            f"{r['cpu_us_per_request']:>8} {r['system_cpu_us_per_request']:>9} {redis_cpu!s:>13}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
