"""gateway/upstream/: the connection's framing (llhttp) fed byte by byte, its anomalies,
deadlines and caps, and the pool and client over loopback sockets.

Protocol facts these tests pin (RFC 9112, RFC 9110):

* a reply's body is framed by ``Transfer-Encoding: chunked``, else by ``Content-Length``,
  else it runs until the server closes the connection; both at once is refused (it is
  how responses are smuggled), and so is a transfer coding other than ``chunked`` and any
  ``Transfer-Encoding`` in an HTTP/1.0 reply;
* 1xx replies are interim: the real reply follows on the same connection (at most 8 are
  taken; ``101`` was never asked for);
* 204 and 304 replies have no body whatever their headers say;
* a chunk size is bare hex digits, optionally followed by ``;extensions``; the last chunk
  (size 0) may be followed by trailer fields, then an empty line;
* HTTP/1.1 connections persist unless ``Connection: close``; HTTP/1.0 ones only with
  ``Connection: keep-alive``;
* bytes after a reply's end answer no request: on a reused connection they would be read
  as the next request's reply, so they close the connection (and the upstream's idle
  ones) and fail the reply they follow;
* the gateway asks for ``identity``: any other ``Content-Encoding`` is refused;
* TCP may cut the bytes anywhere: the parser's result must not depend on where.

The parser tests drive a real ``Connection`` through a fake transport that records
calls; the pool tests use an in-process ``asyncio`` server on 127.0.0.1 speaking
scripted bytes. Every server and socket a test opens is closed by that test.
"""

from __future__ import annotations

import asyncio
import gzip
import re
import socket
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from gateway import errors
from gateway.ops.config import UpstreamConfig
from gateway.ops.metrics import PROTOCOL_ERRORS, Metrics
from gateway.text.redact import secrets_of
from gateway.upstream import UpstreamClient
from gateway.upstream import client as client_module
from gateway.upstream import pool as pool_module
from gateway.upstream.connection import MAX_INTERIM, Connection
from gateway.upstream.exceptions import (
    BrokenResponse,
    ConnectFailed,
    Disconnected,
    HTTPClientError,
    PoolTimeout,
    ProtocolError,
)
from gateway.upstream.pool import Pool, Response
from tests.fuzzing import EXAMPLES

FAST = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

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
_RID = b"req_abc123"


async def _feed(
    pieces: list[bytes], *, eof: bool = False, stream: bool = False,
    within: float = _PARSER_TIMEOUT,
) -> tuple[Connection, FakeTransport]:
    """A connection that sent one request and then received ``pieces`` (and EOF if asked)."""
    conn = Connection(RecordingPool())
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.send(_REQUEST, head_timeout=within, body_timeout=within, stream=stream,
              request_id=_RID)
    assert transport.calls == [("write", _REQUEST)]
    for piece in pieces:
        conn.data_received(piece)
    if eof:
        conn.connection_lost(None)
    return conn, transport


async def _read_all(conn: Connection) -> bytes:
    await conn.read_head()
    parts = []
    while data := await conn.readany():
        parts.append(data)
    return b"".join(parts)


async def _outcome(pieces: list[bytes], *, eof: bool = False) -> tuple:
    """(status, body, reusable) for a reply; (exception type,) for a failed one, with the
    kind for a protocol error (which must also have aborted the connection, once)."""
    conn, transport = await _feed(pieces, eof=eof)
    try:
        body = await _read_all(conn)
    except ProtocolError as exc:
        pool = conn._pool
        assert isinstance(pool, RecordingPool)
        assert [kind for kind, _ in pool.anomalies] == [exc.kind]
        assert transport.count("abort") == 1 and conn.closed
        return (ProtocolError, exc.kind)
    except (HTTPClientError, TimeoutError) as exc:
        return (type(exc),)
    return (conn.status, body, conn.keep_alive and conn.complete)


