"""Shared by the upstream tests (test_connection, test_pool, test_upstream_client): a fake
transport that records calls, the table of replies (good, anomalous, cut) and what each must
give, and a scripted loopback upstream on 127.0.0.1 with a ``pools`` fixture."""

from __future__ import annotations

import asyncio
import gzip
import re
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from gateway.ops.config import UpstreamConfig
from gateway.upstream.connection import MAX_INTERIM, Connection
from gateway.upstream.exceptions import (
    BrokenResponse,
    Disconnected,
    HTTPClientError,
    ProtocolError,
)
from gateway.upstream.pool import Pool
from tests.fuzzing import EXAMPLES
from tests.waits import eventually

FAST = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# A parser that wrongly waits for more bytes fails on this timer instead of hanging.
_PARSER_TIMEOUT = 0.3
# How late a deadline may fire on a loaded machine (the tests share two cores with others);
# each deadline test asserts its lower bound closely and this ceiling only to catch a hang.
LATE = 2.0


# --- the parser, through a fake transport ------------------------------------------------


class FakeTransport:
    """Records what the connection asks of its socket."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []
        self._closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, data: Any) -> None:
        self.calls.append(("writelines", b"".join(data)))

    def pause_reading(self) -> None:
        self.calls.append(("pause_reading", b""))

    def resume_reading(self) -> None:
        self.calls.append(("resume_reading", b""))

    def abort(self) -> None:
        self.calls.append(("abort", b""))
        self._closing = True

    def is_closing(self) -> bool:
        return self._closing

    def count(self, name: str) -> int:
        return sum(1 for call, _ in self.calls if call == name)


class RecordingPool(Pool):
    """A pool that never connects and records the anomalies its connections report."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:1")
        self.anomalies: list[tuple[str, str]] = []

    def protocol_error(self, conn: Connection, kind: str, phase: str) -> None:
        self.anomalies.append((kind, phase))
        super().protocol_error(conn, kind, phase)


_REQUEST = b"GET /v1/models HTTP/1.1\r\nHost: up\r\n\r\n"
RID = b"req_abc123"


async def feed(
    pieces: list[bytes],
    *,
    eof: bool = False,
    stream: bool = False,
    within: float = _PARSER_TIMEOUT,
) -> tuple[Connection, FakeTransport]:
    """A connection that sent one request and then received ``pieces`` (and EOF if asked)."""
    conn = Connection(RecordingPool())
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.send(_REQUEST, head_timeout=within, body_timeout=within, stream=stream, request_id=RID)
    await asyncio.sleep(0)  # a pass's later writes wait for its end (gateway/ops/coalesce.py)
    assert transport.calls == [("write", _REQUEST)]
    for piece in pieces:
        conn.data_received(piece)
    if eof:
        conn.connection_lost(None)
    return conn, transport


async def read_all(conn: Connection) -> bytes:
    await conn.read_head()
    parts = []
    while data := await conn.readany():
        parts.append(data)
    return b"".join(parts)


async def outcome(pieces: list[bytes], *, eof: bool = False) -> tuple:
    """(status, body, reusable) for a reply; (exception type,) for a failed one, with the
    kind for a protocol error (which must also have aborted the connection, once)."""
    conn, transport = await feed(pieces, eof=eof)
    try:
        body = await read_all(conn)
    except ProtocolError as exc:
        pool = conn._pool
        assert isinstance(pool, RecordingPool)
        assert [kind for kind, _ in pool.anomalies] == [exc.kind]
        assert transport.count("abort") == 1 and conn.closed
        return (ProtocolError, exc.kind)
    except (HTTPClientError, TimeoutError) as exc:
        return (type(exc),)
    return (conn.status, body, conn.keep_alive and conn.complete)


