"""The upstream client alone: CPU per request and per stream event, in this process.

    python -m tests.benchmarks.client [--reps N] [--requests N]     # over loopback sockets
    python -m tests.benchmarks.client --in-process                  # no sockets at all

The full benchmark (run.py) measures the whole gateway; this one measures only
``gateway.upstream.UpstreamClient`` answered by the fast stub's bytes (``stub_fast.py``), so
a change to the client shows without the noise of the rest. Figures are the CPU time of
this process (``time.process_time``) divided by the requests or SSE events, median over
``--reps``:

* buffered c1 / c16: ``request()`` then ``read()``, one or sixteen at a time;
* stream bulk: 256 delta chunks written by the stub at once, read with ``chunks()``;
* stream paced (sockets) / a read per event (in process): chunks arrive one at a time.

Over sockets the stub runs as its own process (with two or more cores this process runs on
core 1, the stub on core 0); a send and a receive are a good part of each request, and the
machine's noise with them. ``--in-process`` gives each connection a fake transport that
answers every request with the stub's reply at once: what is left is the client's own
Python, to a fraction of a microsecond.

It runs unchanged against the client before issue 15's rewrite (``gateway/httpclient.py``),
for a before/after: ``git archive <commit> | tar -x -C DIR``, copy this file into
``DIR/tests/benchmarks/`` and run it there.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.ops.config import UpstreamConfig
from gateway.upstream import UpstreamClient
from tests.benchmarks.run import Proc, free_port
from tests.benchmarks.stub_fast import Scenario


def _body(model: str, stream: bool) -> bytes:
    return b'{"model":"%s","stream":%s,"messages":[{"role":"user","content":"hi"}]}' % (
        model.encode(),
        b"true" if stream else b"false",
    )


def _extra(client: UpstreamClient) -> dict[str, str]:
    """What the gateway passes besides (a request id, sent as X-Request-Id), where the
    client under test takes it."""
    if "request_id" in inspect.signature(client.request).parameters:
        return {"request_id": "req_0123456789abcdefghijklmn"}
    return {}


async def _buffered(client: UpstreamClient, n: int, conc: int) -> float:
    body = _body("bench", False)
    extra = _extra(client)

    async def one(k: int) -> None:
        for _ in range(k):
            up = await client.request("/chat/completions", body, stream=False, **extra)
            async with up:
                await up.read()

    t = time.process_time()
    await asyncio.gather(*(one(n // conc) for _ in range(conc)))
    return (time.process_time() - t) / (n // conc * conc) * 1e6


async def _stream(client: UpstreamClient, model: str, streams: int, conc: int) -> float:
    body = _body(model, True)
    extra = _extra(client)
    events = 0

    async def one(k: int) -> None:
        nonlocal events
        for _ in range(k):
            up = await client.request("/chat/completions", body, stream=True, **extra)
            async with up:
                progress = getattr(up, "progress", None)
                async for chunk in up.chunks():
                    events += chunk.count(b"\n\n")  # SSE events, however they were read
                    if progress is not None:
                        progress()

    t = time.process_time()
    await asyncio.gather(*(one(streams // conc) for _ in range(conc)))
    return (time.process_time() - t) / events * 1e6


Shape = Callable[[], Awaitable[float]]


async def _measure(client: UpstreamClient, shapes: dict[str, Shape], reps: int) -> dict[str, float]:
    out: dict[str, list[float]] = {name: [] for name in shapes}
    try:
        for shape in shapes.values():
            await shape()  # warm-up
        for _ in range(reps):
            for name, shape in shapes.items():
                out[name].append(await shape())
    finally:
        await client.close()
    return {name: statistics.median(values) for name, values in out.items()}


async def _over_sockets(url: str, reps: int, requests: int) -> dict[str, float]:
    client = UpstreamClient(UpstreamConfig(name="stub", base_url=url + "/v1"))
    await client.start()
    return await _measure(
        client,
        {
            "buffered c1: CPU µs/request": lambda: _buffered(client, requests, 1),
            "buffered c16: CPU µs/request": lambda: _buffered(client, requests, 16),
            "stream bulk: CPU µs/event": lambda: _stream(client, "bench:256:0", 200, 1),
            "stream paced: CPU µs/event": lambda: _stream(client, "bench:256:2", 32, 32),
        },
        reps,
    )


class _Answering:
    """A transport that answers each request with canned reads, on the next loop turn."""

    def __init__(self, conn: Any, replies: dict[bool, list[bytes]]) -> None:
        self._conn = conn
        self._replies = replies
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        stream = b'"stream":true' in data
        for piece in self._replies[stream]:
            self._loop.call_soon(self._conn.data_received, piece)

    def writelines(self, data: Any) -> None:
        self.write(b"".join(data))

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False


def _pool_module() -> Any:
    try:
        return importlib.import_module("gateway.upstream.pool")
    except ImportError:  # before issue 15: gateway/httpclient.py
        return importlib.import_module("gateway.httpclient")


async def _in_process(reps: int, requests: int) -> dict[str, float]:
    module = _pool_module()
    bulk, paced = Scenario("bench:256:0"), Scenario("bench:256:0")
    replies = {False: [bulk.buffered], True: [bulk.stream_bulk]}

    async def connect(pool: Any) -> Any:
        conn = module.Connection(pool)
        conn.connection_made(_Answering(conn, replies))
        pool._all.add(conn)
        return conn

    module.Pool._connect = connect
    client = UpstreamClient(UpstreamConfig(name="stub", base_url="http://127.0.0.1:1/v1"))
    await client.start()

    async def per_event() -> float:
        replies[True] = [paced.stream_head, *paced.stream_events]
        try:
            return await _stream(client, "bench", 64, 16)
        finally:
            replies[True] = [bulk.stream_bulk]

    return await _measure(
        client,
        {
            "buffered c1: CPU µs/request": lambda: _buffered(client, requests, 1),
            "buffered c16: CPU µs/request": lambda: _buffered(client, requests, 16),
            "stream bulk: CPU µs/event": lambda: _stream(client, "bench", 160, 16),
            "stream, a read per event: CPU µs/event": per_event,
        },
        reps,
    )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--requests",
        type=int,
        default=0,
        help="buffered requests per figure (default 3,000; 20,000 in process)",
    )
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="no sockets: a fake transport answers with the stub's bytes",
    )
    args = ap.parse_args(argv)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    if args.in_process:
        figures = runner(_in_process(args.reps, args.requests or 20000))
    else:
        pin = (os.cpu_count() or 1) >= 2
        if pin:
            os.sched_setaffinity(0, {1})
        import tempfile
        from pathlib import Path

        port = free_port()
        with tempfile.TemporaryDirectory() as logdir:
            stub = Proc(
                "stub",
                [sys.executable, "-m", "tests.benchmarks.stub_fast", str(port)],
                core=0 if pin else None,
                logdir=Path(logdir),
                health=f"http://127.0.0.1:{port}/health",
            )
            try:
                figures = runner(
                    _over_sockets(f"http://127.0.0.1:{port}", args.reps, args.requests or 3000)
                )
            finally:
                stub.stop()
    for name, value in figures.items():
        print(f"{name:40} {value:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
