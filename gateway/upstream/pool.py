"""Keep-alive connections to one upstream, over gateway/upstream/connection.py.

Why not aiohttp's ``ClientSession``: it costs about 150 µs of CPU per buffered request
on this project's benchmark machine (request and response objects, header multidicts,
cookie jar, tracing hooks, a stream reader per response), as much as everything else
the gateway does together. This pool does only what an upstream call needs:

* whether a connection may carry a second request is :class:`~gateway.upstream.reuse.Reuse`'s
  call (``keepalive``: ``auto``, ``always``, ``never``); a request that may not reuse one
  goes out on a fresh connection with ``Connection: close``, and the connection is closed
  after its reply;
* idle connections reused last-in first-out, each only after :meth:`Connection.quiet`
  (nothing unread waits on its socket), and closed after ``KEEPALIVE`` seconds (a sweep
  timer closes them when no request comes);
* an optional limit whose waiters are served first come first served, each waiting at
  most its head timeout;
* request heads built once per (method, path);
* a framing anomaly on any connection (:meth:`Pool.protocol_error`) closes every idle
  one: an upstream that answered out of turn once cannot be trusted with the next; under
  ``auto`` it also turns keep-alive off until the upstream has proved itself again.

Errors: gateway/upstream/exceptions.py; connect errors come as :class:`ConnectFailed`
naming their cause.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Protocol
from urllib.parse import urlsplit

from gateway.upstream.connection import Connection
from gateway.upstream.exceptions import (
    ConnectFailed,
    Disconnected,
    HTTPClientError,
    PoolTimeout,
    ProtocolError,
    TooLarge,
)
from gateway.upstream.proof import verdict, with_rid
from gateway.upstream.reuse import Event, Reuse

# Seconds an idle connection is kept for reuse: under the 5 s after which uvicorn (vLLM,
# SGLang) and llama.cpp's server close an idle connection, so the gateway lets go first
# instead of sending a request into a close already on its way.
KEEPALIVE = 4.0


class Counter(Protocol):
    """What the pool reports open connections to (a Prometheus gauge's child)."""

    def inc(self, amount: float = 1) -> None: ...

    def dec(self, amount: float = 1) -> None: ...


# (kind, phase, the request's log id, the X-Request-Id it went out with) of a framing anomaly,
# for the owner's metric and log line
OnProtocolError = Callable[[str, str, str | None, str | None], None]
# keep-alive turned on (True) or off (False), for the owner's gauge and log line
OnKeepalive = Callable[[bool], None]
# the anomalies that say a reply on a reused connection answered another request: nothing has
# reached the client, and a fresh connection gets the request its own reply
MISROUTED = frozenset(("request_id_mismatch", "request_id_missing"))
# the verdicts a reply gives, read once (an Enum member read from its class costs a call)
_ECHO = Event.ECHO
_NO_ECHO = Event.NO_ECHO


class Response:
    """An upstream reply whose head has arrived; read the body, then release or close."""

    __slots__ = ("_conn", "_expect", "_pool", "_settled", "headers", "progress", "status")

    def __init__(self, pool: Pool, conn: Connection) -> None:
        self._pool = pool
        self._conn = conn
        self._settled = False
        self.status = conn.status
        self.headers = conn.headers
        self.progress = conn.progress  # a stream's reader: "these bytes held an event"
        # the completion id the body must open with before any of it is handed on
        self._expect = conn.body_id if conn.proof_due else None

    def readany(self) -> Awaitable[bytes]:
        """The next body bytes as they arrive; b"" at the end. The connection's own
        awaitable once the body has shown whose it is: no coroutine of its own per read
        (one a streamed chunk)."""
        if self._expect is not None:
            return self._first()
        return self._conn.readany()

    async def _first(self) -> bytes:
        """A body's first bytes, held until they show whose reply this is."""
        expect = self._expect
        assert expect is not None
        data = b""
        while True:
            more = await self._conn.readany()
            data += more
            ok = verdict(data, expect, final=not more)
            if ok is not None:
                break
        self._proved(data, ok)
        return data

    def _proved(self, data: bytes, ok: bool) -> None:
        """Count the verdict; a reply the proof was required of that fails it is refused."""
        self._expect = None
        conn = self._conn
        if ok:
            self._pool.observe(_ECHO)
        elif conn.must_echo:
            kind = "request_id_mismatch" if b'"id"' in data[:256] else "request_id_missing"
            self._settled = True
            exc = conn.refuse(kind)  # closes it; the pool's anomaly turns keep-alive off
            self._pool.release(conn)
            raise exc
        else:
            self._pool.observe(_NO_ECHO)

    def read_now(self, cap: int = 0) -> bytes | None:
        """:meth:`read` without a wait when the whole body is in already (a buffered reply
        that came with its head); None: :meth:`read` it."""
        conn = self._conn
        if cap and conn.length > cap:
            raise TooLarge("reply larger than the cap")
        body = conn.whole()
        if body is None:
            return None
        if cap and len(body) > cap:
            raise TooLarge("reply larger than the cap")
        if self._expect is not None:
            self._proved(body, bool(verdict(body, self._expect, final=True)))
        return body

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
        if self._expect is not None:
            self._proved(body, bool(verdict(body, self._expect, final=True)))
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

    def __init__(
        self,
        base_url: str,
        *,
        limit: int = 0,
        connect_timeout: float = 5.0,
        extra_headers: dict[str, str] | None = None,
        gauge: Counter | None = None,
        keepalive: str | bool = "auto",
        on_protocol_error: OnProtocolError | None = None,
        on_keepalive: OnKeepalive | None = None,
        address: str | None = None,
        body_proof: tuple[bytes, bool] | None = None,
    ) -> None:
        """``address``: connect there instead of the URL's host (one address a DNS name
        resolved to); the Host header and TLS's server name stay the URL's. ``body_proof``:
        how this upstream's chat completions name their request (gateway/upstream/proof.py
        ``BODY_PROOF``: the completion id's prefix, whether the id goes in the body as
        ``rid``), None: they do not."""
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("base_url must be an http(s) URL")
        self.loop = asyncio.get_running_loop()
        self._host = parts.hostname
        self._address = address or parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if parts.scheme == "https" else None
        )
        self._limit = limit
        self._connect_timeout = connect_timeout
        if isinstance(keepalive, bool):
            keepalive = "always" if keepalive else "never"
        self.reuse = Reuse(keepalive)
        self._body_proof = body_proof
        self._echoes = False  # the last reply echoed X-Request-Id: any request can be proved
        self._on_protocol_error = on_protocol_error
        self._on_keepalive = on_keepalive
        self._idle: collections.deque[Connection] = collections.deque()  # oldest first
        self._sweeper: asyncio.TimerHandle | None = None
        self._all: set[Connection] = set()
        self._busy = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False
        self._gauge = gauge
        host = parts.netloc.rpartition("@")[2]  # never a userinfo in the Host header
        fixed = [f"Host: {host}"] + [f"{k}: {v}" for k, v in (extra_headers or {}).items()]
        self._fixed = ("\r\n".join(fixed) + "\r\n").encode("latin-1")
        self._heads: dict[tuple[str, str], bytes] = {}

    def _head(self, method: str, target: str) -> bytes:
        head = self._heads.get((method, target))
        if head is None:
            head = f"{method} {target} HTTP/1.1\r\n".encode("latin-1") + self._fixed
            if len(self._heads) < 64:
                self._heads[(method, target)] = head
        return head

    async def request(
        self,
        method: str,
        target: str,
        body: bytes | None,
        *,
        head_timeout: float,
        body_timeout: float,
        stream: bool = False,
        request_id: bytes | None = None,
        log_id: str | None = None,
        provable: bool = False,
        fresh: bool = False,
        headers: bytes = b"",
    ) -> Response:
        """Send one request and wait for the reply's final head (after any 1xx).

        The head is due ``head_timeout`` after the send (a pool slot is waited for at
        most as long, before); see :meth:`Connection.send` for ``body_timeout``.
        ``request_id`` goes out as ``X-Request-Id``; a reply that echoes another fails. It
        must name this attempt alone (an id sent twice would let the first request's stray
        reply pass for the second's): the caller makes a new one per call. ``log_id``: the
        request's id in log lines, never sent.
        Under ``auto`` a request without one always gets a fresh connection: its reply
        could not be told from a stray one; so does one whose reply nothing would name (an
        upstream that does not echo the header, a request whose body is not ``provable``: a
        chat completion the upstream's ``body_proof`` names). ``fresh``: a new connection
        whatever the state (the send again of a reply refused on a reused one).
        ``headers``: more header lines, each ending in CRLF (a ``traceparent``).
        """
        if method != "POST" and method != "GET":
            raise ValueError("the gateway sends GET and POST only")  # a HEAD reply has no body
        reuse = self.reuse
        body_id = None
        proof = self._body_proof
        if provable and proof is not None and request_id is not None and body is not None:
            named_body = with_rid(body, request_id) if proof[1] else body
            if named_body is not None:  # else not a body the gateway wrote: sent as it was
                body = named_body
                body_id = proof[0] + request_id
        named = request_id is not None and (body_id is not None or self._echoes)
        keep = not fresh and reuse.keepalive and (named or not reuse.must_echo)
        head = self._heads.get((method, target)) or self._head(method, target)
        if request_id is not None:
            head += b"X-Request-Id: " + request_id + b"\r\n"
        if headers:
            head += headers
        if not keep:
            head += b"Connection: close\r\n"
        if body is None:
            head += b"\r\n"
            data: bytes | tuple[bytes, bytes] = head
        else:
            head += b"Content-Length: %d\r\n\r\n" % len(body)
            data = head + body if len(body) < 16384 else (head, body)
        conn = self._idle_now(keep) or await self._acquire(head_timeout, reuse=keep)
        try:
            # The echo is required on a reused connection only: there a reply without it could
            # be one a previous request left behind. The first reply on a new connection is
            # this request's whatever it carries (one without the echo still counts against
            # the upstream's proof, below: keep-alive goes off).
            conn.send(
                data,
                head_timeout=head_timeout,
                body_timeout=body_timeout,
                stream=stream,
                request_id=request_id,
                log_id=log_id,
                must_echo=reuse.must_echo and keep and conn.sent > 0,
                reusable=keep,
                body_id=body_id,
            )
            await conn.read_head()
            if conn.unproven:  # an error reply, on a reused connection, naming no request
                raise ProtocolError("request_id_missing")
        except BaseException as exc:
            if isinstance(exc, ProtocolError) and exc.kind in MISROUTED and conn.sent > 1:
                exc.cause = "misrouted"  # a stray reply read on a reused connection: retried
            conn.abort()
            self.release(conn)
            raise
        if request_id is not None:
            self._echoes = conn.echoed
            if conn.echoed:
                if reuse.observe(_ECHO):  # what observe() does, one call less per reply
                    self._switched()
            elif body_id is None:
                self.observe(_NO_ECHO)
            # else: the body decides (Response), or an error reply that names nothing: no count
        return Response(self, conn)

    def observe(self, event: Event) -> None:
        """One reply's verdict (or an anomaly) for :class:`Reuse`."""
        if self.reuse.observe(event):
            self._switched()

    def _switched(self) -> None:
        """Keep-alive was turned on or off (:meth:`observe`)."""
        on = self.reuse.keepalive
        if not on:
            self._close_idle()
        if self._on_keepalive is not None:
            self._on_keepalive(on)

    def _idle_now(self, reuse: bool) -> Connection | None:
        """A free slot and an idle connection taken at once (no coroutine), when there are
        both and no waiter is ahead; None: :meth:`_acquire` waits or connects."""
        if (
            not reuse
            or self._closed
            or not self._idle
            or (self._limit and (self._busy >= self._limit or self._waiters))
        ):
            return None
        conn = self._idle_connection()
        if conn is not None:
            self._busy += 1
        return conn

    async def _acquire(self, wait: float, *, reuse: bool = True) -> Connection:
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
            return (reuse and self._idle_connection()) or await self._connect()
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
            if not conn.quiet():  # closed by it: a reply to nobody, or a close on its way
                continue
            return conn
        return None

    async def _connect(self) -> Connection:
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await self.loop.create_connection(
                    lambda: Connection(self),
                    self._address,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl else None,
                )
        except TimeoutError:
            raise ConnectFailed("connect timed out", cause="timeout") from None
        except OSError as exc:
            raise ConnectFailed("connect failed", cause=_connect_cause(exc)) from None
        self._all.add(conn)
        if self._gauge is not None:
            self._gauge.inc()
        return conn

    def release(self, conn: Connection) -> None:
        if (
            conn.keep_alive
            and conn.reusable
            and conn.complete
            and not conn.closed
            and not self._closed
            and self.reuse.keepalive
        ):
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
        Under ``auto``, keep-alive is off until the upstream has proved itself again.
        """
        self._close_idle()
        self.observe(Event.ANOMALY)
        if self._on_protocol_error is not None:
            if phase == "idle":  # no request of its own
                self._on_protocol_error(kind, phase, None, None)
            else:
                rid = conn.request_id
                self._on_protocol_error(
                    kind, phase, conn.log_id, rid.decode("latin-1") if rid else None
                )

    def _close_idle(self) -> None:
        while self._idle:
            self._idle.pop().abort()

    def forget(self, conn: Connection) -> None:
        if conn in self._all:
            self._all.remove(conn)
            if self._gauge is not None:
                self._gauge.dec()

    async def probe(self, target: str, wait: float) -> int:
        """The status of ``GET target`` on a connection of its own (outside the pool's limit
        and keep-alive, closed after), within ``wait`` seconds; connect errors as in requests."""
        head = (
            f"GET {target} HTTP/1.1\r\n".encode("latin-1")
            + self._fixed
            + b"Connection: close\r\n\r\n"
        )
        writer = None
        try:
            async with asyncio.timeout(wait):
                try:
                    reader, writer = await asyncio.open_connection(
                        self._address,
                        self._port,
                        ssl=self._ssl,
                        server_hostname=self._host if self._ssl else None,
                    )
                except OSError as exc:
                    raise ConnectFailed("connect failed", cause=_connect_cause(exc)) from None
                writer.write(head)
                line = await reader.readline()
        finally:
            if writer is not None:
                writer.transport.abort()
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise Disconnected("no status line")
        return int(parts[1])

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
