"""Keep-alive connections to one upstream, over gateway/upstream/connection.py.

Why not aiohttp's ``ClientSession``: it costs about 150 µs of CPU per buffered request
on this project's benchmark machine (request and response objects, header multidicts,
cookie jar, tracing hooks, a stream reader per response), as much as everything else
the gateway does together. This pool does only what an upstream call needs:

* idle connections reused last-in first-out and closed after ``KEEPALIVE`` seconds (a
  sweep timer closes them when no request comes); ``keepalive=False`` sends
  ``Connection: close`` and never reuses one;
* an optional limit whose waiters are served first come first served, each waiting at
  most its head timeout;
* request heads built once per (method, path);
* a framing anomaly on any connection (:meth:`Pool.protocol_error`) closes every idle
  one: an upstream that answered out of turn once cannot be trusted with the next.

Errors: gateway/upstream/exceptions.py; connect errors come as :class:`ConnectFailed`
naming their cause.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

from gateway.upstream.connection import Connection
from gateway.upstream.exceptions import (
    ConnectFailed,
    Disconnected,
    HTTPClientError,
    PoolTimeout,
    TooLarge,
)

# Seconds an idle connection is kept for reuse: under the 5 s after which uvicorn (vLLM,
# SGLang) and llama.cpp's server close an idle connection, so the gateway lets go first
# instead of sending a request into a close already on its way.
KEEPALIVE = 4.0


class Counter(Protocol):
    """What the pool reports open connections to (a Prometheus gauge's child)."""

    def inc(self, amount: float = 1) -> None: ...

    def dec(self, amount: float = 1) -> None: ...


# (kind, phase, request id) of a framing anomaly, for the owner's metric and log line
OnProtocolError = Callable[[str, str, str | None], None]


class Response:
    """An upstream reply whose head has arrived; read the body, then release or close."""

    __slots__ = ("_conn", "_pool", "_settled", "headers", "progress", "status")

    def __init__(self, pool: Pool, conn: Connection) -> None:
        self._pool = pool
        self._conn = conn
        self._settled = False
        self.status = conn.status
        self.headers = conn.headers
        self.progress = conn.progress  # a stream's reader: "these bytes held an event"

    async def readany(self) -> bytes:
        """The next body bytes as they arrive; b"" at the end."""
        return await self._conn.readany()

    async def read(self, limit: int = 0, *, cap: int = 0) -> bytes:
        """The whole body: at most ``limit`` bytes when given; past ``cap``, TooLarge."""
        conn = self._conn
        if cap and conn.length > cap:
            raise TooLarge("reply larger than the cap")
        parts = []
        size = 0
        while True:
            data = await conn.readany()
            if not data:
                break
            parts.append(data)
            size += len(data)
            if limit and size >= limit:
                break
            if cap and size > cap:
                raise TooLarge("reply larger than the cap")
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        return body[:limit] if limit else body

    @property
    def at_eof(self) -> bool:
        return self._conn.complete

    async def drain(self, limit: int, seconds: float) -> bool:
        """Read and drop the rest of the body; True if it ended within limit and seconds."""
        size = 0
        try:
            async with asyncio.timeout(seconds):
                while True:
                    data = await self._conn.readany()
                    if not data:
                        return True
                    size += len(data)
                    if size > limit:
                        return False
        except (TimeoutError, HTTPClientError, OSError):
            return False

    def release(self) -> None:
        """Back to the pool if the body was read to its end, else closed."""
        if not self._settled:
            self._settled = True
            self._pool.release(self._conn)

    def close(self) -> None:
        """Drop the connection: the upstream sees the disconnect and stops generating."""
        if not self._settled:
            self._settled = True
            self._conn.abort()
            self._pool.release(self._conn)


def _connect_cause(exc: OSError) -> str:
    if isinstance(exc, ssl.SSLError | ssl.CertificateError):
        return "tls"
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, ConnectionResetError):
        return "reset"
    if isinstance(exc, socket.gaierror):
        return "dns"
    return "connect"


