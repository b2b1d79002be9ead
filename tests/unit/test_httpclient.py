"""gateway/http1.py and gateway/httpclient.py: the reply parser, fed byte by byte, and the pool
over loopback sockets.

Protocol facts these tests pin (RFC 9112):

* a reply's body is framed by ``Transfer-Encoding: chunked`` (which wins), else by
  ``Content-Length``, else it runs until the server closes the connection;
* 1xx replies are interim: the real reply follows on the same connection;
* 204 and 304 replies, and every reply to HEAD, have no body whatever their headers say;
* a chunk size is bare hex digits, optionally followed by ``;extensions``; the last chunk
  (size 0) may be followed by trailer fields, then an empty line;
* HTTP/1.1 connections persist unless ``Connection: close``; HTTP/1.0 ones only with
  ``Connection: keep-alive``; a connection carrying bytes after the reply's end cannot
  be trusted for the next reply;
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
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import errors, httpclient
from gateway.config import UpstreamConfig
from gateway.http1 import BrokenResponse, Connection, Disconnected, HTTPClientError
from gateway.httpclient import Pool, Response
from gateway.upstream import UpstreamClient
from tests.fuzzing import EXAMPLES

FAST = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# A parser that wrongly waits for more bytes fails on this timer instead of hanging.
_PARSER_TIMEOUT = 0.3


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


_REQUEST = b"GET /v1/models HTTP/1.1\r\nHost: up\r\n\r\n"


async def _feed(
    pieces: list[bytes], *, head: bool = False, eof: bool = False
) -> tuple[Connection, FakeTransport]:
    """A connection that sent one request and then received ``pieces`` (and EOF if asked)."""
    pool = Pool("http://127.0.0.1:1")  # never connects: only the loop and bookkeeping
    conn = Connection(pool)
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.send(_REQUEST, head_timeout=_PARSER_TIMEOUT, body_timeout=_PARSER_TIMEOUT,
              no_body=head)
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


async def _outcome(pieces: list[bytes], *, head: bool = False, eof: bool = False) -> tuple:
    """(status, body, reusable) for a reply, or (exception type,) for a failed one."""
    conn, _ = await _feed(pieces, head=head, eof=eof)
    try:
        body = await _read_all(conn)
    except (HTTPClientError, TimeoutError) as exc:
        return (type(exc),)
    return (conn.status, body, conn.keep_alive and conn.complete)


def _chunked(*chunks: bytes, trailers: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n" + trailers + b"\r\n"


_TEXT = b'{"id":"chatcmpl-1","choices":[{"message":{"content":"Hello there"}}]}'
_GZ = gzip.compress(_TEXT)
_DEFLATE = zlib.compress(_TEXT)
_OK_HEAD = b"HTTP/1.1 200 OK\r\n"


@dataclass(frozen=True)
class Row:
    name: str
    wire: bytes
    expected: tuple  # (status, body, reusable) or (exception type,)
    head: bool = False  # the request was HEAD
    eof: bool = False  # the server closes after sending ``wire``


GOOD = [
    Row("content-length", _OK_HEAD + b"Content-Length: 5\r\n\r\nhello", (200, b"hello", True)),
    Row("content-length zero", _OK_HEAD + b"Content-Length: 0\r\n\r\n", (200, b"", True)),
    Row("status without reason phrase", b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok",
        (200, b"ok", True)),
    Row("error status with body", b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy",
        (503, b"busy", True)),
    Row("chunked with extensions and trailers",
        _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
        b"5;name=value\r\nhello\r\n1;a;b=\"q\"\r\n \r\nA ; ext\r\n0123456789\r\n"
        b"b\r\n, and more.\r\n0;last\r\nX-Trailer: t\r\nX-Other: u\r\n\r\n",
        (200, b"hello 0123456789, and more.", True)),
    Row("chunked without trailers", _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
        + _chunked(b"ab", b"c" * 300), (200, b"ab" + b"c" * 300, True)),
    Row("chunked wins over content-length",
        _OK_HEAD + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(b"hello"),
        (200, b"hello", True)),
    Row("chunked, empty body", _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        (200, b"", True)),
    Row("http/1.0 without framing: until close", b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\nall of it",
        (200, b"all of it", False), eof=True),
    Row("http/1.1 without framing: until close", _OK_HEAD + b"Server: x\r\n\r\nall of it",
        (200, b"all of it", False), eof=True),
    Row("until close, empty body", b"HTTP/1.0 200 OK\r\n\r\n", (200, b"", False), eof=True),
    Row("100 continue, then 200", b"HTTP/1.1 100 Continue\r\n\r\n" + _OK_HEAD
        + b"Content-Length: 2\r\n\r\nok", (200, b"ok", True)),
    Row("two interim replies with headers, then 201",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nContent-Length: 3\r\n\r\nnew", (201, b"new", True)),
    Row("204 has no body", b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
        (204, b"", True)),
    Row("304 has no body", b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
        (304, b"", True)),
    Row("reply to HEAD has no body (content-length)", _OK_HEAD + b"Content-Length: 1234\r\n\r\n",
        (200, b"", True), head=True),
    Row("reply to HEAD has no body (chunked)", _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n",
        (200, b"", True), head=True),
    Row("gzip, content-length", _OK_HEAD + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
        % len(_GZ) + _GZ, (200, _TEXT, True)),
    Row("x-gzip, chunked", _OK_HEAD + b"Content-Encoding: X-GZIP\r\nTransfer-Encoding: chunked\r\n"
        b"\r\n" + _chunked(_GZ[:7], _GZ[7:30], _GZ[30:]), (200, _TEXT, True)),
    Row("deflate, until close", b"HTTP/1.0 200 OK\r\nContent-Encoding: deflate\r\n\r\n" + _DEFLATE,
        (200, _TEXT, False), eof=True),
    Row("identity encoding",
        _OK_HEAD + b"Content-Encoding: identity\r\nContent-Length: 2\r\n\r\nok",
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
    Row("extra bytes after a content-length body -> not reusable",
        _OK_HEAD + b"Content-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n", (200, b"ok", False)),
    Row("extra bytes after a chunked body -> not reusable",
        _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(b"ok") + b"junk",
        (200, b"ok", False)),
    Row("extra bytes after a 204 -> not reusable", b"HTTP/1.1 204 No Content\r\n\r\njunk",
        (204, b"", False)),
    Row("extra bytes after content-length 0 -> not reusable",
        _OK_HEAD + b"Content-Length: 0\r\n\r\njunk", (200, b"", False)),
]

MALFORMED = [
    Row("status line: not HTTP/1.x", b"HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n",
        (BrokenResponse,)),
    Row("status line: not HTTP", b"ICY 200 OK\r\n\r\n", (BrokenResponse,)),
    Row("status line: non-digit code", b"HTTP/1.1 2x0 OK\r\n\r\n", (BrokenResponse,)),
    Row("status line: short code", b"HTTP/1.1 20\r\n\r\n", (BrokenResponse,)),
    Row("status line: garbage", b"<html>oops</html>\r\n\r\n", (BrokenResponse,)),
    Row("chunk size 0x10", _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n0x10\r\n"
        + b"a" * 16 + b"\r\n0\r\n\r\n", (BrokenResponse,)),
    Row("chunk size -1", _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n-1\r\nx\r\n0\r\n\r\n",
        (BrokenResponse,)),
    Row("chunk size empty", _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n\r\nx\r\n0\r\n\r\n",
        (BrokenResponse,)),
    Row("chunk data longer than its size", _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
        b"2\r\nabc\r\n0\r\n\r\n", (BrokenResponse,)),
    Row("content-length -1", _OK_HEAD + b"Content-Length: -1\r\n\r\nx", (BrokenResponse,)),
    Row("content-length non-digit", _OK_HEAD + b"Content-Length: 12a\r\n\r\nx", (BrokenResponse,)),
    Row("content-length empty", _OK_HEAD + b"Content-Length:\r\n\r\nx", (BrokenResponse,)),
    Row("conflicting content-length", _OK_HEAD + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n"
        b"abc", (BrokenResponse,)),
    Row("header line without a colon", _OK_HEAD + b"Content-Length 2\r\n\r\nok",
        (BrokenResponse,)),
    Row("header name followed by a space", _OK_HEAD + b"Content-Length : 2\r\n\r\nok",
        (BrokenResponse,)),
    Row("header with an empty name", _OK_HEAD + b": 2\r\n\r\nok", (BrokenResponse,)),
    Row("transfer coding other than chunked", _OK_HEAD + b"Transfer-Encoding: gzip, chunked"
        b"\r\n\r\n2\r\nok\r\n0\r\n\r\n", (BrokenResponse,)),
    Row("unsupported content-encoding (br)",
        _OK_HEAD + b"Content-Encoding: br\r\nContent-Length: 2\r\n\r\nok", (BrokenResponse,)),
    Row("cut mid-body (content-length)", _OK_HEAD + b"Content-Length: 10\r\n\r\nhello",
        (BrokenResponse,), eof=True),
    Row("cut mid-body (chunked)", _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhel",
        (BrokenResponse,), eof=True),
    Row("cut in the trailers", _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\nX: 1",
        (BrokenResponse,), eof=True),
    Row("cut in the head, after some bytes", _OK_HEAD + b"Content-Len", (BrokenResponse,),
        eof=True),
    Row("cut after a 100 continue", b"HTTP/1.1 100 Continue\r\n\r\n", (BrokenResponse,),
        eof=True),
    Row("closed before any byte", b"", (Disconnected,), eof=True),
]

TABLE = GOOD + MALFORMED


def _params(rows: list[Row]) -> Any:
    return pytest.mark.parametrize("row", rows, ids=[r.name for r in rows])


@_params(TABLE)
async def test_table_whole(row: Row) -> None:
    pieces = [row.wire] if row.wire else []
    assert await _outcome(pieces, head=row.head, eof=row.eof) == row.expected


@_params(TABLE)
async def test_table_split_at_every_offset(row: Row) -> None:
    """Where TCP cuts the bytes changes nothing."""
    for cut in range(1, len(row.wire)):
        pieces = [row.wire[:cut], row.wire[cut:]]
        assert await _outcome(pieces, head=row.head, eof=row.eof) == row.expected, cut


_BYTEWISE = [r for r in TABLE if r.name in {
    "content-length", "chunked with extensions and trailers", "100 continue, then 200",
    "gzip, content-length", "http/1.0 without framing: until close", "chunk size 0x10",
    "extra bytes after a chunked body -> not reusable", "cut mid-body (chunked)",
}]


@_params(_BYTEWISE)
async def test_table_byte_by_byte(row: Row) -> None:
    pieces = [row.wire[i:i + 1] for i in range(len(row.wire))]
    assert await _outcome(pieces, head=row.head, eof=row.eof) == row.expected


_HEAD_ERRORS = [r for r in MALFORMED if r.name.startswith(("status line", "header"))
                or r.name in {"conflicting content-length", "cut in the head, after some bytes",
                              "cut after a 100 continue", "closed before any byte"}]


@_params(_HEAD_ERRORS)
async def test_a_broken_head_raises_from_read_head(row: Row) -> None:
    """So Pool.request raises it, where UpstreamClient retries a Disconnected."""
    conn, _ = await _feed([row.wire] if row.wire else [], eof=row.eof)
    with pytest.raises(row.expected[0]):
        await conn.read_head()
    assert conn.status == 0


async def test_chunk_size_line_over_4_kib_is_refused() -> None:
    wire = _OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n1;" + b"x" * 5000
    assert await _outcome([wire]) == (BrokenResponse,)


async def test_headers_lowercased_stripped_and_repeats_joined() -> None:
    conn, _ = await _feed([_OK_HEAD + b"Content-Type:  application/json \r\nX-A: 1\r\n"
                           b"x-a: 2\r\nContent-Length: 2\r\n\r\nok"])
    assert await _read_all(conn) == b"ok"
    assert conn.headers == {b"content-type": b"application/json", b"x-a": b"1, 2",
                            b"content-length": b"2"}


async def test_malformed_reply_aborts_the_connection() -> None:
    """Bytes that break the framing leave the socket unusable: it is dropped at once."""
    conn, transport = await _feed([_OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n"])
    assert transport.count("abort") == 1
    assert conn.closed and not conn.keep_alive
    with pytest.raises(BrokenResponse):
        await _read_all(conn)


async def test_bytes_after_the_reply_in_a_later_packet_abort_the_connection() -> None:
    conn, transport = await _feed([_OK_HEAD + b"Content-Length: 2\r\n\r\nok"])
    assert await _read_all(conn) == b"ok"
    assert conn.keep_alive and transport.count("abort") == 0
    conn.data_received(b"HTTP/1.1 200 OK\r\n")
    assert transport.count("abort") == 1
    assert conn.closed and not conn.keep_alive


async def test_head_over_64_kib_without_its_end_is_refused() -> None:
    big = _OK_HEAD + b"X-Big: " + b"a" * (64 * 1024)
    pieces = [big[i:i + 8192] for i in range(0, len(big), 8192)]
    conn, transport = await _feed(pieces)
    with pytest.raises(BrokenResponse):
        await conn.read_head()
    assert transport.count("abort") == 1


async def test_head_just_under_64_kib_is_accepted() -> None:
    head = _OK_HEAD + b"X-Big: " + b"a" * (60 * 1024) + b"\r\nContent-Length: 2\r\n\r\n"
    pieces = [head[i:i + 8192] for i in range(0, len(head), 8192)] + [b"ok"]
    conn, _ = await _feed(pieces)
    assert await _read_all(conn) == b"ok"


async def test_body_delivered_before_a_cut_is_readable_then_the_cut_raises() -> None:
    conn, _ = await _feed([_OK_HEAD + b"Content-Length: 10\r\n\r\nhello"], eof=True)
    await conn.read_head()
    assert await conn.readany() == b"hello"
    with pytest.raises(BrokenResponse):
        await conn.readany()
    assert not conn.complete


# --- protocol facts the first version of the parser got wrong --------------------------


async def test_identical_repeated_content_length_is_one_length() -> None:
    """RFC 9110 §8.6: repeated identical Content-Length values may be read as one; the
    parser's own check (refuse only *differing* values) means to accept them."""
    wire = _OK_HEAD + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello"
    assert await _outcome([wire]) == (200, b"hello", True)


