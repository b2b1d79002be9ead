"""One upstream HTTP/1.1 connection: an ``asyncio.Protocol`` that parses replies as bytes arrive.

The reply head (1xx skipped), then the body by its framing: ``Content-Length``,
``chunked`` (extensions and trailers read and dropped), or until the server closes
(RFC 9112 section 6.3); no body after HEAD, 204 or 304. ``gzip``/``deflate``
content codings are decoded; another transfer coding than chunked is refused. The
pool (gateway/httpclient.py) sends a request with :meth:`Connection.send` and reads
with :meth:`Connection.read_head` and :meth:`Connection.readany`.

Timeouts without a timer per read: one timer per connection, re-armed lazily from
the time of the last progress, so a chunk costs a float store. Read backpressure:
past ``_PAUSE_AT`` unread bytes the socket stops being read.

Errors: :class:`Disconnected` (the connection ended before any byte of the reply:
the request can be retried), :class:`BrokenResponse` (a reply cut or malformed),
``TimeoutError`` (no progress within the phase's timeout).
"""

from __future__ import annotations

import asyncio
import re
import zlib
from typing import Protocol

_HEAD_LIMIT = 64 * 1024
_PAUSE_AT = 256 * 1024
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")
_NO_BODY = frozenset((204, 304))

# body framing states
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILERS, _UNTIL_CLOSE, _DONE = range(8)


class HTTPClientError(Exception):
    """Base of the upstream client's errors."""


class Disconnected(HTTPClientError):
    """The connection ended before any byte of the reply arrived (safe to retry once)."""


class BrokenResponse(HTTPClientError):
    """The reply was malformed, or cut before its framing said it ended."""


class Owner(Protocol):
    """What a connection needs of its pool."""

    loop: asyncio.AbstractEventLoop

    def forget(self, conn: Connection) -> None: ...


