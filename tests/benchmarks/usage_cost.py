"""The per-request cost of per-client usage: c16 buffered Messages requests through one
gateway without clients, then one with two ``[[clients]]`` and an admin key (each reply's
usage added to the in-memory rows written every 5 s, and the per-client series counted),
alternating; CPU of the gateway process per request, the median of the runs, and the ratio.

    PYTHONPATH=$PWD python3 -m tests.benchmarks.usage_cost [--requests N] [--reps R]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

from tests.benchmarks import driver
from tests.benchmarks.run import cpu_seconds
from tests.procs import Proc, free_port, wait_http

MODEL = "bench:16:0"
BODY = (
    b'{"model":"' + MODEL.encode() + b'","max_tokens":64,'
    b'"messages":[{"role":"user","content":"hi"}]}'
)


def _config(stub: int, clients: bool) -> str:
    text = f"""
[server]
host = "127.0.0.1"
log_level = "warning"
{'admin_keys_env = "ADMIN_KEYS"' if clients else 'api_keys_env = "PLAIN_KEYS"'}

[upstreams.stub]
base_url = "http://127.0.0.1:{stub}/v1"
kind = "vllm"

[[models]]
name = "{MODEL}"
upstream = "stub"
upstream_model = "{MODEL}"
"""
    if clients:
        text += '\n[[clients]]\nname = "alice"\nkey_env = "ALICE_KEY"\n'
        text += '\n[[clients]]\nname = "bob"\nkey_env = "BOB_KEY"\n'
    return text


async def _run(port: int, requests: int, pid: int) -> float:
    key = {"x-api-key": "k-alice"}
    raw = driver.build_request("127.0.0.1", port, "/llm/v1/messages", BODY, key)
    await driver.closed_loop("127.0.0.1", port, raw, concurrency=16, requests=200)  # warm
    before = cpu_seconds(pid)
    result = await driver.closed_loop(
        "127.0.0.1", port, raw, concurrency=16, requests=requests, terminal=b'"usage"'
    )
    ok = sum(1 for r in result.results if r.status == 200)
    assert ok == requests, f"{ok} of {requests} answered 200"
    return (cpu_seconds(pid) - before) / requests * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="usage-cost-"))
    stub_port = free_port()
    stub = Proc([sys.executable, "-m", "tests.benchmarks.stub_fast", str(stub_port)])
    procs = [stub]
    wait_http(f"http://127.0.0.1:{stub_port}/health", timeout=30)
    try:
        env = {
            "PLAIN_KEYS": "k-alice",
            "ALICE_KEY": "k-alice",
            "BOB_KEY": "k-bob",
            "ADMIN_KEYS": "k-admin",
            "XDG_STATE_HOME": str(folder / "state"),
        }
        gateways = {}
        for name, clients in (("without", False), ("with", True)):
            port = free_port()
            cfg = folder / f"{name}.toml"
            cfg.write_text(_config(stub_port, clients))
            proc = Proc(
                [sys.executable, "-m", "gateway", "--config", str(cfg), "--port", str(port)],
                env=env,
            )
            procs.append(proc)
            wait_http(f"http://127.0.0.1:{port}/health", timeout=30)
            gateways[name] = (port, proc.pid)
        runs: dict[str, list[float]] = {"without": [], "with": []}
        for rep in range(args.reps):
            order = ["without", "with"] if rep % 2 == 0 else ["with", "without"]
            for name in order:
                port, pid = gateways[name]
                runs[name].append(asyncio.run(_run(port, args.requests, pid)))
        med = {k: statistics.median(v) for k, v in runs.items()}
        for k, v in runs.items():
            each = ", ".join(f"{x:.1f}" for x in v)
            print(f"{k} clients: CPU µs/request {each}; median {med[k]:.1f}")
        print(f"ratio with/without: {med['with'] / med['without']:.3f}")
    finally:
        for p in reversed(procs):
            p.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