@pytest.mark.parametrize("cut", [0, 40 * 1024], ids=["one read", "two reads"])
async def test_head_over_64_kib_is_refused_however_it_arrives(cut: int) -> None:
    wire = _OK_HEAD + b"X-Big: " + b"a" * (70 * 1024) + b"\r\nContent-Length: 2\r\n\r\nok"
    pieces = [wire[:cut], wire[cut:]] if cut else [wire]
    assert await _outcome(pieces) == (BrokenResponse,)


@pytest.mark.parametrize("encoding", [b"gzip", b"deflate"])
async def test_corrupt_compressed_body_is_a_broken_response(encoding: bytes) -> None:
    wire = (_OK_HEAD + b"Content-Encoding: " + encoding + b"\r\nContent-Length: 11\r\n\r\n"
            b"not-deflate")
    assert await _outcome([wire]) == (BrokenResponse,)


async def test_compressed_body_cut_short_is_a_broken_response() -> None:
    """The framing ended (an orderly close) inside the gzip stream: not a whole body."""
    packed = gzip.compress(b"x" * 5000)[:-20]
    conn, _ = await _feed([b"HTTP/1.0 200 OK\r\nContent-Encoding: gzip\r\n\r\n" + packed])
    conn.connection_lost(None)
    with pytest.raises(BrokenResponse):
        await _read_all(conn)


