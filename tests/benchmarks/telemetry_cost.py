"""The per-request cost of telemetry: c16 buffered Messages requests through one gateway
without ``[telemetry]``, then one with it (every trace sampled, or ``--sample-ratio``; spans
and metrics exported to the OTLP collector of tests/otlp_collector.py, in this process),
alternating; CPU of the gateway process per request (its exporter threads included), the
median of the runs, and the ratio (docs/telemetry.md, "Cost").

    PYTHONPATH=$PWD python3 -m tests.benchmarks.telemetry_cost [--requests N] [--reps R]
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
from tests.otlp_collector import Collector
from tests.procs import Proc, free_port, wait_http

MODEL = "bench:16:0"
BODY = (
    b'{"model":"' + MODEL.encode() + b'","max_tokens":64,'
    b'"messages":[{"role":"user","content":"hi"}]}'
)


def _config(stub: int, collector: str | None, ratio: float) -> str:
    telemetry = (
        f'[telemetry]\notlp_endpoint = "{collector}"\nexport_interval = 5\nsample_ratio = {ratio}\n'
        if collector
        else ""
    )
    text = f"""
[server]
host = "127.0.0.1"
log_level = "warning"
api_keys_env = "PLAIN_KEYS"

{telemetry}

[upstreams.stub]
base_url = "http://127.0.0.1:{stub}/v1"
kind = "vllm"

[[models]]
name = "{MODEL}"
upstream = "stub"
upstream_model = "{MODEL}"
"""
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
    ap.add_argument("--sample-ratio", type=float, default=1.0, help="[telemetry] sample_ratio")
    args = ap.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="telemetry-cost-"))
    collector = Collector()
    collector.start()
    stub_port = free_port()
    stub = Proc([sys.executable, "-m", "tests.benchmarks.stub_fast", str(stub_port)])
    procs = [stub]
    wait_http(f"http://127.0.0.1:{stub_port}/health", timeout=30)
    try:
        env = {"PLAIN_KEYS": "k-alice", "XDG_STATE_HOME": str(folder / "state")}
        gateways = {}
        for name, url in (("without", None), ("with", collector.url)):
            port = free_port()
            cfg = folder / f"{name}.toml"
            cfg.write_text(_config(stub_port, url, args.sample_ratio))
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
            print(f"{k} telemetry: CPU µs/request {each}; median {med[k]:.1f}")
        print(f"ratio with/without: {med['with'] / med['without']:.3f}")
        print(f"spans received: {len(collector.spans())}")
    finally:
        for p in reversed(procs):
            p.stop()
        collector.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
