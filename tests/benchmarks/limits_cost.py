"""The per-request cost of a client's limits: c16 buffered Messages requests through the
gateway, its CPU per request with the benchmark's key as a plain key (``server.api_keys_env``:
no limits, what every gateway without ``[[clients]]`` pays) and as a client's with every
limit set (rpm, input, output and day tokens, max_concurrency; in-process counters), set
high enough never to refuse. Runs alternate, medians are compared::

    PYTHONPATH=$PWD python -m tests.benchmarks.limits_cost [--requests N] [--reps R]

Prints one JSON object: CPU µs per request of each and their ratio (limited / plain).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys

from tests.benchmarks import driver
from tests.benchmarks.run import API_KEY, HOST, Bench, _measured

LIMITED = """
[[clients]]
name = "bench"
key_env = "BENCH_CLIENT_KEY"
requests_per_minute = 1000000000
input_tokens_per_minute = 1000000000000
output_tokens_per_minute = 1000000000000
tokens_per_day = 1000000000000
max_concurrency = 10000
"""


async def _cpu_per_request(bench: Bench, requests: int) -> float:
    port, raw = bench.request("gateway", "anthropic", "bench:16:0", False)
    await driver.closed_loop(HOST, port, raw, concurrency=16, requests=max(16, requests // 10))
    res, cpu = await _measured(
        bench, "gateway", driver.closed_loop(HOST, port, raw, concurrency=16, requests=requests)
    )
    if res.ok != len(res.results):
        raise SystemExit(f"{len(res.results) - res.ok} requests failed")
    return cpu / len(res.results) * 1e6


async def _run(requests: int, reps: int) -> dict[str, float]:
    os.environ["BENCH_CLIENT_KEY"] = API_KEY  # the gateway processes inherit it
    bench = Bench("quick")
    plain_cfg = bench.cfg.read_text()
    # the same key, now a client's (and no longer in api_keys_env: one client per key)
    limited_cfg = plain_cfg.replace('api_keys_env = "BENCH_GATEWAY_KEYS"\n', "") + LIMITED
    cpu: dict[str, list[float]] = {"plain": [], "limited": []}
    try:
        for _ in range(reps):
            for name, text in (("plain", plain_cfg), ("limited", limited_cfg)):
                bench.cfg.write_text(text)
                bench.restart("gateway")
                cpu[name].append(await _cpu_per_request(bench, requests))
    finally:
        bench.close()
    plain = statistics.median(cpu["plain"])
    limited = statistics.median(cpu["limited"])
    return {
        "plain_cpu_us": round(plain, 1),
        "limited_cpu_us": round(limited, 1),
        "ratio": round(limited / plain, 3),
        "runs": cpu,  # type: ignore[dict-item]
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.benchmarks.limits_cost")
    ap.add_argument("--requests", type=int, default=2000, help="measured requests per run")
    ap.add_argument("--reps", type=int, default=3, help="runs of each, alternating")
    args = ap.parse_args(argv)
    print(json.dumps(asyncio.run(_run(args.requests, args.reps))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