async def test_until_close_body_ended_by_a_reset_is_broken() -> None:
    """Only an orderly close delimits a close-framed body; a reset means it was cut."""
    conn, _ = await _feed([b"HTTP/1.0 200 OK\r\n\r\npartial"])
    conn.connection_lost(ConnectionResetError(104, "Connection reset by peer"))
    with pytest.raises(BrokenResponse):
        await _read_all(conn)


# --- property: random framing, random cuts --------------------------------------------------


@st.composite
def _replies(draw: st.DrawFn) -> tuple[bytes, list[bytes], bool, bool]:
    """(decoded body, wire pieces, server closes at the end, reusable)."""
    body = draw(st.binary(max_size=2000) | st.text(max_size=600).map(str.encode))
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    encoding = draw(st.sampled_from([b"", b"gzip", b"deflate"]))
    payload = {b"": body, b"gzip": gzip.compress(body), b"deflate": zlib.compress(body)}[encoding]
    head = b"HTTP/1.1 200 OK\r\n"
    if encoding:
        head += b"Content-Encoding: " + encoding + b"\r\n"
    if framing == "length":
        head += b"Content-Length: %d\r\n" % len(payload)
        framed = payload
    elif framing == "chunked":
        head += b"Transfer-Encoding: chunked\r\n"
        sizes = draw(st.lists(st.integers(1, 300), min_size=1, max_size=10))
        extension = draw(st.sampled_from([b"", b";x", b";name=value"]))
        framed, pos, i = b"", 0, 0
        while pos < len(payload):
            piece = payload[pos:pos + sizes[i % len(sizes)]]
            framed += b"%x%s\r\n%s\r\n" % (len(piece), extension, piece)
            pos += len(piece)
            i += 1
        framed += b"0\r\n" + draw(st.sampled_from([b"", b"X-T: 1\r\n"])) + b"\r\n"
    else:
        head += b"Connection: close\r\n"
        framed = payload
    if draw(st.booleans()):
        head = b"HTTP/1.1 100 Continue\r\n\r\n" + head
    wire = head + b"\r\n" + framed
    cuts = sorted(set(draw(st.lists(st.integers(0, len(wire)), max_size=12))))
    pieces = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True) if b > a]
    return body, pieces, framing == "close", framing != "close"


