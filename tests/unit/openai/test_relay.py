"""The pass-through's relay: bytes kept exactly, only ``model`` changes, in every dialect; an
in-band error is the one event written again, scrubbed."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import errors
from gateway.openai.inband import InbandErrors
from gateway.openai.relay import (
    CHAT_CHUNKS,
    COMPLETION_CHUNKS,
    RESPONSE_EVENTS,
    Dialect,
    ModelRewriter,
    Relay,
)
from gateway.ops.config import UpstreamConfig
from gateway.text.redact import Redactor
from gateway.text.sse import SSEEventTooLarge
from tests.fuzzing import EXAMPLES
from tests.stub_upstream import completions_script, responses_script

CASES = [
    # (upstream_model, payload, expected)
    (
        "org/m",
        b'{"id":"1","model":"org/m","choices":[]}',
        b'{"id":"1","model":"alias","choices":[]}',
    ),
    (
        "org/m",
        b'{"model":"org/m","x":"\\"model\\":\\"org/m\\""}',
        b'{"model":"alias","x":"\\"model\\":\\"org/m\\""}',
    ),  # text inside strings untouched
    ("org/m", b'{"id": "1", "model": "org/m"}', b'{"id":"1","model":"alias"}'),  # re-encoded
    ("org/m", b'{"id":"1"}', b'{"id":"1"}'),
    ("org/m", b"[DONE]", b"[DONE]"),
    ("org/m", b'{"model":"org/m"', b'{"model":"alias"'),  # not JSON, still the pair
]


@pytest.mark.parametrize("upstream_model,payload,expected", CASES)
def test_rewrite(upstream_model: str, payload: bytes, expected: bytes) -> None:
    assert ModelRewriter(upstream_model, "alias")(payload) == expected


def test_upstream_reporting_another_name_is_learned_once() -> None:
    rewrite = ModelRewriter("demo", "alias")
    first = b'{"model":"/models/tiny.gguf","choices":[{"delta":{"content":"a"}}]}'
    second = b'{"model":"/models/tiny.gguf","choices":[{"delta":{"content":"b"}}]}'
    assert rewrite(first) == first.replace(b"/models/tiny.gguf", b"alias")
    assert rewrite._needle == b'"model":"/models/tiny.gguf"'  # the fast path from now on
    assert rewrite(second) == second.replace(b"/models/tiny.gguf", b"alias")


@pytest.mark.parametrize(
    "payload,expected",
    [
        (b'{"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}', (12, 5)),
        (b'{"choices":[],"usage": {"prompt_tokens": 3, "completion_tokens": 0}}', (3, 0)),
        (b'{"usage":null}', None),
        (b'{"choices":[{"delta":{"content":"\\"prompt_tokens\\":9"}}]}', None),
        # a block of events: the last count, even with a usage-less event after it
        (
            b'data: {"usage":{"prompt_tokens":5,"completion_tokens":1}}\n\n'
            b'data: {"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
            b'data: {"choices":[],"usage":null}\n\n',
            (5, 2),
        ),
    ],
)
def test_usage_is_read_without_parsing(payload: bytes, expected: tuple[int, int] | None) -> None:
    assert CHAT_CHUNKS.usage(payload) == expected


# --- the stream relay: bytes in, bytes out, whatever the reads --------------------------


def _chunk(model: str, delta: dict | None = None, usage: dict | None = None) -> bytes:
    body: dict = {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": model,
        "choices": [] if delta is None else [{"index": 0, "delta": delta}],
    }
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def _stream(model: str, *, usage: bool = True, done: bool = True) -> bytes:
    parts = [
        _chunk(model, {"role": "assistant", "content": ""}),
        _chunk(model, {"reasoning_content": "think"}),
        _chunk(model, {"content": "Hi"}),
        _chunk(model, {"content": " there"}),
    ]
    if usage:
        parts.append(_chunk(model, usage={"prompt_tokens": 7, "completion_tokens": 3}))
    if done:
        parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def _feed(relay: Relay, data: bytes, cuts: list[int]) -> bytes:
    out, start = [], 0
    for cut in [*sorted(cuts), len(data)]:
        out.append(relay.feed(data[start:cut]))
        start = cut
    out.append(relay.end())
    return b"".join(out)


VLLM = _stream("org/m")
RELAYS = [
    # (name, upstream_model, upstream bytes, expected bytes, done, usage)
    (
        "vllm: byte-exact but model",
        "org/m",
        VLLM,
        VLLM.replace(b'"org/m"', b'"alias"'),
        True,
        (7, 3),
    ),
    (
        "no [DONE]: truncated",
        "org/m",
        _stream("org/m", done=False),
        _stream("alias", done=False),
        False,
        (7, 3),
    ),
    ("no usage", "org/m", _stream("org/m", usage=False), _stream("alias", usage=False), True, None),
    (
        "llama.cpp names its file: learned",
        "demo",
        _stream("/models/tiny.gguf"),
        _stream("alias"),
        True,
        (7, 3),
    ),
    (
        "CRLF framing: event by event",
        "org/m",
        VLLM.replace(b"\n", b"\r\n"),
        VLLM.replace(b'"org/m"', b'"alias"'),
        True,
        (7, 3),
    ),
    (
        "last event without its blank line",
        "org/m",
        VLLM[:-1],
        VLLM.replace(b'"org/m"', b'"alias"'),
        True,
        (7, 3),
    ),
    (
        "data:[DONE] without the space",
        "org/m",
        VLLM.replace(b"data: [DONE]", b"data:[DONE]"),
        VLLM.replace(b'"org/m"', b'"alias"').replace(b"data: [DONE]", b"data:[DONE]"),
        True,
        (7, 3),
    ),
]


@pytest.mark.parametrize(
    ("upstream_model", "raw", "expected", "done", "usage"),
    [r[1:] for r in RELAYS],
    ids=[r[0] for r in RELAYS],
)
def test_relay_at_every_single_cut(
    upstream_model: str, raw: bytes, expected: bytes, done: bool, usage: tuple[int, int] | None
) -> None:
    for cut in range(len(raw) + 1):
        relay = Relay(ModelRewriter(upstream_model, "alias"), CHAT_CHUNKS)
        out = _feed(relay, raw, [cut])
        if b"\r" in raw or b"tiny.gguf" in raw:
            # event by event from the first CR or the first unknown name: same events
            assert _payloads(out) == _payloads(expected), cut
        else:
            assert out == expected, cut
        assert relay.done is done and relay.usage == usage and relay.first_token, cut


def _payloads(raw: bytes) -> list[bytes]:
    return [line[5:].strip() for line in raw.split(b"\n") if line.startswith(b"data:")]


@given(st.lists(st.integers(0, len(VLLM)), max_size=12))
@settings(max_examples=EXAMPLES, deadline=None)
def test_relay_any_reads_give_the_same_bytes(cuts: list[int]) -> None:
    relay = Relay(ModelRewriter("org/m", "alias"), CHAT_CHUNKS)
    assert _feed(relay, VLLM, cuts) == VLLM.replace(b'"org/m"', b'"alias"')
    assert relay.done and relay.usage == (7, 3)


def test_relay_returns_to_blocks_once_the_reported_name_is_learned() -> None:
    relay = Relay(ModelRewriter("demo", "alias"), CHAT_CHUNKS)
    first, rest = _chunk("/models/tiny.gguf", {"content": "a"}), _stream("/models/tiny.gguf")
    assert _payloads(relay.feed(first)) == _payloads(_chunk("alias", {"content": "a"}))
    assert relay.feed(rest) == _stream("alias")  # byte-exact: the block path again


def test_relay_refuses_an_endless_event() -> None:
    relay = Relay(ModelRewriter("org/m", "alias"), CHAT_CHUNKS)
    relay.feed(b"data: " + b"x" * (4 * 1024 * 1024))
    with pytest.raises(SSEEventTooLarge):
        relay.feed(b"y" * (5 * 1024 * 1024))


def test_done_inside_generated_text_is_not_the_end() -> None:
    """A model writing 'data: [DONE]' is text inside a JSON string, never at a line start."""
    relay = Relay(ModelRewriter("org/m", "alias"), CHAT_CHUNKS)
    relay.feed(_chunk("org/m", {"content": "then data: [DONE]\nhappens"}))
    assert not relay.done
    relay.feed(b"data: [DONE]x\n\n")  # not the [DONE] line either
    assert not relay.done


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (_chunk("m", {"role": "assistant", "content": ""}), False),
        (_chunk("m", {"role": "assistant", "content": ""}) + _chunk("m", {"content": "Hi"}), True),
        (_chunk("m", {"reasoning_content": ""}) + _chunk("m", {"reasoning": "x"}), True),
        (_chunk("m", {"tool_calls": [{"index": 0, "id": "t"}]}), True),
        (_chunk("m", {"content": "", "note": '"content":"x'}), False),  # escaped inside a string
        (_chunk("m", usage={"prompt_tokens": 1}), False),
    ],
)
def test_first_token_is_a_non_empty_output_anywhere_in_the_block(
    payload: bytes, expected: bool
) -> None:
    assert CHAT_CHUNKS.has_token(payload) is expected


# --- the other dialects: completions chunks and Responses events ----------------------------

RESPONSES_VLLM = b"".join(responses_script("org/m", {})[0])


def _llama_responses(model: str) -> bytes:
    """llama.cpp's shape: ``response.created`` names no model, ``response.completed`` names
    the model its own way; keys sorted (nlohmann's JSON), no ``[DONE]``."""
    events = [
        (
            "response.created",
            {
                "response": {"id": "resp_1", "object": "response", "status": "in_progress"},
                "type": "response.created",
            },
        ),
        (
            "response.output_text.delta",
            {"delta": "Hi", "item_id": "msg_1", "type": "response.output_text.delta"},
        ),
        (
            "response.completed",
            {
                "response": {
                    "id": "resp_1",
                    "model": model,
                    "object": "response",
                    "status": "completed",
                    "usage": {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10},
                },
                "type": "response.completed",
            },
        ),
    ]
    return b"".join(
        b"event: "
        + name.encode()
        + b"\ndata: "
        + json.dumps(data, separators=(",", ":")).encode()
        + b"\n\n"
        for name, data in events
    )


RESPONSE_RELAYS = [
    # (name, upstream_model, upstream bytes, expected bytes, done, usage)
    (
        "vllm: named events byte-exact, response.model replaced",
        "org/m",
        RESPONSES_VLLM,
        RESPONSES_VLLM.replace(b'"model":"org/m"', b'"model":"alias"'),
        True,
        (12, 5),
    ),
    (
        "no response.completed: truncated",
        "org/m",
        RESPONSES_VLLM[: RESPONSES_VLLM.rfind(b"event: response.completed")],
        RESPONSES_VLLM[: RESPONSES_VLLM.rfind(b"event: response.completed")].replace(
            b'"model":"org/m"', b'"model":"alias"'
        ),
        False,
        None,
    ),
    (
        "llama.cpp names its file in response.completed: learned, names kept",
        "demo",
        _llama_responses("/models/tiny.gguf"),
        _llama_responses("alias"),
        True,
        (7, 3),
    ),
]


@pytest.mark.parametrize(
    ("upstream_model", "raw", "expected", "done", "usage"),
    [r[1:] for r in RESPONSE_RELAYS],
    ids=[r[0] for r in RESPONSE_RELAYS],
)
def test_responses_relay_at_every_single_cut(
    upstream_model: str, raw: bytes, expected: bytes, done: bool, usage: tuple[int, int] | None
) -> None:
    """Byte-exact, event lines included, also where the relay goes event by event."""
    for cut in range(len(raw) + 1):
        relay = Relay(ModelRewriter(upstream_model, "alias"), RESPONSE_EVENTS)
        assert _feed(relay, raw, [cut]) == expected, cut
        assert relay.done is done and relay.usage == usage and relay.first_token, cut


def test_responses_relay_framed_with_crlf_keeps_event_names() -> None:
    relay = Relay(ModelRewriter("org/m", "alias"), RESPONSE_EVENTS)
    out = _feed(relay, RESPONSES_VLLM.replace(b"\n", b"\r\n"), [100, 700])
    assert out == RESPONSES_VLLM.replace(b'"model":"org/m"', b'"model":"alias"')
    assert relay.done and relay.usage == (12, 5)


def test_a_responses_event_with_another_spelling_is_re_encoded_inside_response() -> None:
    rewrite = ModelRewriter("org/m", "alias")
    payload = b'{"type": "response.completed", "response": {"id": "r", "model": "org/m"}}'
    assert json.loads(rewrite(payload)) == {
        "type": "response.completed",
        "response": {"id": "r", "model": "alias"},
    }


def test_response_completed_inside_generated_text_is_not_the_end() -> None:
    relay = Relay(ModelRewriter("org/m", "alias"), RESPONSE_EVENTS)
    delta = json.dumps(
        {"delta": 'say "response.completed"', "type": "response.output_text.delta"},
        separators=(",", ":"),
    ).encode()
    relay.feed(b"event: response.output_text.delta\ndata: " + delta + b"\n\n")
    assert relay.first_token and not relay.done


COMPLETIONS = b"".join(completions_script("org/m", {"stream_options": {"include_usage": True}})[0])


def test_completions_relay() -> None:
    relay = Relay(ModelRewriter("org/m", "alias"), COMPLETION_CHUNKS)
    assert _feed(relay, COMPLETIONS, [50]) == COMPLETIONS.replace(b'"org/m"', b'"alias"')
    assert relay.done and relay.usage == (12, 5) and relay.first_token


@pytest.mark.parametrize(
    ("dialect", "payload", "expected"),
    [
        (COMPLETION_CHUNKS, b'data: {"choices":[{"index":0,"text":""}]}\n\n', False),
        (COMPLETION_CHUNKS, b'data: {"choices":[{"index":0,"text":"Hi"}]}\n\n', True),
        (
            RESPONSE_EVENTS,
            b'data: {"part":{"text":""},"type":"response.content_part.added"}\n\n',
            False,
        ),
        (RESPONSE_EVENTS, b'data: {"delta":"","type":"response.output_text.delta"}\n\n', False),
        (
            RESPONSE_EVENTS,
            b'data: {"delta":"{","type":"response.function_call_arguments.delta"}\n\n',
            True,
        ),
    ],
)
def test_first_token_per_dialect(dialect: Dialect, payload: bytes, expected: bool) -> None:
    assert dialect.has_token(payload) is expected


# --- in-band errors: scrubbed as on every route, every other byte kept -----------------------

KEY = "sk-up/Key+9"
SECRETS = Redactor.of(
    [
        UpstreamConfig("up", "http://gpu-7.internal:8000/v1", api_key=KEY),
        UpstreamConfig("other", "http://10.0.0.2/v1", api_key="sk-other-upstream"),
    ]
)
LEAK = (
    f"bad key {KEY} (Bearer {KEY}, key={quote(KEY, safe='')}, sk-other-upstream) at "
    "gpu-node-7.internal.example:8000 via fd00::17"
)
SCRUBBED = (
    "bad key [redacted] ([redacted], key=[redacted], [redacted]) at [redacted] via [redacted]"
)


def _data(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _error_chunk(code: int | None, **extra: object) -> bytes:
    error: dict = {"message": LEAK, "type": "BadRequestError", **extra}
    if code is not None:
        error["code"] = code
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"  # vLLM: spaced JSON


def _openai_error(message: str, etype: str, code: int) -> bytes:
    return _data({"error": {"message": message, "type": etype, "param": None, "code": code}})


_HEAD = _chunk("org/m", {"role": "assistant", "content": ""}) + _chunk("org/m", {"content": "Hi"})
_HEAD_OUT = _HEAD.replace(b'"org/m"', b'"alias"')
_SGLANG = _data(
    {"object": "error", "message": LEAK, "type": "BadRequestError", "param": None, "code": 429}
)
INBAND_RELAYS = [
    # (name, dialect, upstream bytes, expected bytes)
    (
        "chat 4xx: scrubbed message",
        CHAT_CHUNKS,
        _HEAD + _error_chunk(400) + b"data: [DONE]\n\n",
        _HEAD_OUT + _openai_error(SCRUBBED, "invalid_request_error", 400) + b"data: [DONE]\n\n",
    ),
    (
        "chat 5xx: replaced whole",
        CHAT_CHUNKS,
        _HEAD + _error_chunk(500),
        _HEAD_OUT + _openai_error("Internal server error", "server_error", 500),
    ),
    (
        "chat, no code: counts as 5xx",
        CHAT_CHUNKS,
        _HEAD + _error_chunk(None),
        _HEAD_OUT + _openai_error("Internal server error", "server_error", 500),
    ),
    (
        "chat 503: overloaded",
        CHAT_CHUNKS,
        _HEAD + _error_chunk(503),
        _HEAD_OUT + _openai_error("Overloaded", "server_error", 503),
    ),
    (
        "sglang's bare error object",
        CHAT_CHUNKS,
        _HEAD + _SGLANG + b"data: [DONE]\n\n",
        _HEAD_OUT + _openai_error(SCRUBBED, "rate_limit_exceeded", 429) + b"data: [DONE]\n\n",
    ),
    (
        "completions 4xx",
        COMPLETION_CHUNKS,
        COMPLETIONS[: COMPLETIONS.index(b"\n\n") + 2] + _error_chunk(400),
        COMPLETIONS[: COMPLETIONS.index(b"\n\n") + 2].replace(b'"org/m"', b'"alias"')
        + _openai_error(SCRUBBED, "invalid_request_error", 400),
    ),
    # disguised from a grep for the bytes "error" (issue 25): found by decoding the event
    (
        "an escaped key: \\u0065rror",
        CHAT_CHUNKS,
        _HEAD + _error_chunk(400).replace(b'"error"', b'"\\u0065rror"'),
        _HEAD_OUT + _openai_error(SCRUBBED, "invalid_request_error", 400),
    ),
    (
        "non-JSON data in an error event: a 5xx",
        CHAT_CHUNKS,
        _HEAD + b"event: error\ndata: " + LEAK.encode() + b"\n\n",
        _HEAD_OUT + _openai_error("Internal server error", "server_error", 500),
    ),
    (
        "non-JSON data in an unnamed event: a 5xx",
        COMPLETION_CHUNKS,
        _HEAD + b"data: " + LEAK.encode() + b"\n\n",
        _HEAD_OUT + _openai_error("Internal server error", "server_error", 500),
    ),
    (
        "an Anthropic-shaped type error on a chat stream",
        CHAT_CHUNKS,
        _HEAD + _data({"type": "error", "message": LEAK, "code": 400}),
        _HEAD_OUT + _openai_error(SCRUBBED, "invalid_request_error", 400),
    ),
    (
        "a key in an event that is no error: redacted",
        CHAT_CHUNKS,
        _HEAD + _chunk("org/m", {"content": f"the key is {KEY}"}),
        _HEAD_OUT + _chunk("alias", {"content": "the key is [redacted]"}),
    ),
    (
        "the word error in generated text: kept",
        CHAT_CHUNKS,
        _HEAD + _chunk("org/m", {"content": 'an "error": {"code":400}'}),
        _HEAD_OUT + _chunk("alias", {"content": 'an "error": {"code":400}'}),
    ),
]


@pytest.mark.parametrize(
    ("dialect", "raw", "expected"),
    [r[1:] for r in INBAND_RELAYS],
    ids=[r[0] for r in INBAND_RELAYS],
)
def test_inband_error_scrubbed_at_every_single_cut(
    dialect: Dialect, raw: bytes, expected: bytes
) -> None:
    """An error event is written again, scrubbed (5xx replaced whole, 4xx scrubbed, as the
    Anthropic route does); every other event keeps its bytes, wherever the reads split."""
    for cut in range(len(raw) + 1):
        relay = Relay(
            ModelRewriter("org/m", "alias"), dialect, hosts=("gpu-7.internal",), secrets=SECRETS
        )
        out = _feed(relay, raw, [cut])
        assert out == expected, cut
        assert KEY.encode() not in out and b"fd00" not in out and b"gpu-node" not in out, cut


def test_inband_error_scrubbed_event_by_event() -> None:
    """CRLF framing (the decoder's path): the same events, the error scrubbed."""
    raw = _HEAD + _error_chunk(400) + b"data: [DONE]\n\n"
    expected = (
        _HEAD_OUT + _openai_error(SCRUBBED, "invalid_request_error", 400) + (b"data: [DONE]\n\n")
    )
    for cut in range(0, len(raw) + 1, 7):
        relay = Relay(ModelRewriter("org/m", "alias"), CHAT_CHUNKS, secrets=SECRETS)
        out = _feed(relay, raw.replace(b"\n", b"\r\n"), [cut])
        assert out == expected, cut
        assert relay.done


def _event(name: str, data: dict) -> bytes:
    return (
        b"event: "
        + name.encode()
        + b"\ndata: "
        + json.dumps(data, separators=(",", ":")).encode()
        + b"\n\n"
    )


_FAILED = {
    "id": "resp_1",
    "model": "org/m",
    "object": "response",
    "status": "failed",
    "error": {"code": "server_error", "message": LEAK},
    "output": [],
}
_CREATED = {
    "id": "resp_1",
    "model": "org/m",
    "object": "response",
    "status": "in_progress",
    "error": None,
    "output": [],
}  # "error":null: looked at, kept byte for byte
RESPONSES_FAILING = (
    _event(
        "response.created", {"response": _CREATED, "sequence_number": 0, "type": "response.created"}
    )
    + _event(
        "response.output_text.delta",
        {"delta": "Hi", "sequence_number": 1, "type": "response.output_text.delta"},
    )
    + _event(
        "error",
        {"type": "error", "code": "400", "message": LEAK, "param": None, "sequence_number": 2},
    )
    + _event(
        "response.failed", {"response": _FAILED, "sequence_number": 3, "type": "response.failed"}
    )
)
RESPONSES_SCRUBBED = (
    RESPONSES_FAILING[: RESPONSES_FAILING.index(b"event: error")].replace(
        b'"model":"org/m"', b'"model":"alias"'
    )
    + b'event: error\ndata: {"type":"error","code":"invalid_request_error","message":"'
    + SCRUBBED.encode()
    + b'","param":null,"error":{"message":"'
    + SCRUBBED.encode()
    + b'","type":"invalid_request_error","param":null,"code":400},"sequence_number":2}\n\n'
    + _event(
        "response.failed",
        {
            "response": {
                **_FAILED,
                "model": "alias",
                "error": {"code": "server_error", "message": "Internal server error"},
            },
            "sequence_number": 3,
            "type": "response.failed",
        },
    )
)


def test_responses_inband_errors_scrubbed_at_every_single_cut() -> None:
    """A Responses stream keeps its shape: the ``error`` event is written again (its
    ``sequence_number`` kept), ``response.failed`` loses only its error's words."""
    for cut in range(len(RESPONSES_FAILING) + 1):
        relay = Relay(ModelRewriter("org/m", "alias"), RESPONSE_EVENTS, secrets=SECRETS)
        out = _feed(relay, RESPONSES_FAILING, [cut])
        assert out == RESPONSES_SCRUBBED, cut
        assert relay.done and KEY.encode() not in out and b"fd00" not in out, cut


@pytest.mark.parametrize(
    ("responses", "body", "expected"),
    [
        (False, b'{"id":"c","choices":[]}', b'{"id":"c","choices":[]}'),
        (True, json.dumps(_CREATED).encode(), json.dumps(_CREATED).encode()),  # error null: as is
        (
            True,
            json.dumps(_FAILED).encode(),
            json.dumps(
                {**_FAILED, "error": {"code": "server_error", "message": "Internal server error"}},
                separators=(",", ":"),
            ).encode(),
        ),
    ],
)
def test_buffered_reply_without_an_error_body(
    responses: bool, body: bytes, expected: bytes
) -> None:
    assert InbandErrors(responses=responses, secrets=SECRETS).body(body) == expected


@pytest.mark.parametrize("responses", [False, True])
@pytest.mark.parametrize(
    "body",
    [
        json.dumps({"error": {"message": LEAK, "code": 500}})
        .encode()
        .replace(b'"error"', b'"\\u0065rror"'),
        json.dumps({"type": "error", "message": LEAK}).encode(),
        LEAK.encode(),
        b'{"id":"c","choices":[{"message":{"content":"cut' + b"}",  # framed as an object, broken
    ],
)
def test_buffered_disguised_error_raises_a_5xx(responses: bool, body: bytes) -> None:
    """A 200 body that hides its error from a grep for ``"error"``, or is no JSON at all."""
    inband = InbandErrors(responses=responses, hosts=("gpu-7.internal",), secrets=SECRETS)
    with pytest.raises(errors.UpstreamError) as info:
        inband.body(body)
    assert (info.value.status, info.value.message) == (500, "Internal server error")


@pytest.mark.parametrize("responses", [False, True])
def test_buffered_error_body_raises_scrubbed(responses: bool) -> None:
    inband = InbandErrors(responses=responses, hosts=("gpu-7.internal",), secrets=SECRETS)
    with pytest.raises(errors.UpstreamError) as info:
        inband.body(json.dumps({"error": {"message": LEAK, "code": 400}}).encode())
    assert (info.value.status, info.value.message) == (400, SCRUBBED)


# An in-band error that holds a number JSON cannot (NaN, an infinity: ujson reads them,
# and writing them again raised OverflowError, a traceback instead of an error)
_NAN_ERRORS = [
    b'{"error":{"message":"NaN in the logits","code":NaN}}',
    b'{"error":{"message":"bad","code":400,"param":Infinity}}',
    b'{"object":"error","message":"bad","code":NaN,"x":[1e400]}',
]


@pytest.mark.parametrize("responses", [False, True])
@pytest.mark.parametrize("payload", _NAN_ERRORS)
def test_an_inband_error_holding_nan_is_an_error_not_a_crash(
    responses: bool, payload: bytes
) -> None:
    inband = InbandErrors(responses=responses, secrets=SECRETS)
    frame = inband.event(b"", payload)
    assert frame is not None
    body = json.loads(frame.split(b"data: ", 1)[1])  # well-formed JSON, no NaN
    assert "NaN" not in json.dumps(body) and "Infinity" not in json.dumps(body)
    with pytest.raises(errors.UpstreamError) as info:
        inband.body(payload)
    assert info.value.status in (400, 500)


def test_a_failed_response_holding_nan_keeps_its_shape() -> None:
    failed = json.dumps({**_FAILED, "temperature": float("nan")}).encode()
    out = json.loads(InbandErrors(responses=True, secrets=SECRETS).body(failed))
    assert out["temperature"] is None and out["error"]["code"] == "server_error"
    event = InbandErrors(responses=True, secrets=SECRETS).event(
        b"response.failed",
        json.dumps(
            {
                "type": "response.failed",
                "sequence_number": 3,
                "response": {**_FAILED, "temperature": float("inf")},
            }
        ).encode(),
    )
    assert event is not None and b"Infinity" not in event and b'"temperature":null' in event
