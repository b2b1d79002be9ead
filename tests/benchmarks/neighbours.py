"""A small request beside each heavy neighbour: figures, not asserts.

    python -m tests.benchmarks.neighbours [--batch-requests 20000] [--only WORD]

For each neighbour this starts the load, and meanwhile probes ``/health`` and sends a small
buffered request (``count_tokens``, or a Messages request where the neighbour is a reply),
each every 20 ms from its own thread, until the load's replies are in. It prints the worst
and median latency of both (a stall of the event loop shows in them whole), the gateway's
peak RSS, and the loads' statuses. Neighbours (``--only``: those whose name holds WORD),
after a baseline row with none:

* 4 x 30 MiB prompts at once (count_tokens: decoded, validated, counted), on a route of
  the stub (an estimate) and on a llama.cpp route of ``stub_fast.py`` (``/apply-template``,
  then ``/tokenize``);
* 4 x 32 MiB ``[[],[],...]`` bodies at once (refused past the value bound);
* one batch create of ``--batch-requests`` requests (20,000 by default);
* replies of 20 tool calls of 250 KiB broken arguments each (JSON-escaped code cut off),
  one buffered and one streamed at once (every call's arguments need a repair);
* 2 fast streams of 20,000 tiny deltas each, every one in a single write (thousands of
  events per read).

The last two come from ``stub_fast.py`` (``tools:CALLS:KIB``, ``bench:N:0``).

On a busy machine the figures grow; compare runs on one machine, before and after a change.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import stub_config
from tests.procs import REPO, Proc, free_port, peak_rss_mb, start_gateway, wait_http
from tests.route_bodies import ROUTES, hostile_body, route_body

_SMALL = (ROUTES["count_tokens"][0], route_body("count_tokens", b'"hello there"'))
_SMALL_MESSAGE = (ROUTES["messages"][0], route_body("messages", b'"hello there"'))
_TOOLS = {
    "tools": [
        {
            "name": "write",
            "description": "Write a file",
            "input_schema": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            },
        }
    ]
}
_MIB = 2**20


def _prompt(size: int) -> bytes:
    """A count_tokens body of ``size`` bytes: a prompt of code (escaped quotes and newlines)."""
    line = 'def f(x):\n    return x * 2  # a line of code, "quoted"\n'
    encoded = len(json.dumps(line)) - 2
    text = line * ((size - 300) // encoded)
    return route_body("count_tokens", json.dumps(text).encode())


def _batch(n: int) -> bytes:
    params = json.loads(route_body("messages"))
    return json.dumps(
        {"requests": [{"custom_id": f"r{i}", "params": params} for i in range(n)]}
    ).encode()


def _reply(model: str, stream: bool) -> bytes:
    return json.dumps(
        {
            "model": model,
            "max_tokens": 64,
            "stream": stream,
            **_TOOLS,
            "messages": [{"role": "user", "content": "write it"}],
        }
    ).encode()


def _post(port: int, path: str, body: bytes, timeout: float = 120) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(
            "POST",
            "/llm" + path,
            body=body,
            headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01"},
        )
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _probe(
    port: int, stop: threading.Event, small: tuple[str, bytes] | None, out: list[float]
) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            if small is not None:
                _post(port, *small, timeout=30)
            else:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request("GET", "/health")
                conn.getresponse().read()
                conn.close()
        except OSError:
            pass
        out.append(time.perf_counter() - t0)
        time.sleep(0.02)


def _run(
    port: int, jobs: list[tuple[str, bytes]], request: tuple[str, bytes]
) -> tuple[list[int], list[float], list[float], float]:
    health: list[float] = []
    small: list[float] = []
    stop = threading.Event()
    probes = [
        threading.Thread(target=_probe, args=(port, stop, None, health)),
        threading.Thread(target=_probe, args=(port, stop, request, small)),
    ]
    # no collection in this process while it measures: building a 20,000-request body left
    # it full collections of 0.26-0.49 s, which the probes' threads waited out and reported
    gc.collect()
    gc.disable()
    for p in probes:
        p.start()
    time.sleep(0.2)
    statuses: list[int] = []
    t0 = time.perf_counter()
    senders = [
        threading.Thread(target=lambda p=p, b=b: statuses.append(_post(port, p, b)))
        for p, b in jobs
    ]
    for s in senders:
        s.start()
    for s in senders:
        s.join(180)
    if not jobs:  # the baseline: the probes alone, as long as a short neighbour lasts
        time.sleep(3)
    elapsed = time.perf_counter() - t0
    time.sleep(0.2)
    stop.set()
    for p in probes:
        p.join(60)
    gc.enable()
    return sorted(statuses), health, small, elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-requests", type=int, default=20_000)
    ap.add_argument("--only", default="", help="run the neighbours whose name holds this")
    args = ap.parse_args()
    port = free_port()
    fast_port = free_port()
    stub = Proc([sys.executable, str(REPO / "tests" / "stub_upstream.py"), str(port)])
    fast = Proc([sys.executable, "-m", "tests.benchmarks.stub_fast", str(fast_port)])
    gateway = None
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc=stub.popen)
        wait_http(f"http://127.0.0.1:{fast_port}/health", proc=fast.popen)
        with tempfile.TemporaryDirectory() as tmp:
            config = stub_config(f"http://127.0.0.1:{port}/v1", models=("ok",)) + (
                f'\n[upstreams.fast]\nbase_url = "http://127.0.0.1:{fast_port}/v1"\n'
                "header_timeout = 30\nidle_timeout = 30\n"
                '\n[[models]]\nname = "m-tools"\nupstream = "fast"\n'
                'upstream_model = "tools:20:250"\n'
                '\n[[models]]\nname = "m-tiny"\nupstream = "fast"\n'
                'upstream_model = "bench:20000:0"\n'
                f'\n[upstreams.llama]\nbase_url = "http://127.0.0.1:{fast_port}/v1"\n'
                'kind = "llamacpp"\nheader_timeout = 30\nidle_timeout = 30\n'
                '\n[[models]]\nname = "m-llama"\nupstream = "llama"\nupstream_model = "llama"\n'
                f"\n[batches]\ndatabase = {json.dumps(str(Path(tmp) / 'b.sqlite3'))}\n"
                f"max_requests = {max(args.batch_requests, 100_000)}\n"
                "max_body_bytes = 268435456\n"
            )
            gateway, url = start_gateway(config, Path(tmp))
            gport = int(url.rsplit(":", 1)[1])
            messages = ROUTES["messages"][0]
            loads: dict[str, tuple[Callable[[], list[tuple[str, bytes]]], tuple[str, bytes]]] = {
                "none (the probes alone, 3 s; small request: messages)": (
                    lambda: [],
                    _SMALL_MESSAGE,
                ),
                "4 x 30 MiB prompts (count_tokens)": (
                    lambda: [(ROUTES["count_tokens"][0], _prompt(30 * _MIB))] * 4,
                    _SMALL,
                ),
                "4 x 30 MiB prompts (count_tokens, llama.cpp)": (
                    lambda: (
                        [
                            (
                                ROUTES["count_tokens"][0],
                                _prompt(30 * _MIB).replace(b'"m-ok"', b'"m-llama"', 1),
                            )
                        ]
                        * 4
                    ),
                    _SMALL,
                ),
                "4 x 32 MiB [[],[],...] bodies": (
                    lambda: [
                        (ROUTES[r][0], hostile_body(r))
                        for r in ("messages", "count_tokens", "chat", "embeddings")
                    ],
                    _SMALL,
                ),
                f"a {args.batch_requests:,}-request batch create": (
                    lambda: [("/v1/messages/batches", _batch(args.batch_requests))],
                    _SMALL,
                ),
                "2 replies of 20 x 250 KiB broken tool calls (buffered, streamed)": (
                    lambda: [
                        (messages, _reply("m-tools", False)),
                        (messages, _reply("m-tools", True)),
                    ],
                    _SMALL_MESSAGE,
                ),
                "2 fast streams of 20,000 tiny deltas": (
                    lambda: [(messages, _reply("m-tiny", True))] * 2,
                    _SMALL_MESSAGE,
                ),
            }
            print(
                "| neighbour | its replies | s | /health max / median ms "
                "| small request max / median ms | peak RSS MiB |"
            )
            print("| --- | --- | --- | --- | --- | --- |")
            for name, (jobs, request) in loads.items():
                if args.only not in name:
                    continue
                statuses, health, small, elapsed = _run(gport, jobs(), request)
                print(
                    f"| {name} | {statuses} | {elapsed:.2f} "
                    f"| {max(health) * 1000:.0f} / {statistics.median(health) * 1000:.0f} "
                    f"| {max(small) * 1000:.0f} / {statistics.median(small) * 1000:.0f} "
                    f"| {peak_rss_mb(gateway.pid):.0f} |",
                    flush=True,
                )
            gateway.stop()
            gateway = None
    finally:
        if gateway is not None:
            gateway.stop()
        fast.stop()
        stub.stop()


if __name__ == "__main__":
    main()