@FAST
@given(_replies())
def test_any_framing_any_cuts_decodes_the_body(reply: tuple[bytes, list[bytes], bool, bool]
                                               ) -> None:
    body, pieces, eof, reusable = reply
    assert asyncio.run(_outcome(pieces, eof=eof)) == (200, body, reusable)


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


async def test_backpressure_counts_decoded_bytes() -> None:
    body = b"z" * (300 * 1024)
    packed = gzip.compress(body)
    assert len(packed) < 256 * 1024
    conn, transport = await _feed([_OK_HEAD + b"Content-Encoding: gzip\r\nContent-Length: %d"
                                   b"\r\n\r\n" % len(packed) + packed])
    assert transport.count("pause_reading") == 1
    assert await _read_all(conn) == body
    assert transport.count("resume_reading") == 1


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
        with pytest.raises(TimeoutError):
            await pool.request("GET", "/b", None, head_timeout=0.2, body_timeout=1)
        assert 0.15 < loop.time() - start < 0.6
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


async def test_connect_refused_raises_oserror_and_frees_the_slot(pools: Any) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed at once: nothing listens there
    pool = pools(f"http://127.0.0.1:{port}", limit=1, connect_timeout=1.0)
    for _ in range(2):  # a leaked slot would make the second wait forever
        with pytest.raises(ConnectionRefusedError):
            await asyncio.wait_for(_get(pool), 1.0)
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
        assert 0.19 <= loop.time() - start < 1.0
        await asyncio.wait_for(srv.eof.wait(), 1.0)  # the connection was dropped
        assert pool.open_connections == 0


