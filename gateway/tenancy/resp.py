"""A small asyncio Redis client (RESP2), enough for the counters' scripts.

Protocol facts relied on (RESP2, https://redis.io/docs/reference/protocol-spec/): a request is
an array of bulk strings (``*N\\r\\n`` then ``$len\\r\\nbytes\\r\\n`` per argument); a reply is
one of ``+simple``, ``-ERROR message``, ``:integer``, ``$len`` + bytes (``$-1``: nil) or
``*N`` + N replies (``*-1``: nil). Replies come back in the order the requests were sent, so
requests are pipelined on one connection and matched to a FIFO of waiters. ``AUTH [user]
password`` and ``SELECT db`` are sent first on every connection; an error reply to either is a
failure like any other. ``EVALSHA`` answers ``-NOSCRIPT`` when the server does not hold the
script (restarted, flushed): the script is then sent whole with ``EVAL``, which caches it.

Bounds: a reply larger than ``MAX_REPLY`` bytes, a bulk string longer than ``MAX_BULK``, an
array of more than ``MAX_ITEMS`` items or nested deeper than ``MAX_DEPTH`` is a protocol error;
every round trip (and a connect with its AUTH and SELECT) is bounded by ``timeout``.

Every failure (refused, reset, timeout, a protocol error, an error reply) raises
:class:`StoreFailed` (a :class:`~gateway.tenancy.counters.CountersUnavailable`) with a fixed
``kind`` and a short reason that never holds the URL, host or password; the connection is then
dropped and made again by a later call. At most one connect is in flight; after a failed one
calls fail at once until a backoff (0.1 s doubling to 2 s) has passed, so a dead Redis costs
one connect attempt per backoff, not one per request.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import ssl
from collections import deque
from collections.abc import Sequence
from typing import cast

from gateway.ops.redis_url import Target, parse_url
from gateway.tenancy.counters import CountersUnavailable

__all__ = ["Target", "parse_url"]  # re-exported: the URL is read in ops (config), used here

MAX_REPLY = 64 * 1024
MAX_BULK = 16 * 1024
MAX_ITEMS = 64
MAX_DEPTH = 2
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 2.0


class StoreFailed(CountersUnavailable):
    """A Redis call failed; ``kind`` is one of :data:`gateway.ops.metrics.STORE_ERRORS`,
    ``reason`` a short fixed text (an errno name, a Redis error code) holding no address or
    secret."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"redis {kind}: {reason}")
        self.kind = kind
        self.reason = reason


class RedisError(Exception):
    """An error reply; ``code`` is its first word (``ERR``, ``NOSCRIPT``, ``WRONGPASS``...)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class _ProtocolError(Exception):
    pass


Reply = bytes | int | None | list["Reply"] | RedisError
Arg = bytes | str | int | float


def bulk(arg: Arg) -> bytes:
    """One argument as a bulk string (pre-encode the constant ones)."""
    b = arg if isinstance(arg, bytes) else str(arg).encode()
    return b"$%d\r\n%s\r\n" % (len(b), b)


def encode(*args: Arg) -> bytes:
    """One request: an array of bulk strings."""
    return b"*%d\r\n" % len(args) + b"".join(map(bulk, args))


_DOLLAR, _STAR, _COLON, _PLUS, _MINUS = b"$*:+-"


def parse(buf: bytearray, pos: int = 0, depth: int = 0) -> tuple[Reply, int] | None:
    """One reply from ``buf`` at ``pos``: (reply, the position after it), or None when the
    buffer does not hold all of it yet. _ProtocolError on anything outside RESP2 or the
    bounds."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        if len(buf) - pos > MAX_BULK:
            raise _ProtocolError("line too long")
        return None
    kind, after = buf[pos], end + 2
    if kind == _PLUS:
        return bytes(buf[pos + 1 : end]), after
    if kind == _MINUS:
        code = bytes(buf[pos + 1 : min(end, pos + 33)]).split(b" ", 1)[0]
        return RedisError(code.decode("ascii", "replace")), after
    if kind not in (_DOLLAR, _STAR, _COLON):
        raise _ProtocolError("unknown reply type")
    if end - pos > 21:
        raise _ProtocolError("bad integer")
    try:
        n = int(buf[pos + 1 : end])
    except ValueError:
        raise _ProtocolError("bad integer") from None
    if kind == _COLON:
        return n, after
    if n == -1:
        return None, after
    if kind == _DOLLAR:
        if not 0 <= n <= MAX_BULK:
            raise _ProtocolError("bulk string out of bounds")
        if len(buf) < after + n + 2:
            return None
        if buf[after + n : after + n + 2] != b"\r\n":
            raise _ProtocolError("bulk string not terminated")
        return bytes(buf[after : after + n]), after + n + 2
    if not 0 <= n <= MAX_ITEMS or depth >= MAX_DEPTH:
        raise _ProtocolError("array out of bounds")
    items: list[Reply] = []
    for _ in range(n):
        got = parse(buf, after, depth + 1)
        if got is None:
            return None
        items.append(got[0])
        after = got[1]
    return items, after


