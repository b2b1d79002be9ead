"""One upstream HTTP/1.1 connection: an ``asyncio.Protocol`` whose replies llhttp frames.

The bytes are framed by ``httptools.HttpResponseParser`` (llhttp, Node's parser, as
uvicorn uses it): status line, headers, ``Content-Length``, ``chunked`` (extensions
and trailers), a body until the server closes, no body after 204 and 304. This module
keeps only what llhttp leaves to its caller, each a protocol fact it relies on:

* 1xx replies are interim (RFC 9110 15.2): the final reply follows on the same
  connection. At most ``MAX_INTERIM`` are accepted; ``101 Switching Protocols`` was
  never asked for and is refused. llhttp reads each in its own pass, so skipping them
  costs linear time.
* A status outside 100..599 is not a reply; llhttp accepts any three digits.
* ``Transfer-Encoding`` other than exactly ``chunked`` would leave the body coded;
  in an HTTP/1.0 reply it means faulty framing (RFC 9112 6.1). Both are refused.
  ``Content-Length`` with ``Transfer-Encoding`` is refused by llhttp itself.
* The gateway asks for ``Accept-Encoding: identity``, so any other
  ``Content-Encoding`` is a broken reply: nothing is ever decompressed.
* The request carried ``X-Request-Id`` (the attempt's own, never reused: see
  gateway/text/ids.py); a reply echoing another one answers another request, and where the
  pool requires the echo (``must_echo``: gateway/upstream/reuse.py trusts this upstream's
  connections only because it echoes), a reply without one may be anybody's.
  :attr:`Connection.echoed` says whether the reply named its request.
* Bytes after a reply's end, in the same read, a later one or while the connection
  sits idle in the pool, are a reply to nobody: on a keep-alive connection they would
  be read as the next request's reply.

Each of those is a :class:`ProtocolError` of a fixed ``kind``
(gateway/ops/metrics.py ``PROTOCOL_ERRORS``): the connection is aborted and its pool told
(:meth:`Owner.protocol_error`), which closes the upstream's idle connections too.

A reply's head may take ``HEAD_LIMIT`` bytes (all its heads together), and so may the
bytes between two pieces of body (chunk framing, trailers): llhttp buffers a header
until it ends, so an unbounded one would grow the process.

Timeouts without a timer per read: one timer per connection, re-armed lazily. A phase
ends at ``mark + span``: a deadline (``mark`` fixed at the send) for the head and a
buffered body, an inactivity rule for a stream's body (``mark`` moved by
:meth:`Connection.progress`, which the reader calls when the bytes carried an event),
so a chunk costs a float store. Read backpressure: past ``_PAUSE_AT`` unread bytes the
socket stops being read.

Errors (gateway/upstream/exceptions.py): :class:`Disconnected` (the connection ended
before any byte of the reply: the request can be retried), :class:`BrokenResponse` (a reply
cut), :class:`ProtocolError` (a framing anomaly), ``TimeoutError`` (the phase's time ran
out).
"""

from __future__ import annotations

import asyncio
import select
import socket
from typing import Protocol

import httptools

from gateway.ops import coalesce
from gateway.upstream.exceptions import BrokenResponse, Disconnected, ProtocolError

HEAD_LIMIT = 64 * 1024
MAX_INTERIM = 8
_PAUSE_AT = 256 * 1024

# where a connection is in its request: no request (new or idle in the pool), waiting for
# the final head, reading the body, the body read to its end, failed or closed
_IDLE, _HEAD, _BODY, _DONE, _FAILED = range(5)
_PHASE_NAMES = ("idle", "head", "body", "body", "body")

# llhttp's own refusals that name an anomaly of ours (its reason texts)
_LLHTTP_KINDS = (
    ("can't be present with", "length_and_chunked"),
    ("Data after `Connection: close`", "extra_bytes"),
    ("Upgrade", "upgrade"),
    ("Invalid response status", "bad_status"),
)


class _Anomaly(Exception):
    """Raised inside a parser callback to stop llhttp; the kind is on the connection."""


def _kind_of(exc: Exception) -> str:
    if isinstance(exc, httptools.HttpParserUpgrade):
        return "upgrade"
    text = str(exc)
    for needle, kind in _LLHTTP_KINDS:
        if needle in text:
            return kind
    return "malformed"


class Owner(Protocol):
    """What a connection needs of its pool."""

    loop: asyncio.AbstractEventLoop

    def forget(self, conn: Connection) -> None: ...

    def protocol_error(self, conn: Connection, kind: str, phase: str) -> None: ...


