"""Message Batches benchmark: does a large batch leave interactive traffic alone, and how
fast does a batch run when nothing else does?

    python -m tests.benchmarks.batches [--tiny] [--json out.json]

The upstream is ``tests/benchmarks/stub_fast.py --slots N --prefill-ms P``: like a real
inference server it serves at most N completions at once (the rest wait for a slot), each
holding its slot for the prefill plus its chunks' pacing. The gateway runs with the
``[batches]`` defaults (``max_in_flight = 2``, ``interactive_threshold = 1``) on a SQLite
file in a temporary directory. Phases, in this order:

1. ``full``: the upstream's own throughput, N x 2 connections in a closed loop straight to
   the stub (buffered completions): what "ratio to the upstream's capacity" divides by.
2. ``alone``: interactive load, streamed ``/v1/messages`` at a fixed rate (open loop, a
   connection each; ``--poisson``: exponential gaps of the same mean), after a 2 s warm-up
   not counted; time to first token = the first ``content_block_delta`` byte.
3. a batch of ``--batch`` requests (the same model, buffered) is created; ``with_batch``:
   the same interactive load while the batch runs. The batch must still be running at the
   end (it is checked), so the whole phase had batch work beside it.
4. ``batch_only``: nothing interactive; the batch's throughput over a window, as completed
   slots on the stub, and as a ratio to ``full``.
5. the batch is canceled; ``alone_again``: the interactive load once more (the baseline is
   both ``alone`` phases pooled, so drift over the run counts against neither side).

Loopback only, bounded (every phase has a fixed length), and every process started here is
ended here by PID. With two or more cores the gateway runs on core 1, the stub and this
driver on core 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from gateway.text import jsonutil
from tests.benchmarks import driver, run

HOST = run.HOST
PREFIX = "/llm"
MODEL_CHUNKS = 16

# slots, prefill ms, chunk ms, interactive rate (/s), phase seconds, batch size, window s
MODES: dict[str, dict[str, Any]] = {
    "full": {
        "slots": 4,
        "prefill_ms": 20,
        "chunk_ms": 5,
        "rate": 5.0,
        "phase_s": 40.0,
        "batch": 2000,
        "window_s": 15.0,
        "full_s": 5.0,
        # an idle upstream takes as many batch requests as it has slots
        "max_in_flight_idle": 4,
        "idle_after": 2.0,
    },
    "tiny": {
        "slots": 4,
        "prefill_ms": 5,
        "chunk_ms": 1,
        "rate": 10.0,
        "phase_s": 1.5,
        "batch": 400,
        "window_s": 1.0,
        "full_s": 1.0,
        "max_in_flight_idle": 4,
        "idle_after": 0.5,
    },
}


def _config(
    stub_url: str,
    model: str,
    database: str,
    max_in_flight: int = 2,
    max_in_flight_idle: int = 0,
    idle_after: float = 10.0,
) -> str:
    return f"""
[server]
host = "{HOST}"
prefix = "{PREFIX}"
log_level = "warning"

[upstreams.stub]
base_url = "{stub_url}"
kind = "vllm"

[[models]]
name = "{model}"
upstream = "stub"
upstream_model = "{model}"

