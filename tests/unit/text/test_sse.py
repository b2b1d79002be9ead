"""SSE codec: the decoder follows the WHATWG parsing rules the upstreams and SDKs use."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.http.writer import PING
from gateway.text.sse import SSEDecoder, SSEEventTooLarge, encode_event

# (name, body, payloads): the body fed whole, then flushed at EOF
TABLE = [
    ("lf", b"data: a\n\ndata: b\n\n", [b"a", b"b"]),
    ("crlf", b"data: a\r\n\r\ndata: b\r\n\r\n", [b"a", b"b"]),
    ("cr", b"data: a\r\rdata: b\r\r", [b"a", b"b"]),
    ("mixed endings", b"data: a\r\n\ndata: b\r\r\ndata: c\n\r", [b"a", b"b", b"c"]),
    ("no space after colon", b"data:{}\n\n", [b"{}"]),
    ("only one space removed", b"data:  x\n\n", [b" x"]),
    ("multi-line data joined with LF", b'data: {"a":\ndata: 1}\n\n', [b'{"a":\n1}']),
    ("comments ignored", b": keepalive\n\n:x\ndata: a\n: mid\n\n", [b"a"]),
    ("other fields ignored", b"event: e\nid: 1\nretry: 5\ndata: a\n\n", [b"a"]),
    ("event without data skipped", b"event: ping\n\ndata: a\n\n", [b"a"]),
    ("empty data skipped", b"data:\n\ndata: \n\ndata: a\n\n", [b"a"]),
    ("field without colon", b"data\ndata: x\n\n", [b"\nx"]),
    ("unknown field with data", b"foo: bar\ndata: a\n\n", [b"a"]),
    ("colon in value kept", b"data: a: b\n\n", [b"a: b"]),
    ("blank lines between", b"\n\n\ndata: a\n\n\n\n", [b"a"]),
    ("done", b"data: [DONE]\n\n", [b"[DONE]"]),
    ("unterminated final event", b"data: a\n\ndata: b", [b"a", b"b"]),
    ("unterminated final event with LF", b"data: a\n", [b"a"]),
    ("field name is case-sensitive", b"Data: a\n\ndata: b\n\n", [b"b"]),
    ("utf-8 passes through", 'data: {"t":"Grüße 👋"}\n\n'.encode(), ['{"t":"Grüße 👋"}'.encode()]),
]


def _decode(chunks: list[bytes]) -> list[bytes]:
    d = SSEDecoder()
    out: list[bytes] = []
    for c in chunks:
        out += d.feed(c)
    return out + d.flush()


@pytest.mark.parametrize(
    ("body", "expected"), [(b, e) for _, b, e in TABLE], ids=[n for n, *_ in TABLE]
)
def test_table_whole(body: bytes, expected: list[bytes]) -> None:
    assert _decode([body]) == expected


@pytest.mark.parametrize(
    ("body", "expected"), [(b, e) for _, b, e in TABLE], ids=[n for n, *_ in TABLE]
)
def test_table_split_at_every_offset(body: bytes, expected: list[bytes]) -> None:
    for cut in range(len(body) + 1):
        assert _decode([body[:cut], body[cut:]]) == expected, cut


@pytest.mark.parametrize(
    ("body", "expected"), [(b, e) for _, b, e in TABLE], ids=[n for n, *_ in TABLE]
)
def test_table_byte_by_byte(body: bytes, expected: list[bytes]) -> None:
    assert _decode([body[i : i + 1] for i in range(len(body))]) == expected


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: a\r") == []
    # the LF completes the CRLF; only the next CR ends the event
    assert d.feed(b"\n") == []
    assert d.feed(b"\r") == [b"a"]
    assert d.feed(b"\ndata: b\n\n") == [b"b"]


def test_events_are_returned_as_soon_as_complete() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: a\n") == []
    assert d.feed(b"\ndata: b\n\ndata: c") == [b"a", b"b"]
    assert d.flush() == [b"c"]
    assert d.flush() == []


def test_size_guard_on_a_line_without_end() -> None:
    d = SSEDecoder(max_event_bytes=64)
    d.feed(b"data: " + b"x" * 50)
    with pytest.raises(SSEEventTooLarge, match="size limit"):
        d.feed(b"x" * 20)


def test_size_guard_on_one_chunk_with_a_long_unfinished_line() -> None:
    d = SSEDecoder(max_event_bytes=64)
    with pytest.raises(SSEEventTooLarge, match="size limit"):
        d.feed(b"data: a\n\ndata: " + b"y" * 80)


def test_size_guard_on_an_event_of_many_lines() -> None:
    d = SSEDecoder(max_event_bytes=64)
    with pytest.raises(SSEEventTooLarge, match="size limit"):
        d.feed(b"data: " + b"z" * 30 + b"\n" + b"data: " + b"z" * 30 + b"\n" + b"data: zzzz\n")


def test_size_guard_allows_exactly_the_limit() -> None:
    d = SSEDecoder(max_event_bytes=64)
    assert d.feed(b"data: " + b"q" * 58 + b"\n\n") == [b"q" * 58]
    # the limit is per event: the next one starts from zero
    assert d.feed(b"data: " + b"q" * 58 + b"\n\n") == [b"q" * 58]


def test_comment_lines_do_not_count_toward_event_size() -> None:
    d = SSEDecoder(max_event_bytes=64)
    for _ in range(10):
        assert d.feed(b": " + b"c" * 50 + b"\n") == []
    assert d.feed(b"data: ok\n\n") == [b"ok"]


def test_encoder_frames() -> None:
    assert encode_event("message_stop", b'{"type":"message_stop"}') == (
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )


def test_encoder_output_round_trips_through_the_decoder() -> None:
    frames = encode_event("a", b'{"x":1}') + PING + b"data: [1]\n\n"
    assert _decode([frames]) == [b'{"x":1}', b'{"type":"ping"}', b"[1]"]


def test_named_events_keep_their_names() -> None:
    """A Responses stream names its events; the name goes with its payload, and an event
    without data (or a comment) does not pass its name on."""
    body = (
        b"event: response.created\ndata: {}\n\n: keepalive\n\n"
        b"event: orphan\n\ndata: [DONE]\n\nevent: last\ndata: x"
    )
    for cut in range(len(body) + 1):
        d = SSEDecoder()
        out = d.feed_named(body[:cut]) + d.feed_named(body[cut:]) + d.flush_named()
        assert out == [(b"response.created", b"{}"), (b"", b"[DONE]"), (b"last", b"x")], cut


def test_an_event_name_read_alone_is_not_idle() -> None:
    d = SSEDecoder()
    assert d.feed_named(b"event: response.created\n") == []
    assert not d.idle
    assert d.feed_named(b"data: {}\n\n") == [(b"response.created", b"{}")]
    assert d.idle


_PIECES = [
    b"data: ",
    b"data:",
    b"data",
    b"event: x",
    b": c",
    b"id: 1",
    b"\n",
    b"\n\n",
    b"\r",
    b"\r\n",
    b'{"a":1}',
    b"[DONE]",
    b" ",
    b"q" * 40,
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=30), st.integers(1, 7))
def test_whole_reads_decode_as_line_by_line(pieces: list[bytes], step: int) -> None:
    """A read holding whole events takes the split-at-blank-lines path; reads cut
    anywhere take the line path: both give the same payloads (the size guards have
    tests of their own above)."""
    body = b"".join(pieces)

    def run(chunks: list[bytes]) -> list[bytes]:
        d = SSEDecoder()
        out: list[bytes] = []
        for c in chunks:
            out += d.feed(c)
        return out + d.flush()

    whole = run([body])
    assert whole == run([body[i : i + step] for i in range(0, len(body), step)])


def test_one_data_line_events_keep_the_size_guard() -> None:
    d = SSEDecoder(max_event_bytes=64)
    assert d.feed(b"data: " + b"q" * 63 + b"\n\n") == [b"q" * 63]
    with pytest.raises(SSEEventTooLarge, match="size limit"):
        d.feed(b"data: " + b"q" * 64 + b"\n\n")