class Connection(asyncio.Protocol):
    __slots__ = (
        "_body_timeout", "_buffered", "_chunk_left", "_chunks", "_decoder", "_eof", "_exc",
        "_got_bytes", "_last", "_loop", "_paused", "_pool", "_remaining", "_state", "_tail",
        "_timeout", "_timer", "_waiter", "closed", "headers", "idle_since", "keep_alive",
        "no_body", "status", "transport",
    )

    def __init__(self, pool: Owner) -> None:
        self._pool = pool
        self._loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timeout = 0.0
        self._body_timeout = 0.0
        self._last = 0.0
        self._reset()

    def _reset(self) -> None:
        self._state = _DONE
        self._tail = b""
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._eof = False
        self._exc: BaseException | None = None
        self._got_bytes = False
        self._remaining = 0
        self._chunk_left = 0
        self._decoder: zlib._Decompress | None = None
        self._paused = False
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.keep_alive = False
        self.no_body = False

    # --- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.forget(self)
        state = self._state
        if state == _UNTIL_CLOSE:
            if exc is None:
                self._finish()  # an orderly close is how such a body ends
            else:
                self._fail(BrokenResponse("connection reset in the reply's body"))
        elif state == _HEAD:
            self._fail(BrokenResponse("connection lost in the reply's head") if self._got_bytes
                       else Disconnected("connection closed before a reply"))
        elif state != _DONE:
            self._fail(BrokenResponse("connection lost in the reply's body"))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def data_received(self, data: bytes) -> None:
        self._last = self._loop.time()
        state = self._state
        if state == _DONE:  # bytes nobody asked for: this connection cannot be trusted
            self.keep_alive = False
            self.abort()
            return
        self._got_bytes = True
        try:
            if state == _HEAD:
                data = self._tail + data
                self._tail = b""
                data = self._parse_head(data)
                if self._state == _HEAD:
                    return
                self._wake()
                if not data:
                    return
                state = self._state
            if state == _LENGTH:
                n = self._remaining
                if len(data) >= n:
                    if len(data) > n:
                        self.keep_alive = False
                    self._deliver(data[:n] if len(data) > n else data)
                    self._finish()
                else:
                    self._remaining = n - len(data)
                    self._deliver(data)
            elif state == _UNTIL_CLOSE:
                self._deliver(data)
            elif state != _DONE:
                self._parse_chunked(data)
        except BrokenResponse as exc:
            self._fail(exc)
            self.abort()
        except zlib.error:
            self._fail(BrokenResponse("corrupt compressed body"))
            self.abort()

    def eof_received(self) -> bool:
        return False  # close; connection_lost settles the reply

    # --- parsing ----------------------------------------------------------------------

    def _parse_head(self, data: bytes) -> bytes:
        """Consume a complete head from ``data``; returns what follows it."""
        while True:
            end = data.find(b"\r\n\r\n")
            if end < 0 or end > _HEAD_LIMIT:
                if end > _HEAD_LIMIT or len(data) > _HEAD_LIMIT:
                    raise BrokenResponse("reply head too large")
                self._tail = data
                return b""
            lines = data[:end].split(b"\r\n")
            data = data[end + 4:]
            version, _, rest = lines[0].partition(b" ")
            code = rest[:3]
            if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
                raise BrokenResponse("not an HTTP/1.x reply")
            status = int(code)
            if 100 <= status < 200:  # 100 Continue, 103 Early Hints: the reply follows
                continue
            headers: dict[bytes, bytes] = {}
            for line in lines[1:]:
                name, sep, value = line.partition(b":")
                if not sep or not name or name[-1:] in b" \t":
                    raise BrokenResponse("malformed header line")
                name = name.lower()
                value = value.strip()
                if name in headers:
                    if name == b"content-length":
                        if headers[name] != value:
                            raise BrokenResponse("conflicting Content-Length")
                        continue  # the same length twice is one length (RFC 9110 8.6)
                    value = headers[name] + b", " + value
                headers[name] = value
            length = headers.get(b"content-length")
            if length is not None and not length.isdigit():
                raise BrokenResponse("bad Content-Length")
            conn = headers.get(b"connection", b"").lower()
            if version == b"HTTP/1.1":
                self.keep_alive = b"close" not in conn
            else:
                self.keep_alive = b"keep-alive" in conn
            encoding = headers.get(b"content-encoding", b"identity").lower()
            if encoding in (b"gzip", b"x-gzip"):
                self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
            elif encoding == b"deflate":
                self._decoder = zlib.decompressobj()
            elif encoding != b"identity":
                raise BrokenResponse("unsupported Content-Encoding")
            coding = headers.get(b"transfer-encoding")
            # only chunked is decoded here; a body under another transfer coding
            # (gzip, chunked) would come out as garbage, so it is refused instead
            if coding is not None and coding.lower().replace(b" ", b"") != b"chunked":
                raise BrokenResponse("unsupported Transfer-Encoding")
            self.status = status
            self.headers = headers
            if self.no_body or status in _NO_BODY:
                if data:
                    self.keep_alive = False
                self._finish()
                return b""
            if coding is not None:
                self._state = _CHUNK_SIZE
            elif length is not None:
                self._remaining = int(length)
                if self._remaining == 0:
                    if data:
                        self.keep_alive = False
                    self._finish()
                    return b""
                self._state = _LENGTH
            else:
                self.keep_alive = False
                self._state = _UNTIL_CLOSE
            if self._body_timeout < self._timeout and self._timer is not None:
                self._timer.cancel()  # re-armed from the next wait, at the shorter timeout
                self._timer = None
            self._timeout = self._body_timeout
            return data

    def _parse_chunked(self, data: bytes) -> None:
        if self._tail:
            data = self._tail + data
            self._tail = b""
        pos = 0
        size = len(data)
        out: list[bytes] = []
        state = self._state
        while pos < size:
            if state == _CHUNK_DATA:
                take = self._chunk_left
                if size - pos >= take:
                    out.append(data[pos:pos + take])
                    pos += take
                    state = _CHUNK_CRLF
                else:
                    out.append(data[pos:])
                    self._chunk_left = take - (size - pos)
                    pos = size
            elif state == _CHUNK_CRLF:
                if size - pos < 2:
                    break
                if not data.startswith(b"\r\n", pos):
                    raise BrokenResponse("bad chunk framing")
                pos += 2
                state = _CHUNK_SIZE
            else:
                nl = data.find(b"\r\n", pos)
                if nl < 0:
                    if size - pos > 4096:
                        raise BrokenResponse("chunk size line too long")
                    break
                line = data[pos:nl]
                pos = nl + 2
                if state == _TRAILERS:
                    if not line:  # the empty line after the trailers: the reply is complete
                        self._state = _DONE
                        if pos < size:
                            self.keep_alive = False
                        if out:
                            self._deliver(b"".join(out))
                        self._finish()
                        return
                    continue
                if not _HEX.fullmatch(line):  # else extensions (";name=value") or spaces
                    line = line.split(b";", 1)[0].strip()
                    if not _HEX.fullmatch(line):
                        raise BrokenResponse("bad chunk size")
                n = int(line, 16)
                if n == 0:
                    state = _TRAILERS
                    continue
                end = pos + n
                if end + 2 <= size:  # the usual case: the whole chunk and its CRLF are here
                    if not data.startswith(b"\r\n", end):
                        raise BrokenResponse("bad chunk framing")
                    out.append(data[pos:end])
                    pos = end + 2
                    continue
                self._chunk_left = n
                state = _CHUNK_DATA
        self._state = state
        if pos < size:
            self._tail = data[pos:]
        if out:
            self._deliver(out[0] if len(out) == 1 else b"".join(out))

    # --- delivery ---------------------------------------------------------------------

    def _deliver(self, data: bytes) -> None:
        if self._decoder is not None:
            data = self._decoder.decompress(data)
            if not data:
                return
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _PAUSE_AT and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def _finish(self) -> None:
        decoder = self._decoder
        if decoder is not None:
            self._decoder = None
            rest = decoder.flush()
            if rest:
                self._chunks.append(rest)
            if not decoder.eof:  # the framing ended inside the compressed stream
                self._fail(BrokenResponse("compressed body cut short"))
                return
        self._state = _DONE
        self._eof = True
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        self._state = _DONE
        self.keep_alive = False
        if self._exc is None:
            self._exc = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def _wait(self) -> None:
        loop = self._loop
        self._last = loop.time()
        waiter = self._waiter = loop.create_future()
        if self._timer is None:
            self._timer = loop.call_at(self._last + self._timeout, self._on_timer)
        try:
            await waiter
        finally:
            self._waiter = None

    def _on_timer(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nobody waiting: the next wait re-arms
        due = self._last + self._timeout
        if self._loop.time() >= due - 0.001:
            waiter.set_exception(TimeoutError())
        else:
            self._timer = self._loop.call_at(due, self._on_timer)

    # --- used by Response and Pool ----------------------------------------------------

    def send(self, data: bytes | tuple[bytes, bytes], *, head_timeout: float,
             body_timeout: float, no_body: bool) -> None:
        self._reset()
        self._state = _HEAD
        self._timeout = head_timeout
        self._body_timeout = body_timeout
        self.no_body = no_body
        assert self.transport is not None
        if isinstance(data, tuple):
            self.transport.writelines(data)
        else:
            self.transport.write(data)

    async def read_head(self) -> None:
        while self._state == _HEAD:
            if self._exc is not None:
                raise self._exc
            await self._wait()
        if self._exc is not None and not self.status:
            raise self._exc

    async def readany(self) -> bytes:
        while True:
            chunks = self._chunks
            if chunks:
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                self._chunks = []
                self._buffered = 0
                if self._paused:
                    self._paused = False
                    if self.transport is not None and not self.closed:
                        self.transport.resume_reading()
                return data
            if self._exc is not None:
                raise self._exc
            if self._eof:
                return b""
            await self._wait()

    @property
    def complete(self) -> bool:
        return self._eof and not self._chunks and self._exc is None

    def park(self) -> None:
        """Between requests (idle in the pool): no timer runs."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
        self._pool.forget(self)
