"""What keep-alive saves: one upstream call with a reused connection against a fresh
connection per request (``Connection: close``), through the gateway's own pool.

    python -m tests.benchmarks.keepalive [--requests N] [--concurrency C]

The upstream is a minimal HTTP/1.1 server in a process of its own (a fixed 200 reply with
the request's ``X-Request-Id`` echoed, as vLLM's ``--enable-request-id-headers`` does), on
127.0.0.1, so the figures are the client side's cost: connect (a loopback handshake), the
socket's setup and teardown, and the pool's work. Per mode: the median and p99 latency of a
buffered call, and the client process's CPU per request; then the ratios ``never / always``.
Loopback is the cheapest a connection ever is: over a network add a round trip (and a TLS
handshake for https) per request.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

from gateway.upstream.pool import Pool
from tests.procs import free_port, wait_http

_SERVER = r"""
import asyncio, re, sys
BODY = b'{"id":"x","object":"chat.completion","choices":[]}'
class P(asyncio.Protocol):
    def connection_made(self, t): self.t = t; self.buf = b""
    def data_received(self, data):
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, _, rest = self.buf.partition(b"\r\n\r\n")
            n = int((re.search(rb"(?i)content-length: *(\d+)", head) or [0, b"0"])[1])
            if len(rest) < n: return
            self.buf = rest[n:]
            rid = re.search(rb"(?i)x-request-id: *(\S+)", head)
            close = re.search(rb"(?i)connection: *close", head)
            extra = b"x-request-id: " + rid[1] + b"\r\n" if rid else b""
            self.t.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n%s%s\r\n%s" % (len(BODY), extra,
                         b"connection: close\r\n" if close else b"", BODY))
            if close: self.t.close(); return
async def main():
    srv = await asyncio.get_running_loop().create_server(P, "127.0.0.1", int(sys.argv[1]),
                                                         backlog=1024)
    async with srv: await srv.serve_forever()
asyncio.run(main())
"""


async def _run(url: str, mode: str, requests: int, concurrency: int) -> tuple[list[float], float]:
    pool = Pool(url, keepalive=mode)
    latencies: list[float] = []
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    counter = iter(range(requests))

    async def worker() -> None:
        for i in counter:
            t = time.perf_counter()
            resp = await pool.request(
                "POST",
                "/v1/chat/completions",
                body,
                head_timeout=5,
                body_timeout=5,
                request_id=b"req_%d" % i,
            )
            await resp.read()
            resp.release()
            latencies.append(time.perf_counter() - t)

    cpu = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu = time.process_time() - cpu
    await pool.close()
    return latencies, cpu / requests


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _measure(
    url: str, requests: int, concurrency: int
) -> dict[str, tuple[float, float, float]]:
    await _run(url, "always", 200, concurrency)  # warm-up
    await _run(url, "never", 200, concurrency)
    rows: dict[str, tuple[float, float, float]] = {}
    for mode in ("always", "never", "always", "never"):  # interleaved: a noisy neighbour
        lat, cpu = await _run(url, mode, requests, concurrency)  # hurts both alike
        best = rows.get(mode)
        if best is None or statistics.median(lat) < best[0]:
            rows[mode] = (statistics.median(lat), _p(lat, 0.99), cpu)
    return rows


def _report(rows: dict[str, tuple[float, float, float]], requests: int, concurrency: int) -> None:
    print(f"{requests} buffered calls at concurrency {concurrency}, loopback")
    print(f"{'mode':<22}{'p50 µs':>10}{'p99 µs':>10}{'CPU µs/req':>12}")
    names = {"always": "keep-alive", "never": "connection per request"}
    for mode, (p50, p99, cpu) in rows.items():
        print(f"{names[mode]:<22}{p50 * 1e6:>10.0f}{p99 * 1e6:>10.0f}{cpu * 1e6:>12.0f}")
    a, n = rows["always"], rows["never"]
    ratios = (n[0] / a[0], n[1] / a[1], n[2] / a[2])
    print(f"{'ratio (per request)':<22}{ratios[0]:>10.2f}{ratios[1]:>10.2f}{ratios[2]:>12.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", _SERVER, str(port)])
    try:
        wait_http(f"http://127.0.0.1:{port}/", proc=server)
        rows = asyncio.run(_measure(f"http://127.0.0.1:{port}", args.requests, args.concurrency))
    finally:
        server.kill()  # by its own pid: the one process this run started
        server.wait()
    _report(rows, args.requests, args.concurrency)


if __name__ == "__main__":
    main()