class Pool:
    """Keep-alive connections to one upstream origin."""

    def __init__(self, base_url: str, *, limit: int = 0, connect_timeout: float = 5.0,
                 extra_headers: dict[str, str] | None = None, gauge: Counter | None = None,
                 keepalive: bool = True, on_protocol_error: OnProtocolError | None = None
                 ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("base_url must be an http(s) URL")
        self.loop = asyncio.get_running_loop()
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl: ssl.SSLContext | None = (ssl.create_default_context()
                                            if parts.scheme == "https" else None)
        self._limit = limit
        self._connect_timeout = connect_timeout
        self._keepalive = keepalive
        self._on_protocol_error = on_protocol_error
        self._idle: collections.deque[Connection] = collections.deque()  # oldest first
        self._sweeper: asyncio.TimerHandle | None = None
        self._all: set[Connection] = set()
        self._busy = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False
        self._gauge = gauge
        host = parts.netloc.rpartition("@")[2]  # never a userinfo in the Host header
        fixed = [f"Host: {host}"] + [f"{k}: {v}" for k, v in (extra_headers or {}).items()]
        if not keepalive:
            fixed.append("Connection: close")
        self._fixed = ("\r\n".join(fixed) + "\r\n").encode("latin-1")
        self._heads: dict[tuple[str, str], bytes] = {}

    def _head(self, method: str, target: str) -> bytes:
        head = self._heads.get((method, target))
        if head is None:
            head = f"{method} {target} HTTP/1.1\r\n".encode("latin-1") + self._fixed
            if len(self._heads) < 64:
                self._heads[(method, target)] = head
        return head

    async def request(self, method: str, target: str, body: bytes | None, *,
                      head_timeout: float, body_timeout: float, stream: bool = False,
                      request_id: bytes | None = None) -> Response:
        """Send one request and wait for the reply's final head (after any 1xx).

        The head is due ``head_timeout`` after the send (a pool slot is waited for at
        most as long, before); see :meth:`Connection.send` for ``body_timeout``.
        ``request_id`` goes out as ``X-Request-Id``; a reply that echoes another fails.
        """
        if method != "POST" and method != "GET":
            raise ValueError("the gateway sends GET and POST only")  # a HEAD reply has no body
        head = self._head(method, target)
        if request_id is not None:
            head += b"X-Request-Id: " + request_id + b"\r\n"
        if body is None:
            head += b"\r\n"
            data: bytes | tuple[bytes, bytes] = head
        else:
            head += b"Content-Length: %d\r\n\r\n" % len(body)
            data = head + body if len(body) < 16384 else (head, body)
        conn = await self._acquire(head_timeout)
        try:
            conn.send(data, head_timeout=head_timeout, body_timeout=body_timeout,
                      stream=stream, request_id=request_id)
            await conn.read_head()
        except BaseException:
            conn.abort()
            self.release(conn)
            raise
        return Response(self, conn)

    async def _acquire(self, wait: float) -> Connection:
        """A slot, then an idle connection or a new one.

        Past the limit a request queues, first come first served: a freed slot is handed
        to the oldest waiter, never to a newcomer. It waits at most ``wait`` seconds (its
        head timeout).
        """
        if self._closed:
            raise Disconnected("client closed")
        if self._limit and (self._busy >= self._limit or self._waiters):
            waiter = self.loop.create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout(wait):
                    await waiter  # woken holding the slot: _busy already counts it
            except BaseException as exc:
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    self._free_slot()  # handed the slot as it gave up: pass it on
                elif waiter in self._waiters:
                    self._waiters.remove(waiter)
                if isinstance(exc, TimeoutError):
                    raise PoolTimeout("no pool slot within the head timeout") from None
                raise
        else:
            self._busy += 1
        try:
            if self._closed:
                raise Disconnected("client closed")
            return self._idle_connection() or await self._connect()
        except BaseException:
            self._free_slot()
            raise

    def _idle_connection(self) -> Connection | None:
        now = self.loop.time()
        while self._idle:
            conn = self._idle.pop()  # the most recent: the likeliest to be alive
            if conn.closed:
                continue
            if now - conn.idle_since > KEEPALIVE:
                conn.abort()
                continue
            return conn
        return None

    async def _connect(self) -> Connection:
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await self.loop.create_connection(
                    lambda: Connection(self), self._host, self._port, ssl=self._ssl,
                    server_hostname=self._host if self._ssl else None)
        except TimeoutError:
            raise ConnectFailed("connect timed out", cause="timeout") from None
        except OSError as exc:
            raise ConnectFailed("connect failed", cause=_connect_cause(exc)) from None
        self._all.add(conn)
        if self._gauge is not None:
            self._gauge.inc()
        return conn

    def release(self, conn: Connection) -> None:
        if (conn.keep_alive and conn.complete and not conn.closed and not self._closed
                and self._keepalive):
            conn.park()
            conn.idle_since = self.loop.time()
            self._idle.append(conn)
            if self._sweeper is None:
                self._sweeper = self.loop.call_later(KEEPALIVE, self._sweep)
        else:
            conn.abort()
        self._free_slot()

    def _free_slot(self) -> None:
        """Hand the slot to the oldest live waiter, else give it back."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._busy -= 1

    def _sweep(self) -> None:
        """Close connections idle past KEEPALIVE, so a quiet pool holds no sockets."""
        self._sweeper = None
        idle = self._idle
        expired = self.loop.time() - KEEPALIVE
        while idle and (idle[0].closed or idle[0].idle_since <= expired):
            idle.popleft().abort()
        if idle:
            self._sweeper = self.loop.call_at(idle[0].idle_since + KEEPALIVE + 0.01, self._sweep)

    def protocol_error(self, conn: Connection, kind: str, phase: str) -> None:
        """A connection broke the framing (it is closed already): close the idle ones too.

        Whatever made the upstream answer out of turn on one connection may have done so
        on the others; a fresh connection costs a handshake, a desync a wrong reply.
        """
        while self._idle:
            self._idle.pop().abort()
        if self._on_protocol_error is not None:
            rid = conn.request_id if phase != "idle" else None  # idle: no request of its own
            self._on_protocol_error(kind, phase, rid.decode("latin-1") if rid else None)

    def forget(self, conn: Connection) -> None:
        if conn in self._all:
            self._all.remove(conn)
            if self._gauge is not None:
                self._gauge.dec()

    @property
    def open_connections(self) -> int:
        return len(self._all)

    @property
    def idle_connections(self) -> int:
        return sum(1 for conn in self._idle if not conn.closed)

    async def close(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._all):
            conn.abort()
        self._all.clear()
        self._idle.clear()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(Disconnected("client closed"))
        self._waiters.clear()