def chunked_body(*chunks: bytes, trailers: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n" + trailers + b"\r\n"


_TEXT = b'{"id":"chatcmpl-1","choices":[{"message":{"content":"Hello there"}}]}'
_GZ = gzip.compress(_TEXT)
OK_HEAD = b"HTTP/1.1 200 OK\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@dataclass(frozen=True)
class Row:
    name: str
    wire: bytes
    expected: tuple  # (status, body, reusable), (exception type,) or (ProtocolError, kind)
    eof: bool = False  # the server closes after sending ``wire``


def _anomaly(name: str, wire: bytes, kind: str, *, eof: bool = False) -> Row:
    return Row(name, wire, (ProtocolError, kind), eof=eof)


GOOD = [
    Row("content-length", OK_HEAD + b"Content-Length: 5\r\n\r\nhello", (200, b"hello", True)),
    Row("content-length zero", OK_HEAD + b"Content-Length: 0\r\n\r\n", (200, b"", True)),
    Row(
        "status without reason phrase",
        b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok",
        (200, b"ok", True),
    ),
    Row(
        "error status with body",
        b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy",
        (503, b"busy", True),
    ),
    Row(
        "chunked with extensions and trailers",
        OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
        b'5;name=value\r\nhello\r\n1;a;b="q"\r\n \r\nA;ext\r\n0123456789\r\n'
        b"b\r\n, and more.\r\n0;last\r\nX-Trailer: t\r\nX-Other: u\r\n\r\n",
        (200, b"hello 0123456789, and more.", True),
    ),
    Row(
        "chunked without trailers",
        OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked_body(b"ab", b"c" * 300),
        (200, b"ab" + b"c" * 300, True),
    ),
    Row(
        "chunked, any case",
        OK_HEAD + b"transfer-encoding: Chunked \r\n\r\n" + chunked_body(b"ok"),
        (200, b"ok", True),
    ),
    Row(
        "chunked, empty body",
        OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        (200, b"", True),
    ),
    Row(
        "http/1.0 without framing: until close",
        b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\nall of it",
        (200, b"all of it", False),
        eof=True,
    ),
    Row(
        "http/1.1 without framing: until close",
        OK_HEAD + b"Server: x\r\n\r\nall of it",
        (200, b"all of it", False),
        eof=True,
    ),
    Row("until close, empty body", b"HTTP/1.0 200 OK\r\n\r\n", (200, b"", False), eof=True),
    Row(
        "100 continue, then 200",
        CONTINUE + OK_HEAD + b"Content-Length: 2\r\n\r\nok",
        (200, b"ok", True),
    ),
    Row(
        "two interim replies with headers, then 201",
        CONTINUE + b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nContent-Length: 3\r\n\r\nnew",
        (201, b"new", True),
    ),
    Row(
        f"{MAX_INTERIM} interim replies, then 200",
        CONTINUE * MAX_INTERIM + OK_HEAD + b"Content-Length: 2\r\n\r\nok",
        (200, b"ok", True),
    ),
    Row(
        "204 has no body", b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", (204, b"", True)
    ),
    Row(
        "304 has no body",
        b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
        (304, b"", True),
    ),
    Row(
        "identity encoding",
        OK_HEAD + b"Content-Encoding: identity\r\nContent-Length: 2\r\n\r\nok",
        (200, b"ok", True),
    ),
    Row(
        "request id echoed back",
        OK_HEAD + b"X-Request-Id: " + RID + b"\r\nContent-Length: 2\r\n\r\nok",
        (200, b"ok", True),
    ),
    Row(
        "connection: close -> not reusable",
        OK_HEAD + b"Connection: close\r\nContent-Length: 2\r\n\r\nok",
        (200, b"ok", False),
    ),
    Row(
        "connection: Close, case-insensitive",
        OK_HEAD + b"connection:  Keep-Alive, Close\r\nContent-Length: 2\r\n\r\nok",
        (200, b"ok", False),
    ),
    Row(
        "http/1.0 with keep-alive -> reusable",
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
        (200, b"ok", True),
    ),
    Row(
        "http/1.0 without keep-alive -> not reusable",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        (200, b"ok", False),
    ),
]

# Every row here closes the connection and the upstream's idle ones, and is counted.
ANOMALIES = [
    _anomaly(
        "extra bytes after a content-length body",
        OK_HEAD + b"Content-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n",
        "extra_bytes",
    ),
    _anomaly(
        "a second whole reply after the first (a double reply)",
        OK_HEAD + b"Content-Length: 2\r\n\r\nok" + OK_HEAD + b"Content-Length: 2\r\n\r\nno",
        "extra_bytes",
    ),
    _anomaly(
        "body past its content-length",
        OK_HEAD + b"Content-Length: 2\r\nConnection: close\r\n\r\nokay",
        "extra_bytes",
    ),
    _anomaly(
        "extra bytes after a chunked body",
        OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked_body(b"ok") + b"junk",
        "extra_bytes",
    ),
    _anomaly("extra bytes after a 204", b"HTTP/1.1 204 No Content\r\n\r\njunk", "extra_bytes"),
    _anomaly(
        "extra bytes after content-length 0",
        OK_HEAD + b"Content-Length: 0\r\n\r\njunk",
        "extra_bytes",
    ),
    _anomaly(
        "content-length and chunked",
        OK_HEAD
        + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunked_body(b"hello"),
        "length_and_chunked",
    ),
    _anomaly(
        "chunked and content-length",
        OK_HEAD
        + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
        + chunked_body(b"hello"),
        "length_and_chunked",
    ),
    _anomaly(
        "http/1.0, chunked, keep-alive",
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
        + chunked_body(b"ok"),
        "http10_chunked",
    ),
    _anomaly(
        "transfer coding gzip, chunked",
        OK_HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        "transfer_coding",
    ),
    _anomaly(
        "transfer coding chunked, gzip",
        OK_HEAD + b"Transfer-Encoding: chunked, gzip\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        "transfer_coding",
    ),
    _anomaly(
        "transfer coding identity",
        OK_HEAD + b"Transfer-Encoding: identity\r\n\r\nok",
        "transfer_coding",
    ),
    _anomaly(
        "101 switching protocols",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\nPRI *",
        "upgrade",
    ),
    _anomaly(
        "101 without upgrade headers",
        b"HTTP/1.1 101 Switching\r\n\r\n" + OK_HEAD + b"Content-Length: 2\r\n\r\nok",
        "upgrade",
    ),
    _anomaly("status 000", b"HTTP/1.1 000 OK\r\nContent-Length: 0\r\n\r\n", "bad_status"),
    _anomaly("status 099", b"HTTP/1.1 099 OK\r\nContent-Length: 0\r\n\r\n", "bad_status"),
    _anomaly("status 600", b"HTTP/1.1 600 OK\r\nContent-Length: 0\r\n\r\n", "bad_status"),
    _anomaly("status 1000", b"HTTP/1.1 1000 OK\r\nContent-Length: 0\r\n\r\n", "bad_status"),
    _anomaly(
        f"{MAX_INTERIM + 1} interim replies",
        CONTINUE * (MAX_INTERIM + 1) + OK_HEAD + b"Content-Length: 2\r\n\r\nok",
        "interim_flood",
    ),
    _anomaly(
        "gzip content-encoding",
        OK_HEAD + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(_GZ) + _GZ,
        "content_encoding",
    ),
    _anomaly(
        "x-gzip content-encoding, chunked",
        OK_HEAD + b"Content-Encoding: X-GZIP\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunked_body(_GZ),
        "content_encoding",
    ),
    _anomaly(
        "deflate content-encoding, until close",
        b"HTTP/1.0 200 OK\r\nContent-Encoding: deflate\r\n\r\nxx",
        "content_encoding",
        eof=True,
    ),
    _anomaly(
        "br content-encoding",
        OK_HEAD + b"Content-Encoding: br\r\nContent-Length: 2\r\n\r\nok",
        "content_encoding",
    ),
    _anomaly(
        "another request's id echoed",
        OK_HEAD + b"X-Request-Id: req_other\r\nContent-Length: 2\r\n\r\nok",
        "request_id_mismatch",
    ),
    # whatever else llhttp refuses
    _anomaly(
        "status line: not HTTP/1.x", b"HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n", "malformed"
    ),
    _anomaly("status line: HTTP/1.2", b"HTTP/1.2 200 OK\r\nContent-Length: 0\r\n\r\n", "malformed"),
    _anomaly("status line: not HTTP", b"ICY 200 OK\r\n\r\n", "malformed"),
    _anomaly("status line: non-digit code", b"HTTP/1.1 2x0 OK\r\n\r\n", "malformed"),
    _anomaly("status line: short code", b"HTTP/1.1 20\r\n\r\n", "malformed"),
    _anomaly("status line: garbage", b"<html>oops</html>\r\n\r\n", "malformed"),
    _anomaly("bare LF line ends", b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", "malformed"),
    _anomaly(
        "chunk size 0x10",
        OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n0x10\r\n" + b"a" * 16 + b"\r\n0\r\n\r\n",
        "malformed",
    ),
    _anomaly(
        "chunk size -1",
        OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n-1\r\nx\r\n0\r\n\r\n",
        "malformed",
    ),
    _anomaly(
        "chunk size empty",
        OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n\r\nx\r\n0\r\n\r\n",
        "malformed",
    ),
    _anomaly(
        "chunk size with a space before its extension",
        OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\nA ; ext\r\n0123456789\r\n0\r\n\r\n",
        "malformed",
    ),
    _anomaly(
        "chunk data longer than its size",
        OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
        "malformed",
    ),
    _anomaly("content-length -1", OK_HEAD + b"Content-Length: -1\r\n\r\nx", "malformed"),
    _anomaly("content-length non-digit", OK_HEAD + b"Content-Length: 12a\r\n\r\nx", "malformed"),
    _anomaly("content-length empty", OK_HEAD + b"Content-Length:\r\n\r\nx", "malformed"),
    _anomaly(
        "content-length of 30 digits",
        OK_HEAD + b"Content-Length: " + b"9" * 30 + b"\r\n\r\nx",
        "malformed",
    ),
    _anomaly(
        "content-length with a control character",
        OK_HEAD + b"Content-Length: \x0b2\r\n\r\nok",
        "malformed",
    ),
    _anomaly(
        "conflicting content-length",
        OK_HEAD + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
        "malformed",
    ),
    _anomaly(
        "identical repeated content-length",
        OK_HEAD + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        "malformed",
    ),
    _anomaly("header line without a colon", OK_HEAD + b"Content-Length 2\r\n\r\nok", "malformed"),
    _anomaly(
        "header name followed by a space", OK_HEAD + b"Content-Length : 2\r\n\r\nok", "malformed"
    ),
    _anomaly("header with an empty name", OK_HEAD + b": 2\r\n\r\nok", "malformed"),
    _anomaly(
        "control character in a header value",
        OK_HEAD + b"X-A: a\x01b\r\nContent-Length: 2\r\n\r\nok",
        "malformed",
    ),
    _anomaly(
        "folded header line", OK_HEAD + b"X-A: 1\r\n  2\r\nContent-Length: 2\r\n\r\nok", "malformed"
    ),
]

CUT = [
    Row(
        "cut mid-body (content-length)",
        OK_HEAD + b"Content-Length: 10\r\n\r\nhello",
        (BrokenResponse,),
        eof=True,
    ),
    Row(
        "cut mid-body (chunked)",
        OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhel",
        (BrokenResponse,),
        eof=True,
    ),
    Row(
        "cut in the trailers",
        OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\nX: 1",
        (BrokenResponse,),
        eof=True,
    ),
    Row("cut in the head, after some bytes", OK_HEAD + b"Content-Len", (BrokenResponse,), eof=True),
    Row("cut after a 100 continue", CONTINUE, (BrokenResponse,), eof=True),
    Row("closed before any byte", b"", (Disconnected,), eof=True),
]

TABLE = GOOD + ANOMALIES + CUT


def table_params(rows: list[Row]) -> Any:
    return pytest.mark.parametrize("row", rows, ids=[r.name for r in rows])


# --- a scripted loopback upstream -----------------------------------------------------------

Handler = Callable[["Upstream", int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Upstream:
    """A server on 127.0.0.1: its ``i``-th connection runs ``handler(self, i, reader, writer)``.

    Records each request's bytes and how many connections saw the client close.
    """

    def __init__(self, handler: Handler, *, tls: ssl.SSLContext | None = None) -> None:
        self._handler = handler
        self._tls = tls
        self.connections = 0
        self.requests: list[bytes] = []
        self.eofs = 0
        self.eof = asyncio.Event()
        self.stop = asyncio.Event()  # stalled handlers wait on this
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> Upstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self._tls)
        port = self._server.sockets[0].getsockname()[1]
        self.host = f"127.0.0.1:{port}"
        self.url = f"{'https' if self._tls else 'http'}://{self.host}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.stop.set()
        self._server.close()
        for writer in self._writers:
            writer.close()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=1.0)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        await self._server.wait_closed()
        await asyncio.sleep(0)  # let the closed transports release their sockets

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        self._writers.append(writer)
        index = self.connections
        self.connections += 1
        try:
            await self._handler(self, index, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client left, or the test is over
        finally:
            writer.close()
            self._tasks.discard(task)  # type: ignore[arg-type]

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?im)^content-length: *(\d+)\r$", head)
        request = head + (await reader.readexactly(int(length[1])) if length else b"")
        self.requests.append(request)
        return request

    async def wait_client_close(self, reader: asyncio.StreamReader) -> None:
        """Until the client closes its side; anything it sends first is an error."""
        try:
            extra = await reader.read(1)
        except ConnectionError:
            extra = b""
        assert extra == b""
        self.eofs += 1
        self.eof.set()


def http_reply(body: bytes = b"ok", *extra: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\n"
        + b"".join(h + b"\r\n" for h in extra)
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


async def keep_serving(
    srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Replies "ok" to every request on every connection, until the client closes."""
    while True:
        try:
            await srv.read_request(reader)
        except asyncio.IncompleteReadError as exc:
            assert exc.partial == b""
            srv.eofs += 1
            srv.eof.set()
            return
        writer.write(http_reply())


def partial_body_handler(length: int, first: bytes) -> Handler:
    """Replies with the head and the first bytes of a ``length``-byte body, then waits."""

    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % length + first)
        await srv.wait_client_close(reader)

    return handler


async def pool_get(
    pool: Pool, target: str = "/v1/models", body: bytes | None = None, *, method: str = "GET"
) -> bytes:
    resp = await pool.request(method, target, body, head_timeout=1.0, body_timeout=1.0)
    data = await resp.read()
    resp.release()
    return data


async def settle(condition: Callable[[], bool]) -> None:
    """Until ``condition()`` holds (closes land a few loop iterations later); 1 s at most."""
    await eventually(condition, "the connections settled", within=1.0, every=0.005)


def drip_handler(head: bytes, pieces: list[bytes], gap: float) -> Handler:
    """Replies with ``head``, then each piece ``gap`` seconds apart, then the chunked end."""

    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(head)
        for piece in pieces:
            await asyncio.sleep(gap)
            writer.write(piece)
        writer.write(b"0\r\n\r\n")
        await srv.wait_client_close(reader)

    return handler


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def upstream_config(srv: Upstream) -> UpstreamConfig:
    # keep-alive from the first request ("auto" is tests/unit/upstream/test_reuse.py's subject)
    return UpstreamConfig(
        name="u",
        base_url=srv.url + "/v1",
        connect_timeout=1.0,
        header_timeout=1.0,
        idle_timeout=1.0,
        keepalive="always",
    )


def echo_handler(stray_after: float = 0.05) -> Handler:
    """Replies with the request's path as its body, echoing its X-Request-Id; a request to
    /double is answered twice, the second copy ``stray_after`` seconds later."""

    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            try:
                request = await srv.read_request(reader)
            except asyncio.IncompleteReadError:
                srv.eofs += 1
                srv.eof.set()
                return
            path = request.split(b" ")[1]
            rid = re.search(rb"(?im)^x-request-id: *(\S+)\r$", request)
            echo = (b"X-Request-Id: " + rid[1],) if rid else ()
            writer.write(http_reply(path, *echo))
            if path == b"/double":
                await asyncio.sleep(stray_after)
                writer.write(http_reply(path, *echo))

    return handler
