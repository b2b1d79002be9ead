"""Property tests: random upstream streams through the SSE decoder and the StreamTranslator.

Properties: no exception escapes except the documented ones (the decoder's SSEEventTooLarge size
guard); every terminated stream passes ``check_stream``; a well-formed upstream stream keeps
all its text, thinking and tool arguments (each call's pieces join to exactly its arguments),
however the body is cut into reads and whatever line endings it uses.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.messages.stream.translator import StreamTranslator
from gateway.text.sse import SSEDecoder, SSEEventTooLarge
from tests.anthropic_stream_check import check_stream
from tests.fuzzing import EXAMPLES

FAST = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_text = st.text(min_size=1, max_size=8)
_json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def _chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "chatcmpl-f",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def _split(s: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(s) + 1) for c in cuts})
    pieces, last = [], 0
    for p in [*points, len(s)]:
        pieces.append(s[last:p])
        last = p
    return pieces


@st.composite
def _scripts(draw: st.DrawFn) -> dict[str, Any]:
    """A well-formed upstream stream plus what it means."""
    chunks: list[dict[str, Any]] = []
    thinking = draw(st.lists(_text, max_size=3))
    field = draw(st.sampled_from(["reasoning_content", "reasoning"]))
    chunks += [_chunk({field: t}) for t in thinking]
    text = draw(st.lists(_text, max_size=3))
    chunks += [_chunk({"content": t}) for t in text]
    calls = []
    for k in range(draw(st.integers(0, 3))):
        args = json.dumps(draw(st.dictionaries(st.text(max_size=4), _json_value, max_size=3)))
        pieces = _split(args, draw(st.lists(st.integers(0, 200), max_size=4)))
        calls.append((k, f"call_{k}", f"tool_{k}", args, pieces))
    # per-call delta lists, merged in a random interleaving that keeps each call's order
    queues = []
    for k, cid, name, _args, pieces in calls:
        first = {"index": k, "id": cid, "type": "function", "function": {"name": name}}
        queues.append(
            [first] + [{"index": k, "function": {"arguments": p}} for p in pieces],
        )
    while any(queues):
        live = [q for q in queues if q]
        q = live[draw(st.integers(0, len(live) - 1))]
        chunks.append(_chunk({"tool_calls": [q.pop(0)]}))
    tail = draw(st.lists(_text, max_size=2))
    chunks += [_chunk({"content": t}) for t in tail]
    usage = {"prompt_tokens": 3, "completion_tokens": draw(st.integers(0, 50))}
    finish = draw(st.sampled_from(["stop", "length", "tool_calls", "content_filter"]))
    if draw(st.booleans()):
        chunks.append(_chunk({}, finish, usage))
    else:
        chunks.append(_chunk({}, finish))
        chunks.append({"choices": [], "usage": usage})
    return {
        "chunks": chunks,
        "thinking": "".join(thinking),
        "text": "".join(text) + "".join(tail),
        "calls": {cid: (name, args) for _, cid, name, args, _ in calls},
        "done": draw(st.booleans()),
    }


def _body(payloads: list[bytes], eol: bytes) -> bytes:
    return b"".join(b"data: " + p + eol + eol for p in payloads)


def _run(body: bytes, cuts: list[int]) -> tuple[bytes, StreamTranslator]:
    t = StreamTranslator(model="m", message_id="msg_f", signing_key=b"k", input_tokens=1)
    d = SSEDecoder()
    points = sorted({c % (len(body) + 1) for c in cuts})
    reads = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    out: list[bytes] = []
    for payloads in [*(d.feed(r) for r in reads), d.flush()]:
        for p in payloads:
            if not t.done:
                out.append(t.feed(p))
    out.append(t.eof())
    return b"".join(out), t


@FAST
@given(
    script=_scripts(),
    eol=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    cuts=st.lists(st.integers(0, 10_000), max_size=8),
)
def test_well_formed_streams_keep_everything(
    script: dict[str, Any], eol: bytes, cuts: list[int]
) -> None:
    payloads = [json.dumps(c, ensure_ascii=False).encode() for c in script["chunks"]]
    if script["done"]:
        payloads.append(b"[DONE]")
    raw, t = _run(_body(payloads, eol), cuts)
    events = check_stream(raw)
    assert t.termination == "completed"
    text = thinking = ""
    tools: dict[str, list[str]] = {}
    names: dict[str, str] = {}
    current = None
    for ev in events:
        if ev["type"] == "content_block_start" and ev["content_block"]["type"] == "tool_use":
            current = ev["content_block"]["id"]
            names[current] = ev["content_block"]["name"]
            tools[current] = []
        elif ev["type"] == "content_block_delta":
            delta = ev["delta"]
            if delta["type"] == "text_delta":
                text += delta["text"]
            elif delta["type"] == "thinking_delta":
                thinking += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                assert current is not None
                tools[current].append(delta["partial_json"])
    assert text == script["text"]
    assert thinking == script["thinking"]
    want = {cid: (name, args if args else "{}") for cid, (name, args) in script["calls"].items()}
    assert {cid: (names[cid], "".join(p)) for cid, p in tools.items()} == want
    assert t.dropped_tool_deltas == 0


@FAST
@given(
    script=_scripts(),
    cut_at=st.integers(0, 50),
    junk=st.sampled_from(
        [b"{", b"[1]", b'{"error":{"message":"x","code":429}}', b'{"error":"boom"}', b"null"]
    ),
    junk_at=st.integers(-1, 50),
    cuts=st.lists(st.integers(0, 10_000), max_size=5),
)
def test_broken_streams_end_with_one_well_formed_envelope(
    script: dict[str, Any], cut_at: int, junk: bytes, junk_at: int, cuts: list[int]
) -> None:
    payloads = [json.dumps(c).encode() for c in script["chunks"]][:cut_at]
    if junk_at >= 0:
        payloads.insert(min(junk_at, len(payloads)), junk)
    raw, t = _run(_body(payloads, b"\n"), cuts)
    events = check_stream(raw)
    assert t.done
    if t.termination != "completed":
        assert [e["type"] for e in events[-2:]] == ["error", "message_stop"]


_keys = st.sampled_from(
    [
        "choices", "delta", "content", "reasoning_content", "reasoning", "tool_calls", "index",
        "id", "function", "name", "arguments", "finish_reason", "usage", "prompt_tokens",
        "completion_tokens", "error", "object", "matched_stop", "stop_reason", "code",
    ]
)  # fmt: skip
_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-2, 3)
    | st.sampled_from(["stop", "length", "tool_calls", "x", "", "[DONE]", "error"])
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=12,
)


@FAST
@given(
    payloads=st.lists(
        st.one_of(
            _values.map(lambda v: json.dumps(v).encode()),
            st.dictionaries(_keys, _values, max_size=4).map(lambda v: json.dumps(v).encode()),
            st.binary(max_size=20),
        ),
        max_size=12,
    ),
)
def test_garbage_never_escapes(payloads: list[bytes]) -> None:
    t = StreamTranslator(model="m", message_id="msg_g", signing_key=b"k")
    out = b""
    for p in payloads:
        if t.done:
            break
        out += t.feed(p)
    out += t.eof()
    check_stream(out)
    assert t.done and t.termination is not None


@FAST
@given(body=st.binary(max_size=300), cuts=st.lists(st.integers(0, 400), max_size=6))
def test_decoder_is_independent_of_read_boundaries(body: bytes, cuts: list[int]) -> None:
    whole = SSEDecoder()
    expected = whole.feed(body) + whole.flush()
    split = SSEDecoder()
    points = sorted({c % (len(body) + 1) for c in cuts})
    got: list[bytes] = []
    for a, b in zip([0, *points], [*points, len(body)], strict=True):
        got += split.feed(body[a:b])
    assert got + split.flush() == expected


@FAST
@given(body=st.binary(max_size=300), limit=st.integers(1, 40))
def test_decoder_only_raises_its_size_guard(body: bytes, limit: int) -> None:
    d = SSEDecoder(max_event_bytes=limit)
    try:
        payloads = d.feed(body) + d.flush()
    except SSEEventTooLarge as exc:
        assert "size limit" in str(exc)
    else:
        assert all(0 < len(p) <= limit for p in payloads)
