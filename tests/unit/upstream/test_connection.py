"""gateway/upstream/connection.py: the connection's framing (llhttp) fed byte by byte, its
anomalies, deadlines and caps (the pool and the client over loopback sockets: test_pool.py,
test_upstream_client.py; their shared scripts: tests/upstream_wire.py).

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

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.ops.metrics import PROTOCOL_ERRORS
from gateway.upstream.connection import MAX_INTERIM
from gateway.upstream.exceptions import (
    BrokenResponse,
    ProtocolError,
)
from tests.upstream_wire import (
    ANOMALIES,
    CONTINUE,
    CUT,
    FAST,
    LATE,
    OK_HEAD,
    TABLE,
    Row,
    chunked_body,
    feed,
    outcome,
    read_all,
    table_params,
)


def test_every_anomaly_kind_is_a_metric_label() -> None:
    kinds = {row.expected[1] for row in ANOMALIES}
    # request_id_missing needs a pool that requires the echo: tests/unit/upstream/test_reuse.py
    assert kinds | {"head_too_large", "request_id_missing"} == set(PROTOCOL_ERRORS)


@table_params(TABLE)
async def test_table_whole(row: Row) -> None:
    pieces = [row.wire] if row.wire else []
    assert await outcome(pieces, eof=row.eof) == row.expected


@table_params(TABLE)
async def test_table_split_at_every_offset(row: Row) -> None:
    """Where TCP cuts the bytes changes nothing."""
    for cut in range(1, len(row.wire)):
        pieces = [row.wire[:cut], row.wire[cut:]]
        assert await outcome(pieces, eof=row.eof) == row.expected, cut


_BYTEWISE = [
    r
    for r in TABLE
    if r.name
    in {
        "content-length",
        "chunked with extensions and trailers",
        "100 continue, then 200",
        "http/1.0 without framing: until close",
        "chunk size 0x10",
        "content-length and chunked",
        "extra bytes after a chunked body",
        "cut mid-body (chunked)",
        "another request's id echoed",
    }
]


@table_params(_BYTEWISE)
async def test_table_byte_by_byte(row: Row) -> None:
    pieces = [row.wire[i : i + 1] for i in range(len(row.wire))]
    assert await outcome(pieces, eof=row.eof) == row.expected


_HEAD_ERRORS = [
    r
    for r in ANOMALIES + CUT
    if r.name.startswith(("status line", "header"))
    or r.name
    in {
        "conflicting content-length",
        "cut in the head, after some bytes",
        "cut after a 100 continue",
        "closed before any byte",
        "content-length and chunked",
        "101 switching protocols",
        "status 600",
        "another request's id echoed",
        "gzip content-encoding",
        f"{MAX_INTERIM + 1} interim replies",
    }
]


@table_params(_HEAD_ERRORS)
async def test_a_broken_head_raises_from_read_head(row: Row) -> None:
    """So Pool.request raises it, where UpstreamClient retries a Disconnected."""
    conn, _ = await feed([row.wire] if row.wire else [], eof=row.eof)
    with pytest.raises(row.expected[0]):
        await conn.read_head()
    assert conn.status == 0


@table_params([r for r in ANOMALIES if r.name.startswith(("extra bytes", "a second", "body past"))])
async def test_bytes_after_a_whole_reply_fail_it_after_its_body(row: Row) -> None:
    """The reply read so far may itself be the stray one (a double reply answers the
    previous request first): the body comes out, then the anomaly, never a clean end."""
    conn, _ = await feed([row.wire])
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
    flood = CONTINUE * (1024 * 1024 // len(CONTINUE))
    conn, transport = await feed([flood])
    assert conn._interim == MAX_INTERIM + 1
    assert transport.count("abort") == 1
    with pytest.raises(ProtocolError) as caught:
        await conn.read_head()
    assert caught.value.kind == "interim_flood"


async def test_interim_replies_do_not_extend_the_head_deadline() -> None:
    """A 1xx every 50 ms is still no final head: the deadline from the send holds."""
    conn, _ = await feed([], within=0.25)
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
    conn, _ = await feed(
        [
            OK_HEAD + b"Content-Type:  application/json \r\nX-A: 1\r\n"
            b"x-a: 2\r\nContent-Length: 2\r\n\r\nok"
        ]
    )
    assert await read_all(conn) == b"ok"
    assert conn.headers == {
        b"content-type": b"application/json ",
        b"x-a": b"1, 2",
        b"content-length": b"2",
    }


async def test_trailers_do_not_reach_the_headers() -> None:
    conn, _ = await feed(
        [
            OK_HEAD
            + b"Transfer-Encoding: chunked\r\n\r\n"
            + chunked_body(b"ok", trailers=b"X-T: 1\r\n")
        ]
    )
    assert await read_all(conn) == b"ok"
    assert conn.headers == {b"transfer-encoding": b"chunked"}


async def test_malformed_reply_aborts_the_connection() -> None:
    """Bytes that break the framing leave the socket unusable: it is dropped at once."""
    conn, transport = await feed([OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n"])
    assert transport.count("abort") == 1
    assert conn.closed and not conn.keep_alive
    with pytest.raises(ProtocolError):
        await read_all(conn)


async def test_bytes_after_the_reply_in_a_later_packet_abort_the_connection() -> None:
    conn, transport = await feed([OK_HEAD + b"Content-Length: 2\r\n\r\nok"])
    assert await read_all(conn) == b"ok"
    assert conn.keep_alive and transport.count("abort") == 0
    conn.data_received(b"HTTP/1.1 200 OK\r\n")
    assert transport.count("abort") == 1
    assert conn.closed and not conn.keep_alive
    assert conn._pool.anomalies == [("extra_bytes", "body")]  # type: ignore[attr-defined]


async def test_bytes_while_parked_are_an_anomaly_of_the_idle_phase() -> None:
    conn, transport = await feed([OK_HEAD + b"Content-Length: 2\r\n\r\nok"])
    assert await read_all(conn) == b"ok"
    conn.park()
    conn.data_received(b"\r\n")
    assert transport.count("abort") == 1
    assert conn._pool.anomalies == [("extra_bytes", "idle")]  # type: ignore[attr-defined]


async def test_head_over_64_kib_without_its_end_is_refused() -> None:
    big = OK_HEAD + b"X-Big: " + b"a" * (64 * 1024)
    pieces = [big[i : i + 8192] for i in range(0, len(big), 8192)]
    conn, transport = await feed(pieces)
    with pytest.raises(ProtocolError, match="head_too_large"):
        await conn.read_head()
    assert transport.count("abort") == 1


async def test_head_just_under_64_kib_is_accepted() -> None:
    head = OK_HEAD + b"X-Big: " + b"a" * (60 * 1024) + b"\r\nContent-Length: 2\r\n\r\n"
    pieces = [head[i : i + 8192] for i in range(0, len(head), 8192)] + [b"ok"]
    conn, _ = await feed(pieces)
    assert await read_all(conn) == b"ok"


@pytest.mark.parametrize("cut", [0, 40 * 1024], ids=["one read", "two reads"])
async def test_head_over_64_kib_is_refused_however_it_arrives(cut: int) -> None:
    wire = OK_HEAD + b"X-Big: " + b"a" * (70 * 1024) + b"\r\nContent-Length: 2\r\n\r\nok"
    pieces = [wire[:cut], wire[cut:]] if cut else [wire]
    assert await outcome(pieces) == (ProtocolError, "head_too_large")


@pytest.mark.parametrize(
    "junk",
    [b"X-T: " + b"t" * (70 * 1024), b"1;" + b"x" * (70 * 1024)],
    ids=["a trailer", "a chunk extension"],
)
async def test_framing_without_body_past_64_kib_is_refused(junk: bytes) -> None:
    """llhttp holds a trailer until it ends: a never-ending one must not grow us."""
    wire = (
        OK_HEAD
        + b"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n"
        + (b"0\r\n" + junk if junk.startswith(b"X-T") else junk)
    )
    pieces = [wire[i : i + 4096] for i in range(0, len(wire), 4096)]
    assert await outcome(pieces) == (ProtocolError, "head_too_large")


async def test_body_delivered_before_a_cut_is_readable_then_the_cut_raises() -> None:
    conn, _ = await feed([OK_HEAD + b"Content-Length: 10\r\n\r\nhello"], eof=True)
    await conn.read_head()
    assert await conn.readany() == b"hello"
    with pytest.raises(BrokenResponse):
        await conn.readany()
    assert not conn.complete


async def test_until_close_body_ended_by_a_reset_is_broken() -> None:
    """Only an orderly close delimits a close-framed body; a reset means it was cut."""
    conn, _ = await feed([b"HTTP/1.0 200 OK\r\n\r\npartial"])
    conn.connection_lost(ConnectionResetError(104, "Connection reset by peer"))
    with pytest.raises(BrokenResponse) as caught:
        await read_all(conn)
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
            piece = body[pos : pos + sizes[i % len(sizes)]]
            framed += b"%x%s\r\n%s\r\n" % (len(piece), extension, piece)
            pos += len(piece)
            i += 1
        framed += b"0\r\n" + draw(st.sampled_from([b"", b"X-T: 1\r\n"])) + b"\r\n"
    else:
        head += b"Connection: close\r\n"
        framed = body
    head = CONTINUE * draw(st.integers(0, MAX_INTERIM)) + head
    wire = head + b"\r\n" + framed
    cuts = sorted(set(draw(st.lists(st.integers(0, len(wire)), max_size=12))))
    pieces = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True) if b > a]
    return body, pieces, framing == "close", framing != "close"


@FAST
@given(_replies())
def test_any_framing_any_cuts_reads_the_body(reply: tuple[bytes, list[bytes], bool, bool]) -> None:
    body, pieces, eof, reusable = reply
    assert asyncio.run(outcome(pieces, eof=eof)) == (200, body, reusable)


# --- deadlines, through the fake transport ----------------------------------------------------


async def test_a_drip_fed_head_ends_at_the_head_deadline() -> None:
    """A byte of head every 20 ms is progress of a kind, but not a head: header_timeout is
    a deadline from the send, not a silence."""
    conn, _ = await feed([], within=0.2)
    wire = OK_HEAD + b"X-Slow: " + b"s" * 100

    async def drip() -> None:
        for i in range(len(wire)):
            conn.data_received(wire[i : i + 1])
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
    conn, _ = await feed([OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"], stream=True, within=0.2)
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
    conn, _ = await feed([OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"], stream=True, within=0.5)
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
    conn, _ = await feed([OK_HEAD + b"Content-Length: 1000\r\n\r\n"], within=0.25)
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
    conn, transport = await feed([OK_HEAD + b"Content-Length: %d\r\n\r\n" % total])
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
