"""A fair share of a saturated model: a light client's wait beside a heavy one, fair vs FIFO.

    python -m tests.benchmarks.fair_share            # both orders, about 45 s
    python -m tests.benchmarks.fair_share --fifo     # FIFO only
    python -m tests.benchmarks.fair_share --seconds 10

The real gateway process in front of the stub upstream (tests/stub_upstream.py), one model
(``delay:MS``: each reply after a fixed service time) with ``max_concurrency = 2`` and a
``queue_timeout`` longer than any wait. A heavy client keeps 32 requests outstanding (2 in
flight, 30 waiting); a light client sends one request at a time. Fair: two named clients
(``[[clients]]``, weight 1 each), admitted in weighted fair order. FIFO: the same load from
one client (every request ``anonymous``): arrival order.

Reported: the light client's requests, its latency and its wait (latency less the service
time) p50 and max, against one slot's service time. Expected: fair, the light client waits
at most about one service time (a slot frees every service/2 on average); FIFO, about the
whole queue (30 x service / 2).

Loopback only; every process it starts is ended by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from tests.procs import Proc, free_port, start_gateway, wait_http

REPO = Path(__file__).resolve().parents[2]
HEAVY_OUTSTANDING = 32  # 2 in flight + 30 waiting
SLOTS = 2


def _config(stub_url: str, service_ms: int, fair: bool) -> str:
    text = f"""
[server]
host = "127.0.0.1"
port = 8080
prefix = "/llm"

[upstreams.stub]
base_url = "{stub_url}"
header_timeout = 60

[[models]]
name = "m"
upstream = "stub"
upstream_model = "delay:{service_ms}"
max_concurrency = {SLOTS}
queue_timeout = 60
"""
    if fair:
        text += """
[[clients]]
name = "heavy"
key_env = "BENCH_HEAVY_KEY"

[[clients]]
name = "light"
key_env = "BENCH_LIGHT_KEY"
"""
    return text


_BODY = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


async def _one(session: aiohttp.ClientSession, url: str, key: str) -> float:
    t0 = time.perf_counter()
    async with session.post(url, json=_BODY, headers={"x-api-key": key}) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"status {resp.status}")
    return time.perf_counter() - t0


async def _run(
    base: str, heavy_key: str, light_key: str, seconds: float
) -> tuple[list[float], int]:
    url = base + "/llm/v1/messages"
    stop = time.monotonic() + seconds
    heavy_done = 0
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def heavy() -> None:
            nonlocal heavy_done
            while time.monotonic() < stop + 1:
                await _one(session, url, heavy_key)
                heavy_done += 1

        heavies = [asyncio.create_task(heavy()) for _ in range(HEAVY_OUTSTANDING)]
        await asyncio.sleep(1.0)  # the heavy client's queue fills first
        light: list[float] = []
        while time.monotonic() < stop:
            light.append(await _one(session, url, light_key))
        for task in heavies:
            task.cancel()
        await asyncio.gather(*heavies, return_exceptions=True)
    return light, heavy_done


def _measure(stub_url: str, service_ms: int, fair: bool, seconds: float) -> dict[str, float]:
    env = {"BENCH_HEAVY_KEY": "heavy-key-0123456789", "BENCH_LIGHT_KEY": "light-key-0123456789"}
    with tempfile.TemporaryDirectory() as tmp:
        proc, base = start_gateway(_config(stub_url, service_ms, fair), Path(tmp), env=env)
        try:
            keys = (env["BENCH_HEAVY_KEY"], env["BENCH_LIGHT_KEY"]) if fair else ("a", "a")
            light, heavy = asyncio.run(_run(base, *keys, seconds))
        finally:
            proc.stop()
    service = service_ms / 1000
    waits = [max(x - service, 0.0) for x in light]
    return {
        "light_requests": len(light),
        "heavy_requests": heavy,
        "light_latency_p50": statistics.median(light),
        "light_latency_max": max(light),
        "light_wait_p50": statistics.median(waits),
        "light_wait_max": max(waits),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fifo", action="store_true", help="FIFO only (one client)")
    parser.add_argument("--fair", action="store_true", help="fair order only (two clients)")
    parser.add_argument("--seconds", type=float, default=15.0, help="per order (default 15)")
    parser.add_argument("--service-ms", type=int, default=200, help="the stub's service time")
    args = parser.parse_args(argv)
    orders = [("fair", True), ("fifo", False)]
    if args.fifo:
        orders = [("fifo", False)]
    elif args.fair:
        orders = [("fair", True)]
    port = free_port()
    stub = Proc([sys.executable, str(REPO / "tests" / "stub_upstream.py"), str(port)])
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc=stub.popen)
        stub_url = f"http://127.0.0.1:{port}/v1"
        service = args.service_ms / 1000
        print(
            f"model: {SLOTS} slots, service {args.service_ms} ms; heavy: "
            f"{HEAVY_OUTSTANDING} outstanding ({HEAVY_OUTSTANDING - SLOTS} waiting); "
            "light: one at a time"
        )
        for name, fair in orders:
            r = _measure(stub_url, args.service_ms, fair, args.seconds)
            print(
                f"{name:5}  light requests {r['light_requests']:3.0f}"
                f"  heavy {r['heavy_requests']:4.0f}"
                f"  light wait p50 {r['light_wait_p50']:.3f} s  max {r['light_wait_max']:.3f} s"
                f"  (= {r['light_wait_p50'] / service:.2f} / {r['light_wait_max'] / service:.2f}"
                f" service times; latency p50 {r['light_latency_p50']:.3f} s)"
            )
    finally:
        stub.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
