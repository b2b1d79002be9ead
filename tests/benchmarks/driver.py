"""A lean load driver: raw asyncio HTTP/1.1 keep-alive connections, precomputed requests.

A client library would cost more CPU than the gateway it measures, so this one sends
prebuilt request bytes and only frames the reply (``Content-Length`` or chunked): it
notes when the first byte containing ``marker`` arrived (time to first token), when the
body ended (time to last byte), and whether the body's tail holds ``terminal`` (the
stream ended with its terminal event, not a cut).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

_TAIL = 256


def build_request(
    host: str, port: int, path: str, body: bytes, headers: dict[str, str] | None = None
) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass
class Result:
    status: int = 0
    start: float = 0.0
    first: float = 0.0  # when ``marker`` was first seen (0: never)
    end: float = 0.0
    nbytes: int = 0
    complete: bool = False  # the body ended and its tail held ``terminal``

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def ttft(self) -> float:
        return (self.first or self.end) - self.start


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[Result] | None = None
        self.closed = asyncio.get_running_loop().create_future()

    # --- one request at a time ---------------------------------------------------------

    def send(self, raw: bytes, marker: bytes, terminal: bytes) -> asyncio.Future[Result]:
        assert self.transport is not None
        self.res = Result(start=time.perf_counter())
        self.marker = marker
        self.terminal = terminal
        self.head_done = False
        self.chunked = False
        self.need = 0  # body bytes still expected (content-length or current chunk + CRLF)
        self.tail = b""
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return self.waiter

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        if self.waiter is not None and not self.waiter.done():
            self.res.end = time.perf_counter()
            self.waiter.set_result(self.res)

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            return
        res = self.res
        if self.marker and not res.first:
            if self.marker in self.tail[-64:] + data:
                res.first = time.perf_counter()
        res.nbytes += len(data)
        self.tail = (self.tail + data)[-_TAIL:]
        self.buf += data
        if not self.head_done:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).lower()
            del self.buf[: end + 4]
            self.head_done = True
            res.status = int(head[9:12])
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name == b"content-length":
                    self.need = int(value)
                elif name == b"transfer-encoding" and b"chunked" in value:
                    self.chunked = True
        if self.chunked:
            self._chunks()
        elif len(self.buf) >= self.need:
            del self.buf[: self.need]
            self._done()

    def _chunks(self) -> None:
        buf = self.buf
        pos = 0
        while True:
            if self.need:
                take = min(self.need, len(buf) - pos)
                pos += take
                self.need -= take
                if self.need:
                    break
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
            if size == 0:
                if len(buf) < eol + 4:
                    break
                del buf[: eol + 4]
                self._done()
                return
            pos = eol + 2
            self.need = size + 2
        del buf[:pos]

    def _done(self) -> None:
        res = self.res
        res.end = time.perf_counter()
        res.complete = res.status == 200 and (not self.terminal or self.terminal in self.tail)
        assert self.waiter is not None
        self.waiter.set_result(res)


async def _connect(host: str, port: int) -> _Conn:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(_Conn, host, port)
    return conn


def _close(conn: _Conn) -> None:
    if conn.transport is not None:
        conn.transport.close()


@dataclass
class LoadResult:
    results: list[Result] = field(default_factory=list)
    wall: float = 0.0

    @property
    def ok(self) -> int:
        return sum(1 for r in self.results if r.complete)


async def closed_loop(
    host: str,
    port: int,
    raw: bytes,
    *,
    concurrency: int,
    requests: int,
    marker: bytes = b"",
    terminal: bytes = b"",
) -> LoadResult:
    """``concurrency`` connections each sending the next request when the last ended."""
    conns = await asyncio.gather(*(_connect(host, port) for _ in range(concurrency)))
    out = LoadResult()
    left = requests

    async def worker(conn: _Conn) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            out.results.append(await conn.send(raw, marker, terminal))

    t = time.perf_counter()
    try:
        await asyncio.gather(*(worker(c) for c in conns))
    finally:
        out.wall = time.perf_counter() - t
        for c in conns:
            _close(c)
    return out


async def streams_at_once(
    host: str, port: int, raw: bytes, *, count: int, marker: bytes, terminal: bytes, within: float
) -> LoadResult:
    """``count`` streams opened together, one connection each; waits ``within`` seconds at most."""
    out = LoadResult()
    conns: list[_Conn] = []
    sem = asyncio.Semaphore(256)  # open connections in waves: no SYN flood on the backlog

    async def one() -> None:
        async with sem:
            conn = await _connect(host, port)
        conns.append(conn)
        out.results.append(await conn.send(raw, marker, terminal))

    t = time.perf_counter()
    try:
        await asyncio.wait_for(asyncio.gather(*(one() for _ in range(count))), within)
    except TimeoutError:
        pass
    finally:
        out.wall = time.perf_counter() - t
        for c in conns:
            _close(c)
    return out