[batches]
database = "sqlite:///{database}"
max_in_flight = {max_in_flight}
max_in_flight_idle = {max_in_flight_idle}
idle_after = {idle_after}
"""


def _http(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else jsonutil.dumpb(body)
    req = urllib.request.Request(
        url,
        data=data,
        method=method,
        headers={"content-type": "application/json", "anthropic-version": "2023-06-01"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def _messages(model: str, stream: bool) -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": 256,
        "stream": stream,
        "messages": [{"role": "user", "content": "Say hello to the benchmark."}],
    }


def _pct(values: list[float], q: float) -> float:
    return run._pct(values, q)


async def _interactive(
    port: int, raw: bytes, rate: float, seconds: float, poisson: bool = False
) -> dict[str, Any]:
    """Streams started at a fixed rate (open loop), each on its own connection: evenly
    spaced, or (``poisson``) at exponential gaps of the same mean, seeded."""
    rng = random.Random(1)
    results: list[driver.Result] = []

    async def one(started: float) -> None:
        conn = await driver._connect(HOST, port)
        try:
            res = await conn.send(raw, b"content_block_delta", b"message_stop")
            res.start = started  # connect included: a client's real wait
            results.append(res)
        finally:
            driver._close(conn)

    count = max(1, round(rate * seconds))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    tasks = []
    at = 0.0
    for _ in range(count):
        await asyncio.sleep(max(0.0, t0 + at - loop.time()))
        at += rng.expovariate(rate) if poisson else 1 / rate
        tasks.append(asyncio.create_task(one(time.perf_counter())))
    await asyncio.wait_for(asyncio.gather(*tasks), seconds + 60)
    ttft = [r.ttft * 1000 for r in results if r.complete]
    return {
        "requests": count,
        "ok": len(ttft),
        "ttft_p50_ms": _pct(ttft, 0.50),
        "ttft_p99_ms": _pct(ttft, 0.99),
        "ttft": ttft,
    }


async def _load(port: int, raw: bytes, mode: dict[str, Any]) -> dict[str, Any]:
    return await _interactive(port, raw, mode["rate"], mode["phase_s"], mode["poisson"])


def _served(stub_port: int) -> int:
    return int(run._get_json(f"http://{HOST}:{stub_port}/_slots")["served"])


async def _full(stub_port: int, model: str, slots: int, seconds: float) -> float:
    """Completions per second the stub serves at most (buffered, 2 x slots connections)."""
    raw = driver.build_request(
        HOST, stub_port, "/v1/chat/completions", jsonutil.dumpb(_messages(model, False))
    )
    conns = await asyncio.gather(*(driver._connect(HOST, stub_port) for _ in range(slots * 2)))
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(conn: driver._Conn) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            res = await conn.send(raw, b"", b"")
            done += res.status == 200

    t = time.perf_counter()
    try:
        await asyncio.gather(*(worker(c) for c in conns))
    finally:
        for c in conns:
            driver._close(c)
    return done / (time.perf_counter() - t)


def _batch_status(base: str, batch_id: str) -> str:
    return str(_http("GET", f"{base}/v1/messages/batches/{batch_id}")["processing_status"])


async def bench(mode: dict[str, Any]) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="llm-gateway-batches-bench-"))
    pin = (os.cpu_count() or 1) >= 2 and bool(run._which("taskset"))
    if pin:
        os.sched_setaffinity(0, {0})
    model = f"bench:{MODEL_CHUNKS}:{mode['chunk_ms']}"
    stub_port, port = run.free_port(), run.free_port()
    procs: list[run.Proc] = []
    try:
        procs.append(
            run.Proc(
                "stub",
                [
                    sys.executable,
                    "-m",
                    "tests.benchmarks.stub_fast",
                    str(stub_port),
                    "--slots",
                    str(mode["slots"]),
                    "--prefill-ms",
                    str(mode["prefill_ms"]),
                ],
                core=0 if pin else None,
                logdir=tmp,
                health=f"http://{HOST}:{stub_port}/health",
            )
        )
        cfg = tmp / "gateway.toml"
        cfg.write_text(
            _config(
                f"http://{HOST}:{stub_port}/v1",
                model,
                str(tmp / "b.sqlite3"),
                mode.get("max_in_flight", 2),
                mode.get("max_in_flight_idle", 0),
                mode.get("idle_after", 10.0),
            )
        )
        procs.append(
            run.Proc(
                "gateway",
                [sys.executable, "-m", "gateway", "--config", str(cfg), "--port", str(port)],
                core=1 if pin else None,
                logdir=tmp,
                health=f"http://{HOST}:{port}/health",
            )
        )
        base = f"http://{HOST}:{port}{PREFIX}"
        raw = driver.build_request(
            HOST,
            port,
            PREFIX + "/v1/messages",
            jsonutil.dumpb(_messages(model, True)),
            {"anthropic-version": "2023-06-01"},
        )
        r: dict[str, Any] = {"mode": {k: mode[k] for k in mode}, "model": model, "pinned": pin}

        full = await _full(stub_port, model, mode["slots"], mode["full_s"])
        r["full_rps"] = full
        await _interactive(port, raw, mode["rate"], 2.0)  # warm-up, not counted
        r["alone"] = await _load(port, raw, mode)

        params = _messages(model, False)
        del params["stream"]
        batch = _http(
            "POST",
            f"{base}/v1/messages/batches",
            {"requests": [{"custom_id": f"r{i}", "params": params} for i in range(mode["batch"])]},
        )
        await asyncio.sleep(1.0)  # the scheduler has claimed its first requests
        served0 = _served(stub_port)
        r["with_batch"] = await _load(port, raw, mode)
        r["with_batch"]["batch_served"] = _served(stub_port) - served0 - r["with_batch"]["requests"]
        r["with_batch"]["batch_rps"] = r["with_batch"]["batch_served"] / mode["phase_s"]
        r["with_batch"]["batch_running_after"] = _batch_status(base, batch["id"]) == "in_progress"

        if mode.get("max_in_flight_idle"):  # the upstream counts as idle from here on
            await asyncio.sleep(mode.get("idle_after", 10.0) + 0.5)
        s0, t0 = _served(stub_port), time.perf_counter()
        await asyncio.sleep(mode["window_s"])
        s1, t1 = _served(stub_port), time.perf_counter()
        batch_rps = (s1 - s0) / (t1 - t0)
        r["batch_only"] = {
            "rps": batch_rps,
            "ratio_to_full": batch_rps / full,
            "batch_running_after": _batch_status(base, batch["id"]) == "in_progress",
        }

        _http("POST", f"{base}/v1/messages/batches/{batch['id']}/cancel", {})
        await asyncio.sleep(
            mode["prefill_ms"] / 1000 + MODEL_CHUNKS * mode["chunk_ms"] / 1000 + 0.5
        )  # the batch requests in flight end
        r["alone_again"] = await _load(port, raw, mode)

        baseline = r["alone"]["ttft"] + r["alone_again"]["ttft"]
        r["baseline"] = {"ttft_p50_ms": _pct(baseline, 0.50), "ttft_p99_ms": _pct(baseline, 0.99)}
        for q in ("p50", "p99"):
            r[f"ratio_{q}"] = r["with_batch"][f"ttft_{q}_ms"] / r["baseline"][f"ttft_{q}_ms"]
        for phase in ("alone", "with_batch", "alone_again"):
            del r[phase]["ttft"]
        return r
    finally:
        for proc in reversed(procs):
            proc.stop()


def table(r: dict[str, Any]) -> str:
    m = r["mode"]
    lines = [
        f"upstream: {m['slots']} slots, {m['prefill_ms']} ms prefill + {MODEL_CHUNKS} chunks x "
        f"{m['chunk_ms']} ms; interactive {m['rate']:g}/s "
        f"({'Poisson' if m['poisson'] else 'evenly spaced'}) streamed for {m['phase_s']:g} s a "
        f"phase; batch of {m['batch']}; batches.max_in_flight {m.get('max_in_flight', 2)}, "
        f"max_in_flight_idle {m.get('max_in_flight_idle', 0)}, idle_after "
        f"{m.get('idle_after', 10.0):g} s, interactive_threshold 1",
        "",
        "| phase | requests ok | TTFT p50 ms | TTFT p99 ms |",
        "| --- | --- | --- | --- |",
    ]
    for phase in ("alone", "alone_again", "with_batch"):
        x = r[phase]
        lines.append(
            f"| {phase} | {x['ok']}/{x['requests']} | {x['ttft_p50_ms']:.2f} | "
            f"{x['ttft_p99_ms']:.2f} |"
        )
    b = r["baseline"]
    lines.append(
        f"| baseline (both alone phases) | | {b['ttft_p50_ms']:.2f} | {b['ttft_p99_ms']:.2f} |"
    )
    lines += [
        "",
        "| target | value | limit | holds |",
        "| --- | --- | --- | --- |",
        f"| TTFT p50 with the batch / without | {r['ratio_p50']:.3f} | 1.10 | "
        f"{r['ratio_p50'] <= 1.10} |",
        f"| TTFT p99 with the batch / without | {r['ratio_p99']:.3f} | 1.10 | "
        f"{r['ratio_p99'] <= 1.10} |",
        "",
        f"batch requests served during the with_batch phase: {r['with_batch']['batch_served']} "
        f"= {r['with_batch']['batch_rps']:.1f}/s (batch still running after it: "
        f"{r['with_batch']['batch_running_after']})",
        f"upstream full throughput: {r['full_rps']:.1f} completions/s; batch alone: "
        f"{r['batch_only']['rps']:.1f}/s = {r['batch_only']['ratio_to_full']:.3f} of it "
        f"(still running after: {r['batch_only']['batch_running_after']})",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="seconds, not minutes (smoke test)")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--slots", type=int, help="the upstream's slots (default 4)")
    ap.add_argument(
        "--max-in-flight", type=int, help="batches.max_in_flight (default 2, the gateway's default)"
    )
    ap.add_argument(
        "--max-in-flight-idle",
        type=int,
        help="batches.max_in_flight_idle (default 0: as max_in_flight)",
    )
    ap.add_argument("--idle-after", type=float, help="batches.idle_after (default 10)")
    ap.add_argument(
        "--poisson",
        action="store_true",
        help="interactive arrivals at exponential gaps (default: evenly spaced)",
    )
    args = ap.parse_args(argv)
    mode = dict(MODES["tiny" if args.tiny else "full"])
    if args.slots:
        mode["slots"] = args.slots
        mode["max_in_flight_idle"] = args.slots
    mode["poisson"] = args.poisson
    if args.max_in_flight:
        mode["max_in_flight"] = args.max_in_flight
    if args.max_in_flight_idle is not None:
        mode["max_in_flight_idle"] = args.max_in_flight_idle
    if args.idle_after:
        mode["idle_after"] = args.idle_after
    r = asyncio.run(bench(mode))
    print(table(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