@pytest.mark.parametrize(("head_timeout", "body_timeout"), [(5.0, 0.2), (0.1, 0.3)],
                         ids=["body timeout shorter", "body timeout longer"])
async def test_stalled_body_times_out_after_body_timeout(
    pools: Any, head_timeout: float, body_timeout: float
) -> None:
    async with Upstream(_partial_body(10, b"hello")) as srv:
        pool = pools(srv.url)
        loop = asyncio.get_running_loop()
        resp = await pool.request("GET", "/", None, head_timeout=head_timeout,
                                  body_timeout=body_timeout)
        assert await resp.readany() == b"hello"
        start = loop.time()
        with pytest.raises(TimeoutError):
            await resp.readany()
        assert body_timeout - 0.01 <= loop.time() - start < body_timeout + 0.5
        resp.close()
        await asyncio.wait_for(srv.eof.wait(), 1.0)


async def test_a_slow_steady_body_is_not_a_timeout(pools: Any) -> None:
    """The body timeout bounds the gap between bytes, not the whole body."""
    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(6):
            await asyncio.sleep(0.05)
            writer.write(b"1\r\n%d\r\n" % i)
        writer.write(b"0\r\n\r\n")
        await srv.wait_client_close(reader)

    async with Upstream(handler) as srv:
        pool = pools(srv.url)
        resp = await pool.request("GET", "/", None, head_timeout=0.25, body_timeout=0.25)
        assert await resp.read() == b"012345"  # 0.3 s in all, never 0.25 s without a byte
        resp.release()


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
    monkeypatch.setattr(httpclient, "KEEPALIVE", 0.05)
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
    monkeypatch.setattr(httpclient, "KEEPALIVE", 0.05)
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


async def test_head_request_over_a_socket_reads_no_body_and_keeps_the_connection(
    pools: Any,
) -> None:
    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        while True:
            request = await srv.read_request(reader)
            if request.startswith(b"HEAD "):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n")
            else:
                writer.write(_reply())

    async with Upstream(handler) as srv:
        pool = pools(srv.url)
        resp = await pool.request("HEAD", "/health", None, head_timeout=1, body_timeout=1)
        assert resp.headers[b"content-length"] == b"5000"
        assert await resp.read() == b""
        resp.release()
        assert await _get(pool) == b"ok"
        assert srv.connections == 1


@pytest.mark.parametrize("encoding", [b"", b"gzip"])
async def test_until_close_body_over_a_socket_ends_at_the_servers_close(
    pools: Any, encoding: bytes
) -> None:
    body = b"streamed until the server closes " * 50

    async def handler(srv: Upstream, index: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        payload = gzip.compress(body) if encoding else body
        writer.write(b"HTTP/1.0 200 OK\r\n" + (b"Content-Encoding: gzip\r\n" if encoding else b"")
                     + b"\r\n" + payload[:100])
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
