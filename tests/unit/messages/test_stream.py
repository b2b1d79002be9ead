"""StreamTranslator: golden stream pairs plus the state machine's transition rules.

Each ``tests/golden/streams/<case>/`` holds ``upstream.sse`` (raw upstream body bytes),
``expected.sse`` (the exact Anthropic bytes the client must get) and ``meta.json``:
``model``, ``stop_sequences``, ``input_tokens`` (the estimate), optionally ``message_id``,
``signing_key``, ``hosts``, ``thinking`` (the request's; absent: none was asked for, so
reasoning makes no block), ``fail`` (``{"error": <errors class name>, "reason": ...}``: the
caller's ``fail()`` instead of ``eof()`` at the end of the body), ``expect`` (translator
attributes after the stream) and, for what local engines leave in content (the ``local_*``
cases), the normaliser's options: ``tool_names`` (the tools the request offered),
``inline_thinking`` (auto/opened/off) and ``text_tool_calls``; with none of them there is no
normaliser. A bug fix adds a case directory. To add a recording, drop in
``upstream.sse`` and ``meta.json``, run with ``GOLDEN_WRITE=1`` once to write
``expected.sse``, and review that file by hand before committing it.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from gateway import errors
from gateway.local.normalise import ContentNormaliser
from gateway.messages.from_chat import signatures
from gateway.messages.stream.translator import IllegalTransition, State, StreamTranslator
from gateway.text import jsonutil
from tests.anthropic_stream_check import check_stream
from tests.golden_streams import (
    CASES,
    GOLDEN,
    LOCAL_CASES,
    load_case,
    mask_generated_ids,
    run_case,
)


def test_enough_golden_cases() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str) -> None:
    upstream, meta = load_case(case)
    got, translator = run_case(upstream, meta)
    expected_path = GOLDEN / case / "expected.sse"
    if os.environ.get("GOLDEN_WRITE") == "1" and not expected_path.exists():
        expected_path.write_bytes(mask_generated_ids(got))
    assert mask_generated_ids(got) == expected_path.read_bytes()
    check_stream(got)
    assert translator.done and translator.started
    for attr, value in meta.get("expect", {}).items():
        assert getattr(translator, attr) == value, attr
    # the terminal state is idempotent
    assert translator.eof() == b""
    assert translator.fail(errors.UpstreamTimeout()) == b""


@pytest.mark.parametrize("step", [1, 3, 17])
@pytest.mark.parametrize("case", CASES)
def test_golden_split_reads(case: str, step: int) -> None:
    """The output does not depend on how the upstream body was cut into reads."""
    upstream, meta = load_case(case)
    got, _ = run_case(upstream, meta, step)
    assert mask_generated_ids(got) == (GOLDEN / case / "expected.sse").read_bytes()


def test_local_engine_cases_are_there() -> None:
    assert len(LOCAL_CASES) >= 9


@pytest.mark.parametrize("case", LOCAL_CASES)
def test_local_golden_cut_at_every_offset(case: str) -> None:
    """What local engines leave in content is normalised the same wherever the body is cut:
    every cut of the body into two reads gives the golden bytes (a tag, a call or an
    argument piece split between reads included)."""
    upstream, meta = load_case(case)
    expected = (GOLDEN / case / "expected.sse").read_bytes()
    for cut in range(1, len(upstream)):
        got, _ = run_case(upstream, meta, reads=[upstream[:cut], upstream[cut:]])
        assert mask_generated_ids(got) == expected, f"cut at byte {cut}"


# --- hand-written expectations for the decisions the goldens rely on -----------------------

KEY = b"k"


def _t(**kw: Any) -> StreamTranslator:
    return StreamTranslator(model="m", message_id="msg_1", signing_key=KEY, **kw)


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    body: dict[str, Any] = {
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    }
    body.update(extra)
    return jsonutil.dumpb(body)


def test_text_stream_exact_bytes() -> None:
    t = _t(input_tokens=7)
    out = t.feed(_chunk({"content": "Hi"})) + t.feed(_chunk({}, "stop")) + t.feed(b"[DONE]")
    assert out == (
        b"event: message_start\ndata: "
        b'{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",'
        b'"model":"m","content":[],"stop_reason":null,"stop_sequence":null,'
        b'"usage":{"input_tokens":7,"output_tokens":0}}}\n\n'
        b"event: content_block_start\ndata: "
        b'{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
        b"event: content_block_delta\ndata: "
        b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}\n\n'
        b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
        b"event: message_delta\ndata: "
        b'{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
        b'"usage":{"output_tokens":1}}\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )


def test_thinking_signature_is_the_shared_table_over_the_whole_text() -> None:
    t = _t()
    t.feed(_chunk({"reasoning_content": "ab"}))
    t.feed(_chunk({"reasoning": "c"}))
    out = t.feed(_chunk({"content": "x"}))
    sig = signatures.sign(KEY, "abc")  # shown: signed
    assert (b'"delta":{"type":"signature_delta","signature":' + jsonutil.dumpb(sig) + b"}}") in out
    assert signatures.open_signature(KEY, sig) == "abc"
    assert out.index(b"signature_delta") < out.index(b"content_block_stop")


def test_failure_envelope_closes_thinking_with_signature() -> None:
    t = _t()
    out = t.feed(_chunk({"reasoning_content": "partial"}))
    out += t.fail(errors.UpstreamTimeout(), reason="idle_timeout")
    events = check_stream(out)
    assert [e["type"] for e in events[-4:]] == [
        "content_block_delta", "content_block_stop", "error", "message_stop",
    ]  # fmt: skip
    assert signatures.open_signature(KEY, events[-4]["delta"]["signature"]) == "partial"
    assert events[-2]["error"] == {"type": "timeout_error", "message": "Upstream request timed out"}
    assert t.state is State.ERRORED and t.termination == "idle_timeout"
    assert isinstance(t.error, errors.UpstreamTimeout)


def test_inband_error_is_scrubbed_with_hosts() -> None:
    t = _t(hosts=["gpu-7.internal"])
    out = t.feed(b'{"error":{"message":"bad thing on gpu-7.internal","code":400}}')
    events = check_stream(out)
    assert events[-2]["error"] == {
        "type": "invalid_request_error",
        "message": "bad thing on [redacted]",
    }


def test_message_start_takes_prompt_tokens_from_first_chunk_only() -> None:
    t = _t(input_tokens=3)
    first = t.feed(_chunk({"content": "a"}, usage={"prompt_tokens": 50, "completion_tokens": 1}))
    assert b'"usage":{"input_tokens":50,"output_tokens":0}' in first
    t2 = _t(input_tokens=3)
    assert b'"input_tokens":3,' in t2.feed(_chunk({"content": "a"}))
    t2.feed(_chunk({}, "stop", usage={"prompt_tokens": 60, "completion_tokens": 2}))
    t2.feed(b"[DONE]")
    assert (t2.input_tokens, t2.output_tokens) == (60, 2)


def test_unsafe_upstream_tool_id_is_replaced() -> None:
    t = _t()
    tc = {"index": 0, "id": "call with spaces", "function": {"name": "f", "arguments": "{}"}}
    out = t.feed(_chunk({"tool_calls": [tc]})) + t.feed(_chunk({}, "tool_calls")) + t.eof()
    block = check_stream(out)[1]["content_block"]
    assert block["id"].startswith("toolu_") and len(block["id"]) == 30


def test_lone_surrogate_becomes_replacement_character() -> None:
    t = _t()
    out = t.feed(b'{"choices":[{"index":0,"delta":{"content":"a\\ud83d"}}]}')
    assert "a\ufffd".encode() in out
    out += t.feed(b'{"choices":[{"delta":{"reasoning_content":"\\udc00x"}}]}')
    out += t.feed(_chunk({}, "stop")) + t.eof()
    check_stream(out)


@pytest.mark.parametrize(
    "payload",
    [
        b"[1, 2]",
        b'{"choices": {"index": 0}}',
        b'{"choices": [{"index": 0, "delta": {"content": 5}}]}',
        b'{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "0"}]}}]}',
        b'{"choices": [{"index": 0, "finish_reason": 1}]}',
        b"NaN",
    ],
)
def test_wrong_shapes_are_stream_processing_errors(payload: bytes) -> None:
    t = _t()
    out = t.feed(_chunk({"content": "ok"}))
    events = check_stream(out + t.feed(payload))
    assert events[-2]["error"] == {"type": "api_error", "message": "Stream processing error"}
    assert t.termination == "malformed_chunk"


def test_other_choices_are_ignored() -> None:
    t = _t()
    out = t.feed(jsonutil.dumpb({"choices": [{"index": 1, "delta": {"content": "no"}}]}))
    assert b"content_block_start" not in out and t.state is State.BLOCK_OPEN


# --- transitions ------------------------------------------------------------------------


def _in_state(state: State) -> StreamTranslator:
    t = _t()
    if state is State.BLOCK_OPEN:
        t.feed(_chunk({"content": "x"}))
    elif state is State.FINISHED:
        t.feed(_chunk({"content": "x"}, "stop"))
        t.feed(b"[DONE]")
    elif state is State.ERRORED:
        t.feed(b"{")
    assert t.state is state
    return t


HANDLERS = {
    "a chunk": (lambda t: t._payload(b'{"choices": []}', []), {State.PRE_START, State.BLOCK_OPEN}),
    "_on_done": (lambda t: t._on_done(), {State.PRE_START, State.BLOCK_OPEN}),
    "_on_eof": (lambda t: t._on_eof(), {State.PRE_START, State.BLOCK_OPEN}),
    "_on_failure": (
        lambda t: t._on_failure(errors.StreamProcessingError(), "x"),
        {State.PRE_START, State.BLOCK_OPEN},
    ),
    "_on_text": (lambda t: t._on_text("a", []), {State.BLOCK_OPEN}),
    "_on_thinking": (lambda t: t._on_thinking("a", []), {State.BLOCK_OPEN}),
    "_on_tool_delta": (lambda t: t._on_tool_delta({"index": 0}, []), {State.BLOCK_OPEN}),
    "feed": (lambda t: t.feed(_chunk({"content": "y"})), {State.PRE_START, State.BLOCK_OPEN}),
}


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("name", sorted(HANDLERS))
def test_handler_accepts_only_its_states(name: str, state: State) -> None:
    call, accepted = HANDLERS[name]
    t = _in_state(state)
    if state in accepted:
        call(t)
    else:
        with pytest.raises(IllegalTransition, match=state.name):
            call(t)


@pytest.mark.parametrize("state", list(State))
def test_repr_shows_state(state: State) -> None:
    assert f"state={state.name}" in repr(_in_state(state))


def test_terminal_entry_points_are_idempotent() -> None:
    for state in (State.FINISHED, State.ERRORED):
        t = _in_state(state)
        assert t.eof() == b"" and t.fail(errors.UpstreamTimeout()) == b"" and t.done
        with pytest.raises(IllegalTransition):
            t.feed(b"[DONE]")


# --- the checker rejects what clients reject ----------------------------------------------

_GOOD = (GOLDEN / "thinking_text_tool" / "expected.sse").read_bytes()
_ERR = (GOLDEN / "inband_error_during_thinking" / "expected.sse").read_bytes()


def _frames(raw: bytes) -> list[bytes]:
    return [f + b"\n\n" for f in raw[:-2].split(b"\n\n")]


def _drop(raw: bytes, needle: bytes, nth: int = 0) -> bytes:
    frames = _frames(raw)
    hits = [i for i, f in enumerate(frames) if needle in f]
    del frames[hits[nth]]
    return b"".join(frames)


BROKEN = {
    "no trailing blank line": _GOOD[:-1],
    "name differs from type": _GOOD.replace(b"event: message_stop", b"event: message_end", 1),
    "no message_start": _drop(_GOOD, b"message_start"),
    "no message_stop": _drop(_GOOD, b"message_stop"),
    "no message_delta": _drop(_GOOD, b"message_delta"),
    "block never closed": _drop(_GOOD, b"content_block_stop", 1),
    "thinking without signature": _drop(_GOOD, b"signature_delta"),
    "signature key in thinking shell": _GOOD.replace(
        b'"thinking":""}', b'"thinking":"","signature":""}', 1
    ),
    "text shell without text": _GOOD.replace(b'{"type":"text","text":""}', b'{"type":"text"}', 1),
    "index gap": _GOOD.replace(b'"index":1,', b'"index":2,'),
    "tool json incomplete": _GOOD.replace(b'\\"Paris\\"}"', b'\\"Paris\\""', 1),
    "message_delta cache count without input_tokens": _GOOD.replace(
        b'"usage":{"input_tokens":400,"output_tokens":89}',
        b'"usage":{"cache_read_input_tokens":1,"output_tokens":89}',
    ),
    "message_delta usage out of order": _GOOD.replace(
        b'"usage":{"input_tokens":400,"output_tokens":89}',
        b'"usage":{"output_tokens":89,"input_tokens":400}',
    ),
    "message_start key order": _GOOD.replace(
        b'"type":"message","role":"assistant"', b'"role":"assistant","type":"message"', 1
    ),
    "event after message_stop": _GOOD
    + b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn",'
    b'"stop_sequence":null},"usage":{"output_tokens":1}}\n\n',
    "error stream: two errors": _ERR.replace(
        b"event: message_stop", _frames(_ERR)[-2] + b"event: message_stop", 1
    ),
    "error stream: open block": _drop(_ERR, b"content_block_stop"),
    "error stream: no message_stop": _drop(_ERR, b"message_stop"),
}


def test_checker_accepts_good_streams_with_pings() -> None:
    ping = b'event: ping\ndata: {"type":"ping"}\n\n'
    frames = _frames(_GOOD)
    check_stream(ping + b"".join(f + ping for f in frames))
    check_stream(_ERR)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_checker_rejects(name: str) -> None:
    assert BROKEN[name] != _GOOD
    with pytest.raises(AssertionError):
        check_stream(BROKEN[name])


def test_feed_all_stops_at_the_end_of_the_message() -> None:
    """What follows [DONE] (or a failure) in the same read is dropped, never a transition
    out of a terminal state; a terminal translator takes nothing more."""
    chunk = b'{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}'
    t = _t()
    out = t.feed_all([chunk, b"[DONE]", chunk, b"[DONE]"])
    assert out.count(b"text_delta") == 1 and out.endswith(b'{"type":"message_stop"}\n\n')
    assert t.done and t.ended_by_done
    assert t.feed_all([chunk]) == b""
    t = _t()
    out = t.feed_all([chunk, b"{not json", chunk])
    assert t.state is State.ERRORED and out.count(b"text_delta") == 1
    assert not t.ended_by_done


# (inline_thinking, tools offered, deltas, streamed blocks (kind, text), normaliser kept)
_PARSED = [
    # reasoning in its field first: the engine's parser is on, content is text as sent
    (
        "auto",
        (),
        [{"reasoning_content": "r"}, {"content": "<think>x</think>y"}],
        [("thinking", "r"), ("text", "<think>x</think>y")],
        False,
    ),
    (
        "opened",
        (),
        [{"reasoning": "r"}, {"content": "x</think>y"}],
        [("thinking", "r"), ("text", "x</think>y")],
        False,
    ),
    # no reasoning field: inline <think> is still read
    ("auto", (), [{"content": "<think>x</think>y"}], [("thinking", "x"), ("text", "y")], True),
    # content held at its start before the reasoning field: still looked at
    (
        "auto",
        (),
        [{"content": "<thi"}, {"reasoning_content": "r"}, {"content": "nk>x"}],
        [("thinking", "r"), ("thinking", "x")],
        True,
    ),
    # tools offered: calls written as text are still looked for
    (
        "auto",
        ("get",),
        [{"reasoning_content": "r"}, {"content": "ok"}],
        [("thinking", "r"), ("text", "ok")],
        True,
    ),
]


@pytest.mark.parametrize(("mode", "tools", "deltas", "blocks", "kept"), _PARSED)
def test_reasoning_in_its_field_ends_the_look_for_inline_thinking(
    mode: str,
    tools: tuple[str, ...],
    deltas: list[dict[str, Any]],
    blocks: list[tuple[str, str]],
    kept: bool,
) -> None:
    """An engine that sends reasoning in its own field has its reasoning parser on: the
    content after it carries no inline ``<think>``, and with no tools offered the stream
    stops feeding the normaliser (per-chunk work for nothing)."""
    t = _t(normaliser=ContentNormaliser(thinking=mode, tool_names=tools))
    out = b"".join(t.feed(_chunk(d)) for d in deltas)
    assert (t._norm is not None) is kept  # (before the end, which lets go of it)
    out += t.feed(_chunk({}, "stop")) + t.feed(b"[DONE]")
    got: list[tuple[str, str]] = []
    for event in check_stream(out):
        if event["type"] == "content_block_delta" and "text" in event["delta"]:
            got.append(("text", event["delta"]["text"]))
        elif event["type"] == "content_block_delta" and "thinking" in event["delta"]:
            got.append(("thinking", event["delta"]["thinking"]))
    assert got == blocks
