"""The per-request cost of a client's limits: c16 buffered Messages requests through the
gateway, its CPU per request with the benchmark's key as a plain key (``server.api_keys_env``:
no limits, what every gateway without ``[[clients]]`` pays) and as a client's with every
limit set (rpm, input, output and day tokens, max_concurrency; in-process counters), set
high enough never to refuse, and with ``--redis`` the same client's counters in a real
redis-server (``[limits] redis_url_env``; the server's own CPU reported apart). Runs
alternate, medians are compared::

    PYTHONPATH=$PWD python -m tests.benchmarks.limits_cost [--requests N] [--reps R] [--redis]

Prints one JSON object: CPU µs per request of each and their ratios to the plain key.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys

from tests.benchmarks import driver
from tests.benchmarks.run import API_KEY, HOST, Bench, measured

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
    res, cpu = await measured(
        bench, "gateway", driver.closed_loop(HOST, port, raw, concurrency=16, requests=requests)
    )
    if res.ok != len(res.results):
        raise SystemExit(f"{len(res.results) - res.ok} requests failed")
    return cpu / len(res.results) * 1e6


def _process_cpu(pid: int) -> float:
    """A process's user + system CPU seconds so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pid(server: object) -> int:
    proc = getattr(server, "proc", None)
    assert proc is not None
    return int(proc.pid)


async def _run(requests: int, reps: int, redis: bool) -> dict[str, object]:
    os.environ["BENCH_CLIENT_KEY"] = API_KEY  # the gateway processes inherit it
    bench = Bench("quick")
    plain_cfg = bench.cfg.read_text()
    # the same key, now a client's (and no longer in api_keys_env: one client per key)
    limited_cfg = plain_cfg.replace('api_keys_env = "BENCH_GATEWAY_KEYS"\n', "") + LIMITED
    configs = [("plain", plain_cfg), ("limited", limited_cfg)]
    with contextlib.ExitStack() as stack:
        server = None
        if redis:
            from tests.redis_server import running_redis

            server = stack.enter_context(running_redis())
            os.environ["BENCH_REDIS_URL"] = server.url
            shared = '\n[limits]\nredis_url_env = "BENCH_REDIS_URL"\nstore_timeout = 2\n'
            configs.append(("redis", limited_cfg + shared))
        cpu: dict[str, list[float]] = {name: [] for name, _ in configs}
        redis_cpu: list[float] = []
        try:
            for _ in range(reps):
                for name, text in configs:
                    bench.cfg.write_text(text)
                    bench.restart("gateway")
                    before = _process_cpu(_pid(server)) if server and name == "redis" else 0.0
                    cpu[name].append(await _cpu_per_request(bench, requests))
                    if server and name == "redis":
                        # the warm-up's requests too: requests + requests // 10
                        spent = _process_cpu(_pid(server)) - before
                        redis_cpu.append(spent / (requests + max(16, requests // 10)) * 1e6)
        finally:
            bench.close()
    plain = statistics.median(cpu["plain"])
    out: dict[str, object] = {"plain_cpu_us": round(plain, 1)}
    for name in cpu:
        if name != "plain":
            value = statistics.median(cpu[name])
            out[f"{name}_cpu_us"] = round(value, 1)
            out[f"{name}_ratio"] = round(value / plain, 3)
    if redis_cpu:
        out["redis_server_cpu_us"] = round(statistics.median(redis_cpu), 1)
    out["runs"] = cpu
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.benchmarks.limits_cost")
    ap.add_argument("--requests", type=int, default=2000, help="measured requests per run")
    ap.add_argument("--reps", type=int, default=3, help="runs of each, alternating")
    ap.add_argument(
        "--redis", action="store_true", help="also with the counters in a real redis-server"
    )
    args = ap.parse_args(argv)
    print(json.dumps(asyncio.run(_run(args.requests, args.reps, args.redis))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
