"""A small request beside each heavy neighbour: figures, not asserts.

    python -m tests.benchmarks.neighbours [--batch-requests 20000]

For each neighbour this starts the load, and meanwhile probes ``/health`` and sends a small
buffered ``count_tokens`` request, each every 20 ms from its own thread, until the load's
replies are in. It prints the worst and median latency of both (a stall of the event loop
shows in them whole), the gateway's peak RSS, and the loads' statuses. Neighbours:

* 4 x 30 MiB prompts at once (count_tokens: decoded, validated, counted);
* 4 x 32 MiB ``[[],[],...]`` bodies at once (refused past the value bound);
* one batch create of ``--batch-requests`` requests (20,000 by default).

On a busy machine the figures grow; compare runs on one machine, before and after a change.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.conftest import stub_config
from tests.e2e.test_hostile_input import ROUTES, _body, _hostile_body, _peak_rss_mb
from tests.procs import REPO, Proc, free_port, start_gateway, wait_http

_SMALL = _body("count_tokens", b'"hello there"')
_MIB = 2**20


def _prompt(size: int) -> bytes:
    """A count_tokens body of ``size`` bytes: a prompt of code (escaped quotes and newlines)."""
    line = "def f(x):\n    return x * 2  # a line of code, \"quoted\"\n"
    encoded = len(json.dumps(line)) - 2
    text = line * ((size - 300) // encoded)
    return _body("count_tokens", json.dumps(text).encode())


def _batch(n: int) -> bytes:
    params = json.loads(_body("messages"))
    return json.dumps({"requests": [{"custom_id": f"r{i}", "params": params}
                                    for i in range(n)]}).encode()


def _post(port: int, path: str, body: bytes, timeout: float = 120) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/llm" + path, body=body,
                     headers={"Content-Type": "application/json",
                              "anthropic-version": "2023-06-01"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _probe(port: int, stop: threading.Event, small: bool, out: list[float]) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            if small:
                _post(port, ROUTES["count_tokens"][0], _SMALL, timeout=30)
            else:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request("GET", "/health")
                conn.getresponse().read()
                conn.close()
        except OSError:
            pass
        out.append(time.perf_counter() - t0)
        time.sleep(0.02)


def _run(port: int, jobs: list[tuple[str, bytes]]) -> tuple[list[int], list[float],
                                                            list[float], float]:
    health: list[float] = []
    small: list[float] = []
    stop = threading.Event()
    probes = [threading.Thread(target=_probe, args=(port, stop, False, health)),
              threading.Thread(target=_probe, args=(port, stop, True, small))]
    for p in probes:
        p.start()
    time.sleep(0.2)
    statuses: list[int] = []
    t0 = time.perf_counter()
    senders = [threading.Thread(target=lambda p=p, b=b: statuses.append(_post(port, p, b)))
               for p, b in jobs]
    for s in senders:
        s.start()
    for s in senders:
        s.join(180)
    elapsed = time.perf_counter() - t0
    time.sleep(0.2)
    stop.set()
    for p in probes:
        p.join(60)
    return sorted(statuses), health, small, elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-requests", type=int, default=20_000)
    args = ap.parse_args()
    port = free_port()
    stub = Proc([sys.executable, str(REPO / "tests" / "stub_upstream.py"), str(port)])
    gateway = None
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc=stub.popen)
        with tempfile.TemporaryDirectory() as tmp:
            config = stub_config(f"http://127.0.0.1:{port}/v1", models=("ok",)) + (
                f"\n[batches]\ndatabase = {json.dumps(str(Path(tmp) / 'b.sqlite3'))}\n"
                f"max_requests = {max(args.batch_requests, 100_000)}\n"
                "max_body_bytes = 268435456\n")
            gateway, url = start_gateway(config, Path(tmp))
            gport = int(url.rsplit(":", 1)[1])
            loads = {
                "4 x 30 MiB prompts (count_tokens)":
                    [(ROUTES["count_tokens"][0], _prompt(30 * _MIB))] * 4,
                "4 x 32 MiB [[],[],...] bodies":
                    [(ROUTES[r][0], _hostile_body(r))
                     for r in ("messages", "count_tokens", "chat", "embeddings")],
                f"a {args.batch_requests:,}-request batch create":
                    [("/v1/messages/batches", _batch(args.batch_requests))],
            }
            print("| neighbour | its replies | s | /health max / median ms "
                  "| small request max / median ms | peak RSS MiB |")
            print("| --- | --- | --- | --- | --- | --- |")
            for name, jobs in loads.items():
                statuses, health, small, elapsed = _run(gport, jobs)
                print(f"| {name} | {statuses} | {elapsed:.2f} "
                      f"| {max(health) * 1000:.0f} / {statistics.median(health) * 1000:.0f} "
                      f"| {max(small) * 1000:.0f} / {statistics.median(small) * 1000:.0f} "
                      f"| {_peak_rss_mb(gateway.pid):.0f} |", flush=True)
            gateway.stop()
            gateway = None
    finally:
        if gateway is not None:
            gateway.stop()
        stub.stop()


if __name__ == "__main__":
    main()