class _Wire(asyncio.Protocol):
    """One connection: requests written in order, replies matched to a FIFO of futures.

    Each request has a deadline (sent + ``timeout``); one timer watches the oldest, the only
    one that can be late first (replies come in order), instead of a timer per request.
    """

    def __init__(self, on_lost: asyncio.Future[None], timeout: float) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiters: deque[tuple[asyncio.Future[Reply], float]] = deque()
        self.buf = bytearray()
        self.failed: StoreFailed | None = None
        self._on_lost = on_lost
        self._timeout = timeout
        self._loop = on_lost.get_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._out: list[bytes] = []  # requests of this loop iteration, written as one

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are no asyncio.Transport instances, but have its methods
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        pos = 0
        try:
            while True:
                got = parse(self.buf, pos)
                if got is None:
                    break
                reply, pos = got
                if not self.waiters:
                    raise _ProtocolError("a reply nobody asked for")
                fut, _ = self.waiters.popleft()
                if not fut.done():
                    fut.set_result(reply)
            del self.buf[:pos]
            if len(self.buf) > MAX_REPLY:
                raise _ProtocolError("reply too large")
        except _ProtocolError as exc:
            self.fail(StoreFailed("protocol", str(exc)))

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(StoreFailed("connection", "closed by the server"))
        if not self._on_lost.done():
            self._on_lost.set_result(None)

    def fail(self, err: StoreFailed) -> None:
        """Fail every waiter and close: the order of replies can no longer be trusted."""
        if self.failed is None:
            self.failed = err
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self.waiters:
            fut, _ = self.waiters.popleft()
            if not fut.done():
                fut.set_exception(self.failed)
        if self.transport is not None:
            self.transport.abort()

    def send(self, request: bytes) -> asyncio.Future[Reply]:
        if self.failed is not None:
            raise self.failed
        assert self.transport is not None
        fut: asyncio.Future[Reply] = self._loop.create_future()
        deadline = self._loop.time() + self._timeout
        self.waiters.append((fut, deadline))
        if self._timer is None:
            self._timer = self._loop.call_at(deadline, self._check)
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out.append(request)
        return fut

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.failed is None and self.transport is not None:
            self.transport.write(b"".join(out))

    def _check(self) -> None:
        self._timer = None
        if self.failed is not None or not self.waiters:
            return
        deadline = self.waiters[0][1]
        if self._loop.time() >= deadline:
            # a slow reply: the ones queued behind it would be as late; start afresh
            self.fail(StoreFailed("timeout", "no reply in time"))
        else:
            self._timer = self._loop.call_at(deadline, self._check)


def _os_reason(exc: OSError) -> str:
    if exc.errno is not None and exc.errno in errno.errorcode:
        return errno.errorcode[exc.errno]
    return type(exc).__name__