def _chunked(*chunks: bytes, trailers: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n" + trailers + b"\r\n"


_TEXT = b'{"id":"chatcmpl-1","choices":[{"message":{"content":"Hello there"}}]}'
_GZ = gzip.compress(_TEXT)
_OK_HEAD = b"HTTP/1.1 200 OK\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@dataclass(frozen=True)
class Row:
    name: str
    wire: bytes
    expected: tuple  # (status, body, reusable), (exception type,) or (ProtocolError, kind)
    eof: bool = False  # the server closes after sending ``wire``


def _anomaly(name: str, wire: bytes, kind: str, *, eof: bool = False) -> Row:
    return Row(name, wire, (ProtocolError, kind), eof=eof)


GOOD = [
    Row("content-length", _OK_HEAD + b"Content-Length: 5\r\n\r\nhello", (200, b"hello", True)),
    Row("content-length zero", _OK_HEAD + b"Content-Length: 0\r\n\r\n", (200, b"", True)),
    Row("status without reason phrase", b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok",
        (200, b"ok", True)),
    Row("error status with body", b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy",
        (503, b"busy", True)),
    Row("chunked with extensions and trailers",
        _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
        b"5;name=value\r\nhello\r\n1;a;b=\"q\"\r\n \r\nA;ext\r\n0123456789\r\n"
        b"b\r\n, and more.\r\n0;last\r\nX-Trailer: t\r\nX-Other: u\r\n\r\n",
        (200, b"hello 0123456789, and more.", True)),
    Row("chunked without trailers", _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
        + _chunked(b"ab", b"c" * 300), (200, b"ab" + b"c" * 300, True)),
    Row("chunked, any case", _OK_HEAD + b"transfer-encoding: Chunked \r\n\r\n" + _chunked(b"ok"),
        (200, b"ok", True)),
    Row("chunked, empty body", _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        (200, b"", True)),
    Row("http/1.0 without framing: until close", b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\nall of it",
        (200, b"all of it", False), eof=True),
    Row("http/1.1 without framing: until close", _OK_HEAD + b"Server: x\r\n\r\nall of it",
        (200, b"all of it", False), eof=True),
    Row("until close, empty body", b"HTTP/1.0 200 OK\r\n\r\n", (200, b"", False), eof=True),
    Row("100 continue, then 200", _CONTINUE + _OK_HEAD + b"Content-Length: 2\r\n\r\nok",
        (200, b"ok", True)),
    Row("two interim replies with headers, then 201",
        _CONTINUE + b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nContent-Length: 3\r\n\r\nnew", (201, b"new", True)),
    Row(f"{MAX_INTERIM} interim replies, then 200",
        _CONTINUE * MAX_INTERIM + _OK_HEAD + b"Content-Length: 2\r\n\r\nok", (200, b"ok", True)),
    Row("204 has no body", b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
        (204, b"", True)),
    Row("304 has no body", b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
        (304, b"", True)),
    Row("identity encoding",
        _OK_HEAD + b"Content-Encoding: identity\r\nContent-Length: 2\r\n\r\nok",
        (200, b"ok", True)),
    Row("request id echoed back",
        _OK_HEAD + b"X-Request-Id: " + _RID + b"\r\nContent-Length: 2\r\n\r\nok",
        (200, b"ok", True)),
    Row("connection: close -> not reusable",
        _OK_HEAD + b"Connection: close\r\nContent-Length: 2\r\n\r\nok", (200, b"ok", False)),
    Row("connection: Close, case-insensitive",
        _OK_HEAD + b"connection:  Keep-Alive, Close\r\nContent-Length: 2\r\n\r\nok",
        (200, b"ok", False)),
    Row("http/1.0 with keep-alive -> reusable",
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
        (200, b"ok", True)),
    Row("http/1.0 without keep-alive -> not reusable",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", (200, b"ok", False)),
]

# Every row here closes the connection and the upstream's idle ones, and is counted.
ANOMALIES = [
    _anomaly("extra bytes after a content-length body",
             _OK_HEAD + b"Content-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n", "extra_bytes"),
    _anomaly("a second whole reply after the first (a double reply)",
             _OK_HEAD + b"Content-Length: 2\r\n\r\nok" + _OK_HEAD + b"Content-Length: 2\r\n\r\nno",
             "extra_bytes"),
    _anomaly("body past its content-length",
             _OK_HEAD + b"Content-Length: 2\r\nConnection: close\r\n\r\nokay", "extra_bytes"),
    _anomaly("extra bytes after a chunked body",
             _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(b"ok") + b"junk",
             "extra_bytes"),
    _anomaly("extra bytes after a 204", b"HTTP/1.1 204 No Content\r\n\r\njunk", "extra_bytes"),
    _anomaly("extra bytes after content-length 0",
             _OK_HEAD + b"Content-Length: 0\r\n\r\njunk", "extra_bytes"),
    _anomaly("content-length and chunked",
             _OK_HEAD + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
             + _chunked(b"hello"), "length_and_chunked"),
    _anomaly("chunked and content-length",
             _OK_HEAD + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
             + _chunked(b"hello"), "length_and_chunked"),
    _anomaly("http/1.0, chunked, keep-alive",
             b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
             + _chunked(b"ok"), "http10_chunked"),
    _anomaly("transfer coding gzip, chunked", _OK_HEAD + b"Transfer-Encoding: gzip, chunked"
             b"\r\n\r\n2\r\nok\r\n0\r\n\r\n", "transfer_coding"),
    _anomaly("transfer coding chunked, gzip", _OK_HEAD + b"Transfer-Encoding: chunked, gzip"
             b"\r\n\r\n2\r\nok\r\n0\r\n\r\n", "transfer_coding"),
    _anomaly("transfer coding identity", _OK_HEAD + b"Transfer-Encoding: identity\r\n\r\nok",
             "transfer_coding"),
    _anomaly("101 switching protocols",
             b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n"
             b"PRI *", "upgrade"),
    _anomaly("101 without upgrade headers", b"HTTP/1.1 101 Switching\r\n\r\n" + _OK_HEAD
             + b"Content-Length: 2\r\n\r\nok", "upgrade"),
    _anomaly("status 000", b"HTTP/1.1 000 OK\r\nContent-Length: 0\r\n\r\n", "bad_status"),
    _anomaly("status 099", b"HTTP/1.1 099 OK\r\nContent-Length: 0\r\n\r\n", "bad_status"),
    _anomaly("status 600", b"HTTP/1.1 600 OK\r\nContent-Length: 0\r\n\r\n", "bad_status"),
    _anomaly("status 1000", b"HTTP/1.1 1000 OK\r\nContent-Length: 0\r\n\r\n", "bad_status"),
    _anomaly(f"{MAX_INTERIM + 1} interim replies",
             _CONTINUE * (MAX_INTERIM + 1) + _OK_HEAD + b"Content-Length: 2\r\n\r\nok",
             "interim_flood"),
    _anomaly("gzip content-encoding", _OK_HEAD + b"Content-Encoding: gzip\r\nContent-Length: %d"
             b"\r\n\r\n" % len(_GZ) + _GZ, "content_encoding"),
    _anomaly("x-gzip content-encoding, chunked", _OK_HEAD + b"Content-Encoding: X-GZIP\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(_GZ), "content_encoding"),
    _anomaly("deflate content-encoding, until close", b"HTTP/1.0 200 OK\r\n"
             b"Content-Encoding: deflate\r\n\r\nxx", "content_encoding", eof=True),
    _anomaly("br content-encoding", _OK_HEAD + b"Content-Encoding: br\r\nContent-Length: 2"
             b"\r\n\r\nok", "content_encoding"),
    _anomaly("another request's id echoed",
             _OK_HEAD + b"X-Request-Id: req_other\r\nContent-Length: 2\r\n\r\nok",
             "request_id_mismatch"),
    # whatever else llhttp refuses
    _anomaly("status line: not HTTP/1.x", b"HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n",
             "malformed"),
    _anomaly("status line: HTTP/1.2", b"HTTP/1.2 200 OK\r\nContent-Length: 0\r\n\r\n",
             "malformed"),
    _anomaly("status line: not HTTP", b"ICY 200 OK\r\n\r\n", "malformed"),
    _anomaly("status line: non-digit code", b"HTTP/1.1 2x0 OK\r\n\r\n", "malformed"),
    _anomaly("status line: short code", b"HTTP/1.1 20\r\n\r\n", "malformed"),
    _anomaly("status line: garbage", b"<html>oops</html>\r\n\r\n", "malformed"),
    _anomaly("bare LF line ends", b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", "malformed"),
    _anomaly("chunk size 0x10", _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n0x10\r\n"
             + b"a" * 16 + b"\r\n0\r\n\r\n", "malformed"),
    _anomaly("chunk size -1", _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n-1\r\nx\r\n0\r\n\r\n",
             "malformed"),
    _anomaly("chunk size empty", _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n\r\nx\r\n0\r\n"
             b"\r\n", "malformed"),
    _anomaly("chunk size with a space before its extension", _OK_HEAD
             + b"Transfer-Encoding: chunked\r\n\r\nA ; ext\r\n0123456789\r\n0\r\n\r\n",
             "malformed"),
    _anomaly("chunk data longer than its size", _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
             b"2\r\nabc\r\n0\r\n\r\n", "malformed"),
    _anomaly("content-length -1", _OK_HEAD + b"Content-Length: -1\r\n\r\nx", "malformed"),
    _anomaly("content-length non-digit", _OK_HEAD + b"Content-Length: 12a\r\n\r\nx", "malformed"),
    _anomaly("content-length empty", _OK_HEAD + b"Content-Length:\r\n\r\nx", "malformed"),
    _anomaly("content-length of 30 digits", _OK_HEAD + b"Content-Length: " + b"9" * 30
             + b"\r\n\r\nx", "malformed"),
    _anomaly("content-length with a control character", _OK_HEAD + b"Content-Length: \x0b2"
             b"\r\n\r\nok", "malformed"),
    _anomaly("conflicting content-length", _OK_HEAD + b"Content-Length: 2\r\nContent-Length: 3"
             b"\r\n\r\nabc", "malformed"),
    _anomaly("identical repeated content-length", _OK_HEAD + b"Content-Length: 5\r\n"
             b"Content-Length: 5\r\n\r\nhello", "malformed"),
    _anomaly("header line without a colon", _OK_HEAD + b"Content-Length 2\r\n\r\nok", "malformed"),
    _anomaly("header name followed by a space", _OK_HEAD + b"Content-Length : 2\r\n\r\nok",
             "malformed"),
    _anomaly("header with an empty name", _OK_HEAD + b": 2\r\n\r\nok", "malformed"),
    _anomaly("control character in a header value", _OK_HEAD + b"X-A: a\x01b\r\n"
             b"Content-Length: 2\r\n\r\nok", "malformed"),
    _anomaly("folded header line", _OK_HEAD + b"X-A: 1\r\n  2\r\nContent-Length: 2\r\n\r\nok",
             "malformed"),
]

CUT = [
    Row("cut mid-body (content-length)", _OK_HEAD + b"Content-Length: 10\r\n\r\nhello",
        (BrokenResponse,), eof=True),
    Row("cut mid-body (chunked)", _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhel",
        (BrokenResponse,), eof=True),
    Row("cut in the trailers", _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\nX: 1",
        (BrokenResponse,), eof=True),
    Row("cut in the head, after some bytes", _OK_HEAD + b"Content-Len", (BrokenResponse,),
        eof=True),
    Row("cut after a 100 continue", _CONTINUE, (BrokenResponse,), eof=True),
    Row("closed before any byte", b"", (Disconnected,), eof=True),
]

TABLE = GOOD + ANOMALIES + CUT


def _params(rows: list[Row]) -> Any:
    return pytest.mark.parametrize("row", rows, ids=[r.name for r in rows])


def test_every_anomaly_kind_is_a_metric_label() -> None:
    kinds = {row.expected[1] for row in ANOMALIES}
    assert kinds | {"head_too_large"} == set(PROTOCOL_ERRORS)


@_params(TABLE)
async def test_table_whole(row: Row) -> None:
    pieces = [row.wire] if row.wire else []
    assert await _outcome(pieces, eof=row.eof) == row.expected


@_params(TABLE)
async def test_table_split_at_every_offset(row: Row) -> None:
    """Where TCP cuts the bytes changes nothing."""
    for cut in range(1, len(row.wire)):
        pieces = [row.wire[:cut], row.wire[cut:]]
        assert await _outcome(pieces, eof=row.eof) == row.expected, cut


_BYTEWISE = [r for r in TABLE if r.name in {
    "content-length", "chunked with extensions and trailers", "100 continue, then 200",
    "http/1.0 without framing: until close", "chunk size 0x10", "content-length and chunked",
    "extra bytes after a chunked body", "cut mid-body (chunked)", "another request's id echoed",
}]


@_params(_BYTEWISE)
async def test_table_byte_by_byte(row: Row) -> None:
    pieces = [row.wire[i:i + 1] for i in range(len(row.wire))]
    assert await _outcome(pieces, eof=row.eof) == row.expected


_HEAD_ERRORS = [r for r in ANOMALIES + CUT if r.name.startswith(("status line", "header"))
                or r.name in {"conflicting content-length", "cut in the head, after some bytes",
                              "cut after a 100 continue", "closed before any byte",
                              "content-length and chunked", "101 switching protocols",
                              "status 600", "another request's id echoed", "gzip content-encoding",
                              f"{MAX_INTERIM + 1} interim replies"}]


@_params(_HEAD_ERRORS)
async def test_a_broken_head_raises_from_read_head(row: Row) -> None:
    """So Pool.request raises it, where UpstreamClient retries a Disconnected."""
    conn, _ = await _feed([row.wire] if row.wire else [], eof=row.eof)
    with pytest.raises(row.expected[0]):
        await conn.read_head()
    assert conn.status == 0


@_params([r for r in ANOMALIES if r.name.startswith(("extra bytes", "a second", "body past"))])
async def test_bytes_after_a_whole_reply_fail_it_after_its_body(row: Row) -> None:
    """The reply read so far may itself be the stray one (a double reply answers the
    previous request first): the body comes out, then the anomaly, never a clean end."""
    conn, _ = await _feed([row.wire])
    await conn.read_head()
    got = b""
    with pytest.raises(ProtocolError):
        while data := await conn.readany():
            got += data
    assert got in (b"ok", b"")
    assert not conn.complete and not conn.keep_alive


async def test_a_flood_of_interim_replies_is_cut_at_the_limit_in_one_pass() -> None:
    """1 MiB of ``100 Continue`` heads in one read: llhttp reads them in one linear pass
    and the connection stops at the (MAX_INTERIM + 1)-th, never reslicing the rest."""
    flood = _CONTINUE * (1024 * 1024 // len(_CONTINUE))
    conn, transport = await _feed([flood])
    assert conn._interim == MAX_INTERIM + 1
    assert transport.count("abort") == 1
    with pytest.raises(ProtocolError) as caught:
        await conn.read_head()
    assert caught.value.kind == "interim_flood"


async def test_interim_replies_do_not_extend_the_head_deadline() -> None:
    """A 1xx every 50 ms is still no final head: the deadline from the send holds."""
    conn, _ = await _feed([], within=0.25)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def drip() -> None:
        for _ in range(MAX_INTERIM):
            await asyncio.sleep(0.05)
            conn.data_received(b"HTTP/1.1 1")
            await asyncio.sleep(0.05)
            conn.data_received(b"03 Early Hints\r\n\r\n")

    task = asyncio.create_task(drip())
    with pytest.raises(TimeoutError):
        await conn.read_head()
    assert 0.24 <= loop.time() - start < 0.25 + LATE
    assert not task.done()  # it fired while interim replies were still arriving
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_headers_lowercased_and_repeats_joined() -> None:
    """llhttp drops the whitespace before a value; the few values read strip the rest."""
    conn, _ = await _feed([_OK_HEAD + b"Content-Type:  application/json \r\nX-A: 1\r\n"
                           b"x-a: 2\r\nContent-Length: 2\r\n\r\nok"])
    assert await _read_all(conn) == b"ok"
    assert conn.headers == {b"content-type": b"application/json ", b"x-a": b"1, 2",
                            b"content-length": b"2"}


async def test_trailers_do_not_reach_the_headers() -> None:
    conn, _ = await _feed([_OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
                           + _chunked(b"ok", trailers=b"X-T: 1\r\n")])
    assert await _read_all(conn) == b"ok"
    assert conn.headers == {b"transfer-encoding": b"chunked"}


async def test_malformed_reply_aborts_the_connection() -> None:
    """Bytes that break the framing leave the socket unusable: it is dropped at once."""
    conn, transport = await _feed([_OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n"])
    assert transport.count("abort") == 1
    assert conn.closed and not conn.keep_alive
    with pytest.raises(ProtocolError):
        await _read_all(conn)


async def test_bytes_after_the_reply_in_a_later_packet_abort_the_connection() -> None:
    conn, transport = await _feed([_OK_HEAD + b"Content-Length: 2\r\n\r\nok"])
    assert await _read_all(conn) == b"ok"
    assert conn.keep_alive and transport.count("abort") == 0
    conn.data_received(b"HTTP/1.1 200 OK\r\n")
    assert transport.count("abort") == 1
    assert conn.closed and not conn.keep_alive
    assert conn._pool.anomalies == [("extra_bytes", "body")]  # type: ignore[attr-defined]


async def test_bytes_while_parked_are_an_anomaly_of_the_idle_phase() -> None:
    conn, transport = await _feed([_OK_HEAD + b"Content-Length: 2\r\n\r\nok"])
    assert await _read_all(conn) == b"ok"
    conn.park()
    conn.data_received(b"\r\n")
    assert transport.count("abort") == 1
    assert conn._pool.anomalies == [("extra_bytes", "idle")]  # type: ignore[attr-defined]


async def test_head_over_64_kib_without_its_end_is_refused() -> None:
    big = _OK_HEAD + b"X-Big: " + b"a" * (64 * 1024)
    pieces = [big[i:i + 8192] for i in range(0, len(big), 8192)]
    conn, transport = await _feed(pieces)
    with pytest.raises(ProtocolError, match="head_too_large"):
        await conn.read_head()
    assert transport.count("abort") == 1


async def test_head_just_under_64_kib_is_accepted() -> None:
    head = _OK_HEAD + b"X-Big: " + b"a" * (60 * 1024) + b"\r\nContent-Length: 2\r\n\r\n"
    pieces = [head[i:i + 8192] for i in range(0, len(head), 8192)] + [b"ok"]
    conn, _ = await _feed(pieces)
    assert await _read_all(conn) == b"ok"


@pytest.mark.parametrize("cut", [0, 40 * 1024], ids=["one read", "two reads"])
async def test_head_over_64_kib_is_refused_however_it_arrives(cut: int) -> None:
    wire = _OK_HEAD + b"X-Big: " + b"a" * (70 * 1024) + b"\r\nContent-Length: 2\r\n\r\nok"
    pieces = [wire[:cut], wire[cut:]] if cut else [wire]
    assert await _outcome(pieces) == (ProtocolError, "head_too_large")


@pytest.mark.parametrize("junk", [b"X-T: " + b"t" * (70 * 1024), b"1;" + b"x" * (70 * 1024)],
                         ids=["a trailer", "a chunk extension"])
async def test_framing_without_body_past_64_kib_is_refused(junk: bytes) -> None:
    """llhttp holds a trailer until it ends: a never-ending one must not grow us."""
    wire = _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n" + (
        b"0\r\n" + junk if junk.startswith(b"X-T") else junk)
    pieces = [wire[i:i + 4096] for i in range(0, len(wire), 4096)]
    assert await _outcome(pieces) == (ProtocolError, "head_too_large")


async def test_body_delivered_before_a_cut_is_readable_then_the_cut_raises() -> None:
    conn, _ = await _feed([_OK_HEAD + b"Content-Length: 10\r\n\r\nhello"], eof=True)
    await conn.read_head()
    assert await conn.readany() == b"hello"
    with pytest.raises(BrokenResponse):
        await conn.readany()
    assert not conn.complete


async def test_until_close_body_ended_by_a_reset_is_broken() -> None:
    """Only an orderly close delimits a close-framed body; a reset means it was cut."""
    conn, _ = await _feed([b"HTTP/1.0 200 OK\r\n\r\npartial"])
    conn.connection_lost(ConnectionResetError(104, "Connection reset by peer"))
    with pytest.raises(BrokenResponse) as caught:
        await _read_all(conn)
    assert caught.value.cause == "reset"


# --- property: random framing, random cuts --------------------------------------------------


@st.composite
def _replies(draw: st.DrawFn) -> tuple[bytes, list[bytes], bool, bool]:
    """(body, wire pieces, server closes at the end, reusable)."""
    body = draw(st.binary(max_size=2000) | st.text(max_size=600).map(str.encode))
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    head = b"HTTP/1.1 200 OK\r\n"
    if framing == "length":
        head += b"Content-Length: %d\r\n" % len(body)
        framed = body
    elif framing == "chunked":
        head += b"Transfer-Encoding: chunked\r\n"
        sizes = draw(st.lists(st.integers(1, 300), min_size=1, max_size=10))
        extension = draw(st.sampled_from([b"", b";x", b";name=value"]))
        framed, pos, i = b"", 0, 0
        while pos < len(body):
            piece = body[pos:pos + sizes[i % len(sizes)]]
            framed += b"%x%s\r\n%s\r\n" % (len(piece), extension, piece)
            pos += len(piece)
            i += 1
        framed += b"0\r\n" + draw(st.sampled_from([b"", b"X-T: 1\r\n"])) + b"\r\n"
    else:
        head += b"Connection: close\r\n"
        framed = body
    head = _CONTINUE * draw(st.integers(0, MAX_INTERIM)) + head
    wire = head + b"\r\n" + framed
    cuts = sorted(set(draw(st.lists(st.integers(0, len(wire)), max_size=12))))
    pieces = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True) if b > a]
    return body, pieces, framing == "close", framing != "close"


@FAST
@given(_replies())
def test_any_framing_any_cuts_reads_the_body(reply: tuple[bytes, list[bytes], bool, bool]
                                             ) -> None:
    body, pieces, eof, reusable = reply
    assert asyncio.run(_outcome(pieces, eof=eof)) == (200, body, reusable)


# --- deadlines, through the fake transport ----------------------------------------------------


async def test_a_drip_fed_head_ends_at_the_head_deadline() -> None:
    """A byte of head every 20 ms is progress of a kind, but not a head: header_timeout is
    a deadline from the send, not a silence."""
    conn, _ = await _feed([], within=0.2)
    wire = _OK_HEAD + b"X-Slow: " + b"s" * 100

    async def drip() -> None:
        for i in range(len(wire)):
            conn.data_received(wire[i:i + 1])
            await asyncio.sleep(0.02)

    loop = asyncio.get_running_loop()
    start = loop.time()
    task = asyncio.create_task(drip())
    with pytest.raises(TimeoutError):
        await conn.read_head()
    assert 0.19 <= loop.time() - start < 0.2 + LATE
    assert not task.done()  # it fired while the head was still dripping in
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_stream_dripping_blank_lines_ends_at_its_idle_timeout() -> None:
    """Only bytes that carry an event restart a stream's idle time (the reader says so
    with progress()); a trickle of blank lines or comments does not."""
    conn, _ = await _feed([_OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"], stream=True,
                          within=0.2)
    await conn.read_head()
    loop = asyncio.get_running_loop()
    start = loop.time()
    seen = []

    async def drip() -> None:
        conn.data_received(b"a\r\ndata: {}\n\n\r\n")
        while True:
            await asyncio.sleep(0.02)
            conn.data_received(b"1\r\n\n\r\n")

    task = asyncio.create_task(drip())
    with pytest.raises(TimeoutError):
        while True:
            chunk = await conn.readany()
            seen.append(chunk)
            if b"data:" in chunk:
                conn.progress()
    assert 0.19 <= loop.time() - start < 0.2 + LATE
    assert len(seen) > 3  # blank lines kept arriving: they just did not count
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_stream_with_events_lives_past_its_idle_timeout() -> None:
    conn, _ = await _feed([_OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"], stream=True,
                          within=0.5)
    await conn.read_head()

    async def events() -> None:
        for _ in range(8):
            await asyncio.sleep(0.1)
            conn.data_received(b"a\r\ndata: {}\n\n\r\n")
        conn.data_received(b"0\r\n\r\n")

    task = asyncio.create_task(events())
    n = 0
    while await conn.readany():
        n += 1
        conn.progress()
    assert n == 8  # 0.8 s in all, never 0.5 s without an event
    await task


async def test_a_buffered_body_is_due_at_its_deadline_whatever_arrives() -> None:
    loop = asyncio.get_running_loop()
    sent = loop.time()
    conn, _ = await _feed([_OK_HEAD + b"Content-Length: 1000\r\n\r\n"], within=0.25)
    await conn.read_head()

    async def drip() -> None:
        while True:
            await asyncio.sleep(0.02)
            conn.data_received(b"x")
            conn.progress()  # not a stream: progress does not move a deadline

    task = asyncio.create_task(drip())
    with pytest.raises(TimeoutError):
        while await conn.readany():
            pass
    assert 0.24 <= loop.time() - sent < 0.25 + LATE  # from the send, bytes arriving or not
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# --- read backpressure ----------------------------------------------------------------------


async def test_more_than_256_kib_unread_pauses_reading_once_and_readany_resumes() -> None:
    total = 600 * 1024
    conn, transport = await _feed([_OK_HEAD + b"Content-Length: %d\r\n\r\n" % total])
    await conn.read_head()
    conn.data_received(b"a" * (256 * 1024))
    assert transport.count("pause_reading") == 0  # at the mark: not past it
    conn.data_received(b"b")
    assert transport.count("pause_reading") == 1
    conn.data_received(b"c" * (100 * 1024))
    assert transport.count("pause_reading") == 1  # once, not per chunk
    assert transport.count("resume_reading") == 0
    got = await conn.readany()
    assert len(got) == (256 + 100) * 1024 + 1
    assert transport.count("resume_reading") == 1
    conn.data_received(b"d" * (total - len(got)))  # the rest: under the mark again
    assert await conn.readany() == b"d" * (total - len(got))
    assert await conn.readany() == b""
    assert (transport.count("pause_reading"), transport.count("resume_reading")) == (1, 1)


# --- a scripted loopback upstream -----------------------------------------------------------

Handler = Callable[["Upstream", int, asyncio.StreamReader, asyncio.StreamWriter],
                   Awaitable[None]]


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


def _reply(body: bytes = b"ok", *extra: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\n" + b"".join(h + b"\r\n" for h in extra)
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


async def _keep_serving(srv: Upstream, index: int, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> None:
    """Replies "ok" to every request on every connection, until the client closes."""
    while True:
        try:
            await srv.read_request(reader)
        except asyncio.IncompleteReadError as exc:
            assert exc.partial == b""
            srv.eofs += 1
            srv.eof.set()
            return
        writer.write(_reply())


def _partial_body(length: int, first: bytes) -> Handler:
    """Replies with the head and the first bytes of a ``length``-byte body, then waits."""
    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % length + first)
        await srv.wait_client_close(reader)

    return handler


async def _get(pool: Pool, target: str = "/v1/models", body: bytes | None = None,
               *, method: str = "GET") -> bytes:
    resp = await pool.request(method, target, body, head_timeout=1.0, body_timeout=1.0)
    data = await resp.read()
    resp.release()
    return data


async def _settle(condition: Callable[[], bool]) -> None:
    """Until ``condition()`` holds (closes land a few loop iterations later); 1 s at most."""
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached within 1 s")


@pytest.fixture
async def pools() -> Any:
    """Creates pools; every one is closed at teardown."""
    made: list[Pool] = []

    def make(url: str, **kwargs: Any) -> Pool:
        pool = Pool(url, **kwargs)
        made.append(pool)
        return pool

    yield make
    for pool in made:
        await pool.close()
    await asyncio.sleep(0)


# --- the pool over real sockets --------------------------------------------------------------


async def test_keep_alive_reuses_one_connection_and_sends_exact_request_bytes(pools: Any) -> None:
    async with Upstream(_keep_serving) as srv:
        pool = pools(srv.url, extra_headers={"Content-Type": "application/json",
                                             "Authorization": "Bearer k"})
        big = b"x" * 20000  # past 16 KiB the head and body go out as two buffers
        assert await _get(pool, "/v1/chat/completions", b'{"a":1}', method="POST") == b"ok"
        assert await _get(pool, "/v1/chat/completions", big, method="POST") == b"ok"
        assert await _get(pool) == b"ok"
        assert srv.connections == 1
        assert pool.open_connections == 1
        fixed = (b"Host: " + srv.host.encode() + b"\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer k\r\n")
        assert srv.requests == [
            b"POST /v1/chat/completions HTTP/1.1\r\n" + fixed
            + b'Content-Length: 7\r\n\r\n{"a":1}',
            b"POST /v1/chat/completions HTTP/1.1\r\n" + fixed
            + b"Content-Length: 20000\r\n\r\n" + big,
            b"GET /v1/models HTTP/1.1\r\n" + fixed + b"\r\n",
        ]


async def test_userinfo_never_reaches_the_host_header(pools: Any) -> None:
    async with Upstream(_keep_serving) as srv:
        pool = pools(srv.url.replace("//", "//user:secret@"))
        assert await _get(pool) == b"ok"
        assert srv.requests == [b"GET /v1/models HTTP/1.1\r\nHost: " + srv.host.encode()
                                + b"\r\n\r\n"]


async def test_pool_limit_makes_the_second_request_wait_for_the_first(pools: Any) -> None:
    async with Upstream(_keep_serving) as srv:
        pool = pools(srv.url, limit=1)
        first = await pool.request("GET", "/a", None, head_timeout=1, body_timeout=1)
        second = asyncio.create_task(_get(pool, "/b"))
        await asyncio.sleep(0.05)
        assert not second.done()
        assert len(srv.requests) == 1  # the second has not been sent
        assert await first.read() == b"ok"
        first.release()
        assert await asyncio.wait_for(second, 1.0) == b"ok"
        assert [r.split(b" ")[1] for r in srv.requests] == [b"/a", b"/b"]
        assert srv.connections == 1  # the waiter took the released connection


async def test_a_freed_slot_goes_to_the_oldest_waiter_not_a_newcomer(pools: Any) -> None:
    async with Upstream(_keep_serving) as srv:
        pool = pools(srv.url, limit=1)
        first = await pool.request("GET", "/first", None, head_timeout=1, body_timeout=1)
        waiting = asyncio.create_task(_get(pool, "/waiting"))
        await asyncio.sleep(0.05)
        assert await first.read() == b"ok"
        first.release()  # the waiter is woken holding the slot...
        async with asyncio.timeout(1.0):  # in this task, before the waiter's turn comes
            newcomer = await _get(pool, "/newcomer")  # ...so this one queues behind it
        assert newcomer == b"ok" and await waiting == b"ok"
        assert [r.split(b" ")[1] for r in srv.requests] == [b"/first", b"/waiting", b"/newcomer"]


async def test_waiting_for_a_pool_slot_counts_against_the_head_timeout(pools: Any) -> None:
    async with Upstream(_keep_serving) as srv:
        pool = pools(srv.url, limit=1)
        first = await pool.request("GET", "/a", None, head_timeout=1, body_timeout=1)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(PoolTimeout):
            await pool.request("GET", "/b", None, head_timeout=0.2, body_timeout=1)
        assert 0.19 <= loop.time() - start < 0.2 + LATE
        assert len(srv.requests) == 1  # the second was never sent
        assert await first.read() == b"ok"
        first.release()
        assert await asyncio.wait_for(_get(pool, "/c"), 1.0) == b"ok"  # no slot leaked


async def test_failed_request_gives_its_pool_slot_back(pools: Any) -> None:
    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        if index == 0:
            writer.write(b"NOT HTTP\r\n\r\n")
            await srv.wait_client_close(reader)
        else:
            writer.write(_reply())
            await srv.stop.wait()

    async with Upstream(handler) as srv:
        pool = pools(srv.url, limit=1)
        with pytest.raises(BrokenResponse):
            await _get(pool)
        assert await asyncio.wait_for(_get(pool), 1.0) == b"ok"
        assert srv.connections == 2
        assert srv.eofs == 1  # the broken connection was closed


async def test_connect_refused_is_connect_failed_and_frees_the_slot(pools: Any) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed at once: nothing listens there
    pool = pools(f"http://127.0.0.1:{port}", limit=1, connect_timeout=1.0)
    for _ in range(2):  # a leaked slot would make the second wait forever
        with pytest.raises(ConnectFailed) as caught:
            await asyncio.wait_for(_get(pool), 1.0)
        assert caught.value.cause == "refused"
    assert pool.open_connections == 0


async def test_no_reply_times_out_after_head_timeout(pools: Any) -> None:
    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        await srv.wait_client_close(reader)  # never replies

    async with Upstream(handler) as srv:
        pool = pools(srv.url)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):
            await pool.request("GET", "/", None, head_timeout=0.2, body_timeout=5.0)
        assert 0.19 <= loop.time() - start < 0.2 + LATE
        await asyncio.wait_for(srv.eof.wait(), 1.0)  # the connection was dropped
        assert pool.open_connections == 0


async def test_a_stalled_buffered_body_times_out_at_its_deadline_from_the_send(
    pools: Any,
) -> None:
    async with Upstream(_partial_body(10, b"hello")) as srv:
        pool = pools(srv.url)
        loop = asyncio.get_running_loop()
        start = loop.time()
        resp = await pool.request("GET", "/", None, head_timeout=0.2, body_timeout=0.3)
        assert await resp.readany() == b"hello"
        with pytest.raises(TimeoutError):
            await resp.readany()
        assert 0.29 <= loop.time() - start < 0.3 + LATE
        resp.close()
        await asyncio.wait_for(srv.eof.wait(), 1.0)


def _drip(head: bytes, pieces: list[bytes], gap: float) -> Handler:
    """Replies with ``head``, then each piece ``gap`` seconds apart, then the chunked end."""
    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(head)
        for piece in pieces:
            await asyncio.sleep(gap)
            writer.write(piece)
        writer.write(b"0\r\n\r\n")
        await srv.wait_client_close(reader)

    return handler


_CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


async def test_a_slow_steady_stream_is_not_a_timeout(pools: Any) -> None:
    """A stream's timeout bounds the gap between events, not the whole body."""
    events = [_chunked(b"data: %d\n\n" % i)[:-5] for i in range(6)]  # without the last chunk
    async with Upstream(_drip(_CHUNKED_HEAD, events, 0.1)) as srv:
        pool = pools(srv.url)
        resp = await pool.request("GET", "/", None, head_timeout=0.5, body_timeout=0.5,
                                  stream=True)
        got = b""
        while chunk := await resp.readany():
            got += chunk
            resp.progress()
        assert got.count(b"data:") == 6  # 0.6 s in all, never 0.5 s without an event
        resp.release()


async def test_a_slow_steady_buffered_body_is_due_at_its_deadline(pools: Any) -> None:
    """A buffered reply dripping a byte at a time still ends at response_timeout."""
    async with Upstream(_drip(_CHUNKED_HEAD, [b"1\r\nx\r\n"] * 200, 0.02)) as srv:
        pool = pools(srv.url)
        loop = asyncio.get_running_loop()
        start = loop.time()
        resp = await pool.request("GET", "/", None, head_timeout=0.2, body_timeout=0.3)
        with pytest.raises(TimeoutError):
            await resp.read()
        assert 0.29 <= loop.time() - start < 0.3 + LATE
        resp.close()


async def test_upstream_closing_a_reused_connection_before_replying_is_disconnected(
    pools: Any,
) -> None:
    """The keep-alive race: the server closed the idle socket as the request went out."""
    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(_reply())
        await srv.read_request(reader)  # the second request on this connection: dropped

    async with Upstream(handler) as srv:
        pool = pools(srv.url)
        assert await _get(pool) == b"ok"
        with pytest.raises(Disconnected):
            await _get(pool)
        assert srv.connections == 1
        assert pool.open_connections == 0


async def test_an_idle_connection_closed_by_the_upstream_is_not_reused(pools: Any) -> None:
    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(_reply())  # then closes, though the reply allowed keep-alive

    async with Upstream(handler) as srv:
        pool = pools(srv.url)
        assert await _get(pool) == b"ok"
        await _settle(lambda: pool.open_connections == 0)
        assert await _get(pool) == b"ok"
        assert srv.connections == 2


def _upstream_config(srv: Upstream) -> UpstreamConfig:
    return UpstreamConfig(name="u", base_url=srv.url + "/v1", connect_timeout=1.0,
                          header_timeout=1.0, idle_timeout=1.0)


async def test_upstream_client_retries_a_disconnect_once_and_succeeds() -> None:
    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(_reply(b'{"n":%d}' % len(srv.requests)))
        if index == 0:
            await srv.read_request(reader)  # dropped unanswered
        else:
            await srv.wait_client_close(reader)

    async with Upstream(handler) as srv:
        client = UpstreamClient(_upstream_config(srv))
        await client.start()
        try:
            bodies = []
            for _ in range(2):
                resp = await client.request("/chat/completions", b"{}", stream=False)
                async with resp:
                    bodies.append(await resp.read())
        finally:
            await client.close()
        assert bodies == [b'{"n":1}', b'{"n":3}']
        assert len(srv.requests) == 3
        assert all(r.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") for r in srv.requests)
        assert srv.connections == 2


async def test_upstream_client_retries_only_once() -> None:
    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)  # every request dropped unanswered

    async with Upstream(handler) as srv:
        client = UpstreamClient(_upstream_config(srv))
        await client.start()
        try:
            with pytest.raises(errors.UpstreamUnavailable):
                await client.request("/chat/completions", b"{}", stream=False)
        finally:
            await client.close()
        assert srv.connections == 2


async def test_response_close_mid_body_closes_the_upstream_socket(pools: Any) -> None:
    async with Upstream(_partial_body(1000, b"first")) as srv:
        pool = pools(srv.url)
        resp = await pool.request("GET", "/", None, head_timeout=1, body_timeout=1)
        assert await resp.readany() == b"first"
        assert not resp.at_eof
        resp.close()
        await asyncio.wait_for(srv.eof.wait(), 1.0)
        assert pool.open_connections == 0


async def test_release_before_the_end_of_the_body_closes_instead_of_pooling(pools: Any) -> None:
    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(_reply(b"0123456789") if index else
                     b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234")
        await srv.wait_client_close(reader)

    async with Upstream(handler) as srv:
        pool = pools(srv.url)
        resp = await pool.request("GET", "/", None, head_timeout=1, body_timeout=1)
        assert await resp.readany() == b"01234"
        resp.release()
        await asyncio.wait_for(srv.eof.wait(), 1.0)
        assert await _get(pool) == b"0123456789"
        assert srv.connections == 2


async def test_read_with_a_limit_stops_there() -> None:
    async with Upstream(_keep_serving) as srv:
        pool = Pool(srv.url)
        try:
            resp = await pool.request("GET", "/", None, head_timeout=1, body_timeout=1)
            assert isinstance(resp, Response)
            assert (resp.status, resp.headers) == (200, {b"content-length": b"2"})
            assert await resp.read(1) == b"o"
            resp.close()
        finally:
            await pool.close()


async def test_pool_close_closes_every_connection_and_fails_waiters(pools: Any) -> None:
    async with Upstream(_keep_serving) as srv:
        pool = pools(srv.url, limit=2)
        assert await _get(pool) == b"ok"  # back in the pool, idle
        busy1 = await pool.request("GET", "/", None, head_timeout=1, body_timeout=1)
        busy2 = await pool.request("GET", "/", None, head_timeout=1, body_timeout=1)
        waiter = asyncio.create_task(_get(pool))
        await asyncio.sleep(0.02)
        assert not waiter.done()
        assert pool.open_connections == 2 and srv.connections == 2
        await pool.close()
        assert pool.open_connections == 0
        await _settle(lambda: srv.eofs == 2)
        with pytest.raises(Disconnected):
            await asyncio.wait_for(waiter, 1.0)
        with pytest.raises(Disconnected):
            await _get(pool)
        busy1.release()
        busy2.close()
        assert pool.open_connections == 0


@pytest.mark.parametrize(("idle", "connections"), [(0.0, 1), (0.15, 2)],
                         ids=["fresh: reused", "older than KEEPALIVE: replaced"])
async def test_idle_connection_older_than_keepalive_is_not_reused(
    pools: Any, monkeypatch: pytest.MonkeyPatch, idle: float, connections: int
) -> None:
    monkeypatch.setattr(pool_module, "KEEPALIVE", 0.05)
    async with Upstream(_keep_serving) as srv:
        pool = pools(srv.url)
        assert await _get(pool) == b"ok"
        await asyncio.sleep(idle)
        assert await _get(pool) == b"ok"
        assert srv.connections == connections
        await _settle(lambda: srv.eofs == connections - 1)  # the stale one was closed
        assert pool.open_connections == 1


async def test_a_quiet_pool_closes_its_idle_connections(
    pools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No request comes after: the sweep timer still closes the idle sockets."""
    monkeypatch.setattr(pool_module, "KEEPALIVE", 0.05)
    async with Upstream(_keep_serving) as srv:
        pool = pools(srv.url)
        assert await _get(pool) == b"ok"
        assert pool.open_connections == 1
        await _settle(lambda: srv.eofs == 1)
        assert pool.open_connections == 0


async def test_close_after_the_whole_body_still_drops_the_connection(pools: Any) -> None:
    """close() is the error path (an error status read, then dropped): never pooled."""
    async with Upstream(_keep_serving) as srv:
        pool = pools(srv.url)
        resp = await pool.request("GET", "/", None, head_timeout=1, body_timeout=1)
        assert await resp.read() == b"ok"
        assert resp.at_eof
        resp.close()
        await asyncio.wait_for(srv.eof.wait(), 1.0)
        assert pool.open_connections == 0
        assert await _get(pool) == b"ok"
        assert srv.connections == 2


@pytest.mark.parametrize("method", ["HEAD", "PUT"])
async def test_methods_the_gateway_never_sends_are_refused(pools: Any, method: str) -> None:
    """A reply to HEAD has a Content-Length and no body: the client does not frame it."""
    pool = pools("http://127.0.0.1:1")
    with pytest.raises(ValueError):
        await pool.request(method, "/", None, head_timeout=1, body_timeout=1)


async def test_until_close_body_over_a_socket_ends_at_the_servers_close(pools: Any) -> None:
    body = b"streamed until the server closes " * 50

    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        payload = body
        writer.write(b"HTTP/1.0 200 OK\r\n\r\n" + payload[:100])
        await asyncio.sleep(0.02)
        writer.write(payload[100:])
        writer.write_eof()
        await srv.wait_client_close(reader)

    async with Upstream(handler) as srv:
        pool = pools(srv.url)
        resp = await pool.request("GET", "/", None, head_timeout=1, body_timeout=1)
        assert await resp.read() == body
        assert resp.at_eof
        resp.release()
        await asyncio.wait_for(srv.eof.wait(), 1.0)
        assert pool.open_connections == 0


# --- TLS upstreams ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tls_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (openssl CLI): (cert, key)."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=127.0.0.1", "-addext",
                    "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


def _server_tls(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return ctx


async def test_https_upstream_is_verified_and_kept_alive(
    pools: Any, tls_cert: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_cert[0]))  # trusted as a CA would be
    async with Upstream(_keep_serving, tls=_server_tls(*tls_cert)) as srv:
        pool = pools(srv.url)
        assert await _get(pool) == b"ok"
        assert await _get(pool, "/v1/chat/completions", b"{}", method="POST") == b"ok"
        assert srv.connections == 1
        assert srv.requests[1].startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: ")


async def test_https_upstream_with_an_untrusted_certificate_is_unavailable(
    tls_cert: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    async with Upstream(_keep_serving, tls=_server_tls(*tls_cert)) as srv:
        client = UpstreamClient(UpstreamConfig(name="tls", base_url=srv.url + "/v1"))
        await client.start()
        try:
            with pytest.raises(errors.UpstreamUnavailable):
                await client.request("/chat/completions", b"{}", stream=False)
        finally:
            await client.close()
        assert not srv.requests  # nothing was sent over an unverified connection


# --- desync defence over sockets ----------------------------------------------------------------


def _echoing(stray_after: float = 0.05) -> Handler:
    """Replies with the request's path as its body, echoing its X-Request-Id; a request to
    /double is answered twice, the second copy ``stray_after`` seconds later."""
    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
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
            writer.write(_reply(path, *echo))
            if path == b"/double":
                await asyncio.sleep(stray_after)
                writer.write(_reply(path, *echo))

    return handler


class Anomalies:
    """An on_protocol_error callback that records what it is told."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []

    def __call__(self, kind: str, phase: str, request_id: str | None) -> None:
        self.seen.append((kind, phase, request_id))


async def test_a_stray_reply_on_an_idle_connection_closes_every_idle_connection(
    pools: Any,
) -> None:
    async with Upstream(_echoing()) as srv:
        seen = Anomalies()
        pool = pools(srv.url, on_protocol_error=seen)
        first, second = await asyncio.gather(_get(pool, "/a"), _get(pool, "/double"))
        assert (first, second) == (b"/a", b"/double")
        assert pool.idle_connections == 2
        await _settle(lambda: pool.open_connections == 0)  # the stray came to an idle one
        assert seen.seen == [("extra_bytes", "idle", None)]
        assert await _get(pool, "/next") == b"/next"  # on a fresh connection
        assert srv.connections == 3


async def test_a_stray_reply_after_the_next_request_is_refused_by_its_request_id(
    pools: Any,
) -> None:
    """The connection was reused before the stray copy arrived: without the echoed id it
    would read as the next request's reply. The next request fails instead."""
    async with Upstream(_echoing(stray_after=0.1)) as srv:
        seen = Anomalies()
        pool = pools(srv.url, on_protocol_error=seen)
        resp = await pool.request("GET", "/double", None, head_timeout=1, body_timeout=1,
                                  request_id=b"req_A")
        assert await resp.read() == b"/double"
        resp.release()
        with pytest.raises(ProtocolError, match="request_id_mismatch"):
            await pool.request("GET", "/b", None, head_timeout=1, body_timeout=1,
                               request_id=b"req_B")
        assert seen.seen == [("request_id_mismatch", "head", "req_B")]
        assert pool.open_connections == 0
        assert srv.requests[1].count(b"X-Request-Id: req_B\r\n") == 1


@pytest.mark.parametrize("gap", [0.0, 0.05], ids=["same read", "a later read"])
async def test_a_body_past_its_content_length_never_reaches_the_next_request(
    pools: Any, gap: float,
) -> None:
    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        if index == 0:
            await srv.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            if gap:
                await asyncio.sleep(gap)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray")
        while True:
            await srv.read_request(reader)
            writer.write(_reply(b"mine"))

    async with Upstream(handler) as srv:
        pool = pools(srv.url, on_protocol_error=Anomalies())
        try:
            first = await _get(pool)
        except ProtocolError:
            first = b"refused"
        await asyncio.sleep(gap + 0.05)
        assert first in (b"ok", b"refused")
        assert await _get(pool) == b"mine"  # a fresh connection, never the stray bytes
        assert srv.connections == 2


# --- the client: deadlines, caps, classification, logs -------------------------------------------


def _client(srv: Upstream, **cfg: Any) -> UpstreamClient:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.add_upstream("u")
    client = UpstreamClient(replace(_upstream_config(srv), **cfg),
                            protocol_errors=metrics.upstream_protocol_errors)
    client.registry = registry  # type: ignore[attr-defined]
    return client


def _protocol_errors(client: UpstreamClient, kind: str) -> float | None:
    return client.registry.get_sample_value(  # type: ignore[attr-defined]
        "llm_gateway_upstream_protocol_errors_total", {"upstream": "u", "kind": kind})


async def test_the_request_id_goes_upstream_and_a_mismatch_is_a_500() -> None:
    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(_reply(b"{}", b"X-Request-Id: req_someone_else"))
        await srv.wait_client_close(reader)

    async with Upstream(handler) as srv:
        client = _client(srv)
        await client.start()
        try:
            with capture_logs() as logs, pytest.raises(errors.UpstreamError) as caught:
                await client.request("/chat/completions", b"{}", stream=False,
                                     request_id="req_mine")
        finally:
            await client.close()
        assert (caught.value.status, caught.value.error_type) == (500, "api_error")
        assert srv.requests[0].count(b"\r\nX-Request-Id: req_mine\r\n") == 1
        await asyncio.wait_for(srv.eof.wait(), 1.0)  # the connection was closed
        assert _protocol_errors(client, "request_id_mismatch") == 1
        assert all(_protocol_errors(client, k) == 0 for k in PROTOCOL_ERRORS
                   if k != "request_id_mismatch")
        assert logs == [{"event": "upstream_failure", "log_level": "warning", "upstream": "u",
                         "phase": "head", "cause": "protocol_error",
                         "kind": "request_id_mismatch", "request_id": "req_mine"}]


async def test_keepalive_false_sends_connection_close_and_never_reuses() -> None:
    async with Upstream(_echoing()) as srv:
        client = _client(srv, keepalive=False)
        await client.start()
        try:
            for _ in range(3):
                resp = await client.request("/chat/completions", b"{}", stream=False)
                async with resp:
                    assert await resp.read() == b"/v1/chat/completions"
            await _settle(lambda: client.open_connections == 0)
        finally:
            await client.close()
        assert srv.connections == 3
        assert all(b"\r\nConnection: close\r\n" in r for r in srv.requests)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_buffered_reply_over_max_response_bytes_is_a_500_and_closes(
    framing: str,
) -> None:
    body = b"x" * 5000

    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        if framing == "chunked":
            writer.write(_CHUNKED_HEAD + _chunked(*[body[i:i + 100] for i in range(0, 5000, 100)]))
        else:
            writer.write(_reply(body))
        await srv.wait_client_close(reader)

    async with Upstream(handler) as srv:
        client = _client(srv, max_response_bytes=4096)
        await client.start()
        try:
            resp = await client.request("/chat/completions", b"{}", stream=False)
            with capture_logs() as logs, pytest.raises(errors.UpstreamError) as caught:
                async with resp:
                    await resp.read()
            await asyncio.wait_for(srv.eof.wait(), 1.0)
        finally:
            await client.close()
        assert (caught.value.status, caught.value.error_type) == (500, "api_error")
        assert [(e["phase"], e["cause"]) for e in logs] == [("body", "too_large")]


async def test_a_malformed_head_is_a_500_not_an_overload_and_is_not_retried() -> None:
    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok")
        await srv.wait_client_close(reader)

    async with Upstream(handler) as srv:
        client = _client(srv)
        await client.start()
        try:
            with pytest.raises(errors.UpstreamError) as caught:
                await client.request("/chat/completions", b"{}", stream=False)
        finally:
            await client.close()
        err = caught.value
        assert (err.status, err.error_type, err.retry_after) == (500, "api_error", None)
        assert srv.connections == 1
        assert _protocol_errors(client, "malformed") == 1


async def test_a_cut_body_is_a_500() -> None:
    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhel")
        writer.close()

    async with Upstream(handler) as srv:
        client = _client(srv)
        await client.start()
        try:
            resp = await client.request("/chat/completions", b"{}", stream=True)
            with capture_logs() as logs, pytest.raises(errors.UpstreamError) as caught:
                async with resp:
                    async for _ in resp.chunks():
                        pass
        finally:
            await client.close()
        assert (caught.value.status, caught.value.message) == (500, "Upstream connection lost")
        assert [(e["phase"], e["cause"]) for e in logs] == [("body", "cut")]


async def test_a_stream_without_events_ends_at_idle_timeout_with_504() -> None:
    blank = _chunked(b"\n")[:-5]
    async with Upstream(_drip(_CHUNKED_HEAD, [blank] * 50, 0.02)) as srv:
        client = _client(srv, idle_timeout=0.2)
        await client.start()
        try:
            resp = await client.request("/chat/completions", b"{}", stream=True)
            with pytest.raises(errors.UpstreamTimeout) as caught:
                async with resp:
                    async for chunk in resp.chunks():
                        if b"data:" in chunk:
                            resp.progress()
        finally:
            await client.close()
        assert caught.value.message == "Upstream stopped sending"


def _refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed at once: nothing listens there


async def test_a_refused_connection_is_a_retryable_529_logged_with_its_cause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client_module, "_LOG_EVERY", 0.2)
    cfg = UpstreamConfig(name="down", base_url=f"http://127.0.0.1:{_refused_port()}/v1",
                         api_key="sk-very-secret")
    client = UpstreamClient(cfg)
    await client.start()
    try:
        with capture_logs() as logs:
            for _ in range(3):
                with pytest.raises(errors.UpstreamUnavailable) as caught:
                    await client.request("/chat/completions", b"{}", stream=False,
                                         request_id="req_1")
                assert caught.value.status == 529
                assert caught.value.headers["retry-after"] == "1"
            await asyncio.sleep(0.25)
            with pytest.raises(errors.UpstreamUnavailable):
                await client.request("/chat/completions", b"{}", stream=False,
                                     request_id="req_2")
    finally:
        await client.close()
    # one line a cause per interval, the ones held back counted in the next
    assert logs == [
        {"event": "upstream_failure", "log_level": "warning", "upstream": "down",
         "phase": "connect", "cause": "refused", "request_id": "req_1"},
        {"event": "upstream_failure", "log_level": "warning", "upstream": "down",
         "phase": "connect", "cause": "refused", "request_id": "req_2", "suppressed": 2},
    ]
    assert "sk-very-secret" not in repr(logs)


def test_the_client_exposes_its_secrets_in_every_form() -> None:
    cfg = UpstreamConfig(name="u", base_url="http://h:1/v1", api_key="k+y/=")
    # one list of forms for the client and the app-wide redactor (gateway/text/redact.py)
    assert UpstreamClient(cfg).secrets == secrets_of(cfg)
    assert {"k+y/=", "Bearer k+y/=", "k%2By%2F%3D"} <= set(UpstreamClient(cfg).secrets)
    plain = UpstreamConfig(name="u", base_url="http://h:1/v1", api_key="sk-abc")
    assert {"sk-abc", "Bearer sk-abc"} <= set(UpstreamClient(plain).secrets)
    assert UpstreamClient(UpstreamConfig(name="u", base_url="http://h:1/v1")).secrets == ()


def test_protocol_error_series_start_at_zero_for_each_upstream() -> None:
    registry = CollectorRegistry()
    Metrics(registry).add_upstream("a")
    for kind in PROTOCOL_ERRORS:
        assert registry.get_sample_value("llm_gateway_upstream_protocol_errors_total",
                                         {"upstream": "a", "kind": kind}) == 0


@_params(ANOMALIES)
async def test_each_anomaly_through_the_client_is_a_500_counted_and_clears_the_pool(
    row: Row,
) -> None:
    """Over a socket: the request that met the anomaly fails cleanly, the kind is counted,
    the upstream's idle connections are closed with it, and the next request gets its own
    reply on a fresh connection."""
    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        while True:
            request = await srv.read_request(reader)
            path = request.split(b" ")[1]
            if path.endswith(b"/bad"):
                writer.write(row.wire)
                if row.eof:
                    writer.write_eof()
                await srv.stop.wait()
                return
            writer.write(_reply(path))

    async with Upstream(handler) as srv:
        client = _client(srv)
        await client.start()
        try:
            async def get(path: str) -> bytes:
                resp = await client.request(path, b"{}", stream=False, request_id=_RID.decode())
                async with resp:
                    return await resp.read()

            assert await asyncio.gather(get("/warm1"), get("/warm2")) == [b"/v1/warm1",
                                                                          b"/v1/warm2"]
            assert client._pool is not None and client._pool.idle_connections == 2
            with pytest.raises(errors.UpstreamError) as caught:
                await get("/bad")
            assert (caught.value.status, caught.value.error_type) == (500, "api_error")
            assert _protocol_errors(client, row.expected[1]) == 1
            await _settle(lambda: client.open_connections == 0)
            assert await get("/next") == b"/v1/next"
            assert srv.connections == 3
        finally:
            await client.close()