class Connection(asyncio.Protocol):
    __slots__ = (
        "_body_span",
        "_buffered",
        "_chunks",
        "_eof",
        "_exc",
        "_fd",
        "_got_bytes",
        "_idle",
        "_interim",
        "_junk",
        "_kind",
        "_last_byte",
        "_loop",
        "_mark",
        "_must_echo",
        "_out",
        "_parser",
        "_paused",
        "_phase",
        "_pool",
        "_span",
        "_stream_span",
        "_timer",
        "_timer_due",
        "_until_close",
        "_waiter",
        "body_id",
        "closed",
        "echoed",
        "headers",
        "idle_since",
        "keep_alive",
        "length",
        "log_id",
        "must_echo",
        "proof_due",
        "request_id",
        "reusable",
        "sent",
        "status",
        "transport",
        "unproven",
    )

    def __init__(self, pool: Owner) -> None:
        self._pool = pool
        self._loop = pool.loop
        self._out = coalesce.for_loop(pool.loop)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0  # when the armed timer fires
        self._mark = 0.0
        self._span = 0.0
        self._body_span = 0.0
        self._stream_span = 0.0  # > 0: the body is a stream, idle past this many seconds
        self._idle = False  # the body's inactivity rule is running (progress moves mark)
        self._last_byte = 0.0
        self._paused = False
        self._phase = _IDLE
        self.request_id: bytes | None = None
        self.log_id: str | None = None  # the request's id in the gateway's log lines
        self._must_echo = self.must_echo = False
        self.body_id: bytes | None = None  # the completion id the reply's body must start with
        self._fd = -1
        self.sent = 0  # requests sent on this connection
        self.reusable = False  # the request in flight went out without Connection: close
        self._reset()

    def _reset(self) -> None:
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._eof = False
        self._exc: BaseException | None = None
        self._got_bytes = False
        self._kind = ""
        self._interim = 0
        self._junk = 0
        self._until_close = False
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.keep_alive = False
        self.echoed = False  # the final head carried the request's own X-Request-Id
        self.proof_due = False  # a 2xx without the echo: its body's completion id decides
        self.unproven = False  # a reply the echo was required of, with no way to name it
        self.length = -1  # the final head's Content-Length, -1 without one

    # --- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.forget(self)
        phase = self._phase
        if phase == _BODY:
            if self._until_close and exc is None:
                self._finish()  # an orderly close is how such a body ends
            else:
                self._fail(
                    BrokenResponse(
                        "connection lost in the reply's body",
                        cause="reset" if exc is not None else "cut",
                    )
                )
        elif phase == _HEAD:
            if self._got_bytes:
                self._fail(BrokenResponse("connection lost in the reply's head"))
            else:
                self._fail(
                    Disconnected(
                        "connection closed before a reply",
                        cause="reset" if exc is not None else "closed",
                    )
                )
        self._cancel_timer()

    def data_received(self, data: bytes) -> None:
        self._last_byte = self._loop.time()
        phase = self._phase
        if phase != _BODY and phase != _HEAD:
            if not self.closed:  # a reply to nobody: this connection cannot be trusted
                self._protocol_error("extra_bytes")
            return
        self._got_bytes = True
        buffered = self._buffered
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, _Anomaly) as exc:
            if not self._kind and isinstance(exc, httptools.HttpParserCallbackError):
                raise  # a bug in a callback of ours, not the upstream's: asyncio closes
            self._protocol_error(self._kind or _kind_of(exc))
            return
        # Bytes since the last body byte (heads, chunk framing, trailers) are bounded: llhttp
        # holds a header until it ends. Counted per read, so a chunk costs nothing more.
        if self._buffered == buffered:  # no body in this read
            self._junk += len(data)
            if self._junk > HEAD_LIMIT:
                self._protocol_error("head_too_large")
        else:
            if phase == _HEAD and self._junk + len(data) > HEAD_LIMIT and self._head_too_large():
                return  # a head ended in this read, with body after it: was the head too big?
            self._junk = 0

    def _head_too_large(self) -> bool:
        if sum(len(k) + len(v) + 4 for k, v in self.headers.items()) + 32 <= HEAD_LIMIT:
            return False
        self._protocol_error("head_too_large")
        return True

    def eof_received(self) -> bool:
        return False  # close; connection_lost settles the reply

    # --- llhttp callbacks ---------------------------------------------------------------

    def _anomaly(self, kind: str) -> _Anomaly:
        self._kind = kind
        return _Anomaly(kind)

    def on_message_begin(self) -> None:
        if self._phase != _HEAD:  # a second reply after the one asked for
            raise self._anomaly("extra_bytes")
        if self._interim:
            self.headers = {}  # the interim head's are not the reply's

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._phase != _HEAD:
            return  # a trailer field: dropped
        # llhttp drops the whitespace before a value, not after: values compared below strip
        name = name.lower()
        headers = self.headers
        old = headers.get(name)
        headers[name] = value if old is None else old + b", " + value

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        if status < 200:
            if status == 101:
                raise self._anomaly("upgrade")
            if status < 100:
                raise self._anomaly("bad_status")
            self._interim += 1
            if self._interim > MAX_INTERIM:
                raise self._anomaly("interim_flood")
            return  # the final reply follows; llhttp ends this one now
        if status > 599:
            raise self._anomaly("bad_status")
        headers = self.headers
        coding = headers.get(b"transfer-encoding")
        if coding is not None:
            if parser.get_http_version() != "1.1":
                raise self._anomaly("http10_chunked")
            if coding.rstrip().lower() != b"chunked":  # gzip, chunked: a coded body; identity: none
                raise self._anomaly("transfer_coding")
        encoding = headers.get(b"content-encoding")
        if encoding is not None and encoding.rstrip().lower() != b"identity":
            raise self._anomaly("content_encoding")
        rid = self.request_id
        if rid is not None:
            echoed = headers.get(b"x-request-id")
            if echoed is None:
                if self.body_id is not None:
                    # the body names the request (a completion id made of it): a 2xx's is read
                    # before any of it is delivered; an error reply names nothing, and where
                    # the echo is required it is refused (sent again on a fresh connection)
                    if status < 300:
                        self.proof_due = True
                    elif self._must_echo:
                        self.unproven = True
                elif self._must_echo:
                    raise self._anomaly("request_id_missing")
            elif echoed.rstrip() != rid:
                raise self._anomaly("request_id_mismatch")
            else:
                self.echoed = True
        length = headers.get(b"content-length")
        if length is not None:
            self.length = int(length)  # llhttp has checked its digits
        elif coding is None and status != 204 and status != 304:
            self._until_close = True
        self.status = status
        self.keep_alive = parser.should_keep_alive()
        self._phase = _BODY
        if self._stream_span:  # a stream: idle_timeout from now on, moved by progress()
            self._mark = self._last_byte
            self._span = self._stream_span
            self._idle = True
        else:  # a buffered body: the deadline from the send, further off than the head's
            self._span = self._body_span
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _PAUSE_AT and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def on_message_complete(self) -> None:
        if self._phase == _BODY:
            self._finish()
        # else an interim reply ended: the final one follows

    # --- settling -----------------------------------------------------------------------

    def _finish(self) -> None:
        self._phase = _DONE
        self._eof = True
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        self._phase = _FAILED
        self.keep_alive = False
        if self._exc is None:
            self._exc = exc
        self._wake()

    def _protocol_error(self, kind: str) -> None:
        phase = _PHASE_NAMES[self._phase]
        self._fail(ProtocolError(kind))
        self.abort()
        self._pool.protocol_error(self, kind, phase)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _waiter_now(self) -> asyncio.Future[None]:
        """The future a read waits on until bytes arrive (the lazy timer armed for its
        deadline); TimeoutError when the deadline has passed."""
        loop = self._loop
        due = self._mark + self._span
        if loop.time() >= due:
            raise TimeoutError
        waiter = self._waiter = loop.create_future()
        timer = self._timer
        if timer is None or self._timer_due > due:  # none, or one that would fire late
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(due, self._on_timer)
            self._timer_due = due
        return waiter

    def _on_timer(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nobody waiting: the next wait re-arms
        due = self._mark + self._span
        if self._loop.time() >= due - 0.001:
            waiter.set_exception(TimeoutError())
        else:
            self._timer = self._loop.call_at(due, self._on_timer)
            self._timer_due = due

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # --- used by Response and Pool ----------------------------------------------------

    def send(
        self,
        data: bytes | tuple[bytes, bytes],
        *,
        head_timeout: float,
        body_timeout: float,
        stream: bool,
        request_id: bytes | None = None,
        must_echo: bool = False,
        reusable: bool = True,
        log_id: str | None = None,
        body_id: bytes | None = None,
    ) -> None:
        """Write a request; the head is due ``head_timeout`` from now.

        A buffered body is due ``body_timeout`` from now; a stream's body may go
        ``body_timeout`` without an event (see :meth:`progress`). ``must_echo``: a reply
        whose head does not carry ``request_id`` is refused. ``reusable``: the request
        asked for keep-alive (it did not say ``Connection: close``). ``log_id``: the request's
        id in log lines (the client's), not sent. ``body_id``: without the echo, a 2xx reply's
        body must name the request with this completion id (gateway/upstream/proof.py).
        """
        self._reset()
        self._phase = _HEAD
        self._mark = self._loop.time()
        self._span = head_timeout
        self._body_span = body_timeout
        self._stream_span = body_timeout if stream else 0.0
        self._idle = False
        self.request_id = request_id
        self.log_id = log_id
        self._must_echo = self.must_echo = must_echo and request_id is not None
        self.body_id = body_id if request_id is not None else None
        self.reusable = reusable
        self.sent += 1
        assert self.transport is not None
        # sent at the end of the loop's pass with its other writes: the engine's server
        # wakes once for them all (gateway/ops/coalesce.py)
        self._out.write(self.transport, data)

    def progress(self) -> None:
        """The bytes read so far carried an event: a stream's idle time restarts from them."""
        if self._idle:
            self._mark = self._last_byte

    async def read_head(self) -> None:
        while self._phase == _HEAD:  # the wait inline: no coroutine of its own per head
            waiter = self._waiter_now()
            try:
                await waiter
            finally:
                self._waiter = None
        if self._exc is not None and not self.status:
            raise self._exc

    async def readany(self) -> bytes:
        while True:
            if self._chunks:
                return self._take()
            if self._exc is not None:
                raise self._exc
            if self._eof:
                return b""
            waiter = self._waiter_now()  # the wait inline: no coroutine of its own per read
            try:
                await waiter
            finally:
                self._waiter = None

    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self._buffered = 0
        if self._paused:
            self._paused = False
            # the upstream was held back by us: its silence since is not its own
            self._last_byte = self._loop.time()
            if self.transport is not None and not self.closed:
                self.transport.resume_reading()
        return data

    def whole(self) -> bytes | None:
        """The rest of the body when all of it is in (what :meth:`readany` calls would return
        joined, without a wait); None: more is to come, or the reply failed (read on)."""
        if not self._eof or self._exc is not None:
            return None
        return self._take() if self._chunks else b""

    @property
    def complete(self) -> bool:
        return self._eof and not self._chunks and self._exc is None

    @property
    def phase(self) -> str:
        return _PHASE_NAMES[self._phase]

    def quiet(self) -> bool:
        """Before reuse: nothing is waiting on the socket that asyncio has not read yet.

        A reply to nobody may sit in the kernel's buffer, not yet handed to
        :meth:`data_received`; sent a request now, the connection would read it as the
        answer. Stray bytes are an ``extra_bytes`` anomaly; a pending close (the server's
        idle timeout) is not, but the connection is as useless. One ``select`` costs about
        a microsecond; over TLS (no look at the socket) the echo check is what remains.
        """
        transport = self.transport
        if self.closed or transport is None:
            return False
        fd = self._fd
        if fd == -1:  # looked up on the first reuse: plain TCP only
            sock = transport.get_extra_info("socket")
            tls = transport.get_extra_info("sslcontext") is not None
            fd = self._fd = sock.fileno() if sock is not None and not tls else -2
        if fd < 0:
            return True
        try:
            readable = select.select((fd,), (), (), 0)[0]
        except (OSError, ValueError):
            readable = [fd]
        if not readable:
            return True
        try:
            with socket.socket(fileno=socket.dup(fd)) as peek:
                stray = peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except OSError:
            stray = b""
        if stray:
            self._protocol_error("extra_bytes")  # phase idle: closes it, tells the pool
        else:
            self.abort()
        return False

    def refuse(self, kind: str) -> ProtocolError:
        """A reply found not to be this request's after its head (its body named another):
        the connection is closed and its pool told, as for any framing anomaly."""
        self._protocol_error(kind)
        return ProtocolError(kind)

    def park(self) -> None:
        """Between requests (idle in the pool): any byte is an anomaly. The timer is left
        armed: it fires once at the last request's deadline and finds nobody waiting, or the
        next request, due later, keeps it (:meth:`_waiter_now`): no timer made and cancelled
        per request."""
        self._phase = _IDLE

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
        self._cancel_timer()
        self._pool.forget(self)