class Redis:
    """Pipelined calls on one connection, made on first use and again after a failure."""

    def __init__(self, target: Target, timeout: float) -> None:
        self.target = target
        self.timeout = timeout
        self._wire: _Wire | None = None
        self._connecting: asyncio.Future[_Wire] | None = None
        self._retry_at = 0.0
        self._backoff = BACKOFF_FIRST
        self._last_failure: StoreFailed | None = None
        self._closed = False
        self.connects = 0  # connect attempts, for tests

    def __repr__(self) -> str:
        return f"Redis({self.target!r})"

    async def call(self, *args: Arg) -> Reply:
        """One command's reply (an error reply is returned as a :class:`RedisError`, not
        raised); StoreFailed on any failure to get it."""
        return await self.request(encode(*args))

    async def request(self, request: bytes) -> Reply:
        """:meth:`call` with the request already encoded (:func:`encode`, :func:`bulk`)."""
        wire = self._wire
        if wire is None or wire.failed is not None:
            wire = await self._connect()
        return await self._round_trip(wire, request)

    async def _round_trip(self, wire: _Wire, request: bytes) -> Reply:
        return await wire.send(request)

    async def _connect(self) -> _Wire:
        if self._closed:  # a call after shutdown: no new connection to leave open
            raise StoreFailed("connection", "closed")
        if self._connecting is not None:
            return await asyncio.shield(self._connecting)
        loop = asyncio.get_running_loop()
        if loop.time() < self._retry_at and self._last_failure is not None:
            raise self._last_failure
        self._connecting = loop.create_future()
        try:
            wire = await self._open()
        except StoreFailed as exc:
            self._retry_at = loop.time() + self._backoff
            self._backoff = min(BACKOFF_MAX, self._backoff * 2)
            self._last_failure = exc
            self._connecting.set_exception(exc)
            self._connecting.exception()  # retrieved: no "never retrieved" warning
            raise
        else:
            self._backoff = BACKOFF_FIRST
            self._last_failure = None
            self._wire = wire
            self._connecting.set_result(wire)
            return wire
        finally:
            self._connecting = None

    async def _open(self) -> _Wire:
        self.connects += 1
        loop = asyncio.get_running_loop()
        t = self.target
        lost: asyncio.Future[None] = loop.create_future()
        try:
            async with asyncio.timeout(self.timeout):
                if t.path:
                    _, wire = await loop.create_unix_connection(
                        lambda: _Wire(lost, self.timeout), t.path
                    )
                else:
                    context = ssl.create_default_context() if t.tls else None
                    _, wire = await loop.create_connection(
                        lambda: _Wire(lost, self.timeout),
                        t.host,
                        t.port,
                        ssl=context,
                        server_hostname=t.host if t.tls else None,
                    )
        except TimeoutError:
            raise StoreFailed("timeout", "connect took too long") from None
        except ssl.SSLError:
            raise StoreFailed("connection", "TLS handshake failed") from None
        except OSError as exc:
            raise StoreFailed("connection", _os_reason(exc)) from None
        hello: list[tuple[bytes | str | int, ...]] = []
        if t.password:
            hello.append(("AUTH", t.username, t.password) if t.username else ("AUTH", t.password))
        if t.db:
            hello.append(("SELECT", t.db))
        try:
            for args in hello:
                reply = await self._round_trip(wire, encode(*args))
                if isinstance(reply, RedisError):
                    raise StoreFailed("reply", reply.code)
        except StoreFailed:
            wire.fail(StoreFailed("connection", "set-up failed"))
            raise
        return wire

    async def close(self) -> None:
        self._closed = True
        wire, self._wire = self._wire, None
        if wire is not None and wire.transport is not None:
            wire.fail(StoreFailed("connection", "closed"))


class Script:
    """A Lua script run by its SHA-1 (``EVALSHA``), sent whole once the server lacks it."""

    __slots__ = ("_by_sha", "_whole")

    def __init__(self, source: str) -> None:
        code = source.encode()
        sha = hashlib.sha1(code, usedforsecurity=False).hexdigest()
        self._by_sha = bulk("EVALSHA") + bulk(sha)
        self._whole = bulk("EVAL") + bulk(code)

    async def run(self, redis: Redis, nkeys: int, parts: Sequence[bytes]) -> Reply:
        """The script's reply; ``parts``: its keys then its arguments, each a :func:`bulk`."""
        head, tail = b"*%d\r\n" % (len(parts) + 3), b"".join((bulk(nkeys), *parts))
        reply = await redis.request(head + self._by_sha + tail)
        if isinstance(reply, RedisError) and reply.code == "NOSCRIPT":
            reply = await redis.request(head + self._whole + tail)
        if isinstance(reply, RedisError):
            raise StoreFailed("reply", reply.code)
        return reply
