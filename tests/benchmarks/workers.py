"""Scale-out benchmark: many slow streams through ``llm-gateway --workers N`` on one port.

    python -m tests.benchmarks.workers [--streams 5000] [--workers 2] [--chunks 20]
                                       [--interval-ms 1000] [--json out.json]

Starts the fast stub and a gateway with ``--workers N`` (SO_REUSEPORT), opens every
stream at once (Anthropic streaming), and reports how many completed with
``message_stop``, how many on time (< 1 s after the stub's last chunk), the
gateway's total RSS over its workers, upstream streams left open afterwards,
and that ``/metrics`` (any worker) counts every stream. The default pacing is a
chunk a second: 5,000 streams x 10 chunks/s would be 50,000 chunks/s, more than
this project's 2-core machine can move with the stub and the driver beside the
gateway. Loopback only; every process is ended by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.benchmarks import driver, run


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        return []


def _completed_metric(url: str) -> float:
    # keys are set, and /metrics on the API listener asks for one then
    req = urllib.request.Request(url + "/metrics", headers={"x-api-key": run.API_KEY})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("llm_gateway_stream_terminations_total{")
        and 'reason="completed"' in line
        and 'api="messages"' in line
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--interval-ms", type=int, default=1000)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="llm-gateway-workers-"))
    model = f"bench:{args.chunks}:{args.interval_ms}"
    stub_port, port = run.free_port(), run.free_port()
    try:
        run.Proc(
            "stub",
            [sys.executable, "-m", "tests.benchmarks.stub_fast", str(stub_port)],
            core=None,
            logdir=tmp,
            health=f"http://{run.HOST}:{stub_port}/health",
        )
        cfg = tmp / "gateway.toml"
        cfg.write_text(run._gateway_config(f"http://{run.HOST}:{stub_port}/v1", [model]))
        gw = run.Proc(
            "gateway",
            [
                sys.executable,
                "-m",
                "gateway",
                "--config",
                str(cfg),
                "--port",
                str(port),
                "--workers",
                str(args.workers),
            ],
            core=None,
            logdir=tmp,
            env={"BENCH_GATEWAY_KEYS": run.API_KEY},
            health=f"http://{run.HOST}:{port}/health",
        )
        body = json.dumps(
            {
                "model": model,
                "max_tokens": 1024,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            }
        ).encode()
        raw = driver.build_request(
            run.HOST, port, run.PREFIX + "/v1/messages", body, {"x-api-key": run.API_KEY}
        )
        expected = (args.chunks - 1) * args.interval_ms / 1000
        idle = sum(run.rss_bytes(p) for p in _children(gw.pid))
        peaks: list[int] = [idle]

        async def go() -> driver.LoadResult:
            stop = asyncio.Event()

            async def sample() -> None:
                while not stop.is_set():
                    peaks.append(sum(run.rss_bytes(p) for p in _children(gw.pid)))
                    await asyncio.sleep(0.5)

            sampler = asyncio.create_task(sample())
            res = await driver.streams_at_once(
                run.HOST,
                port,
                raw,
                count=args.streams,
                marker=b"content_block_delta",
                terminal=b"message_stop",
                within=expected + 30,
            )
            stop.set()
            await sampler
            return res

        res = asyncio.run(go())
        # streams the driver gave up on are hung up at its deadline: give the gateway a
        # bounded moment to see the hang-ups and close their upstream requests
        stats = f"http://{run.HOST}:{stub_port}/_stats"
        open_at_end = run._get_json(stats)["open"]
        deadline = time.monotonic() + 10
        while run._get_json(stats)["open"] and time.monotonic() < deadline:
            time.sleep(0.2)
        late = [r.latency - expected for r in res.results if r.complete]
        out = {
            "streams": args.streams,
            "workers": args.workers,
            "chunks": args.chunks,
            "interval_ms": args.interval_ms,
            "completed": res.ok,
            "on_time": sum(1 for x in late if x < 1.0),
            "gateway_idle_rss_mb": idle / 2**20,
            "gateway_peak_rss_mb": max(peaks) / 2**20,
            "kb_per_stream": (max(peaks) - idle) / args.streams / 1024,
            "upstream_open_at_end": open_at_end,
            "upstream_open_after": run._get_json(stats)["open"],
            "metrics_completed": _completed_metric(f"http://{run.HOST}:{port}"),
            "worker_pids": _children(gw.pid),
        }
    finally:
        for proc in list(run._PROCS):
            proc.stop()
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    ok = out["completed"] == args.streams and out["upstream_open_after"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
