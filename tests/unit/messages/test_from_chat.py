"""Buffered replies: OpenAI chat completion -> Anthropic Message.

Every directory under tests/golden/responses/ is one rule of issue 4: the
upstream's reply (``openai.json``, in the shape vLLM, SGLang, llama.cpp or
Ollama send), the client's request facts (``request.json``: the model name it
sent, its ``stop_sequences`` and ``thinking``) and the exact Message the client must get
(``anthropic.json``; key order included). A bug fix adds a case directory.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from gateway import errors
from gateway.messages.from_chat import signatures, tables
from gateway.messages.from_chat.aggregate import aggregate
from gateway.messages.from_chat.message import from_chat
from gateway.messages.stream.translator import StreamTranslator
from gateway.text import jsonutil

CASES = Path(__file__).resolve().parents[2] / "golden" / "responses"
KEY = b"test-key"
MESSAGE_ID = "msg_01GoldenResponse0000000A"

# Field names of OpenAI's chat completion that Anthropic's Message never uses.
OPENAI_FIELDS = frozenset(
    {
        "choices", "finish_reason", "object", "created", "prompt_tokens",
        "completion_tokens", "total_tokens", "prompt_tokens_details", "logprobs",
        "system_fingerprint", "message", "index", "tool_calls", "function",
        "arguments", "reasoning_content", "reasoning", "refusal", "matched_stop",
        "timings", "service_tier", "prompt_logprobs", "kv_transfer_params", "annotations",
        "audio", "function_call", "token_ids", "prompt_token_ids",
    }
)  # fmt: skip


def _case_dirs() -> list[Path]:
    return sorted(p for p in CASES.iterdir() if (p / "openai.json").is_file())


def _load(path: Path) -> Any:
    return jsonutil.loads(path.read_bytes())


def _run(case: Path, **kwargs: Any) -> dict[str, Any]:
    request_file = case / "request.json"
    request = _load(request_file) if request_file.is_file() else {}
    return from_chat(
        _load(case / "openai.json"),
        model=request.get("model", "claude-test"),
        stop_sequences=request.get("stop_sequences", ()),
        signing_key=KEY,
        message_id=MESSAGE_ID,
        hide_thinking=tables.hides_thinking(request),
        show_thinking=tables.shows_thinking(request),
        **kwargs,
    )


def _keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _keys(item)
    elif isinstance(value, list):
        for item in value:
            yield from _keys(item)


def test_there_is_a_case_per_rule() -> None:
    assert len(_case_dirs()) >= 20


@pytest.mark.parametrize("case", _case_dirs(), ids=lambda p: p.name)
def test_golden_response(case: Path) -> None:
    produced = _run(case)
    expected = _load(case / "anthropic.json")
    # Encoded, so that key order counts too (id, type, role, model, content, ...).
    assert jsonutil.dumps(produced) == jsonutil.dumps(expected)


@pytest.mark.parametrize("case", _case_dirs(), ids=lambda p: p.name)
def test_no_openai_field_name_anywhere(case: Path) -> None:
    produced = _run(case)
    assert not set(_keys(produced)) & OPENAI_FIELDS
    body = jsonutil.dumps(produced)
    for name in OPENAI_FIELDS:
        assert f'"{name}":' not in body, name


@pytest.mark.parametrize("case", _case_dirs(), ids=lambda p: p.name)
def test_strict_sdk_validation_accepts_it(case: Path) -> None:
    """The Python SDK's strict mode: every required field present and typed."""
    produced = _run(case)
    message = anthropic.types.Message.model_validate(produced, strict=True)
    assert message.stop_reason is not None
    assert list(produced["usage"]) in (
        ["input_tokens", "output_tokens"],
        ["input_tokens", "cache_read_input_tokens", "output_tokens"],
    )
    assert produced["content"], "never an empty content array"


def _completion(message: dict[str, Any], finish: Any = "stop", **choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "upstream/internal-name",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
            | choice
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def test_thinking_signature_seals_the_text_under_the_key() -> None:
    reasoning = "Think first."
    out = from_chat(
        _completion({"content": "ok", "reasoning_content": reasoning}),
        model="m",
        signing_key=b"another-key",
    )
    block = out["content"][0]
    assert (block["type"], block["thinking"]) == ("thinking", reasoning)
    assert signatures.open_signature(b"another-key", block["signature"]) == reasoning
    assert signatures.open_signature(KEY, block["signature"]) is None


def test_hidden_thinking_still_carries_the_reasoning_in_its_signature() -> None:
    out = from_chat(
        _completion({"content": "ok", "reasoning_content": "Secret plan."}),
        model="m",
        signing_key=KEY,
        hide_thinking=True,
    )
    block = out["content"][0]
    assert block["thinking"] == ""
    assert signatures.open_signature(KEY, block["signature"]) == "Secret plan."


def test_reasoning_content_wins_when_both_fields_are_sent() -> None:
    out = from_chat(
        _completion({"content": "ok", "reasoning_content": "a", "reasoning": "a"}),
        model="m",
        signing_key=KEY,
    )
    assert [b["type"] for b in out["content"]] == ["thinking", "text"]
    assert out["content"][0]["thinking"] == "a"


def test_message_id_is_generated_when_not_injected() -> None:
    out = from_chat(_completion({"content": "ok"}), model="m", signing_key=KEY)
    assert re.fullmatch(r"msg_[0-9A-Za-z]{24}", out["id"])


def test_model_is_the_clients_name_not_the_upstreams() -> None:
    out = from_chat(_completion({"content": "ok"}), model="reasoning", signing_key=KEY)
    assert out["model"] == "reasoning"


@pytest.mark.parametrize("upstream_id", [None, "", "call 1", "id/with/slash", "x" * 129, 7])
def test_unsafe_tool_call_ids_are_replaced(upstream_id: Any) -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    if upstream_id is not None:
        call["id"] = upstream_id
    out = from_chat(
        _completion({"content": None, "tool_calls": [call]}, "tool_calls"),
        model="m",
        signing_key=KEY,
    )
    assert re.fullmatch(r"toolu_[0-9A-Za-z]{24}", out["content"][0]["id"])


def test_repeated_tool_call_ids_are_made_unique() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    out = from_chat(
        _completion({"content": None, "tool_calls": [call, call]}, "tool_calls"),
        model="m",
        signing_key=KEY,
    )
    ids = [block["id"] for block in out["content"]]
    assert ids[0] == "call_1"
    assert len(set(ids)) == 2


@pytest.mark.parametrize(
    ("arguments", "expected", "bad", "repaired"),
    [
        ('{"a": 1}', {"a": 1}, 0, 0),
        ("", {}, 0, 0),
        ("{}", {}, 0, 0),
        ({"a": 1}, {"a": 1}, 0, 0),  # a server that sends the object itself
        ('{"a": ', {}, 0, 1),  # cut by max_tokens: the key without a value goes
        ('{"a": 1, "b": "x', {"a": 1, "b": "x"}, 0, 1),
        ("{'a': True, 'b': None,}", {"a": True, "b": None}, 0, 1),  # Python literals
        ('```json\n{"a": 1}\n```', {"a": 1}, 0, 1),  # a fenced block
        ("[1, 2]", {}, 1, 0),  # not an object
        ([1, 2], {}, 1, 0),  # nor as the object itself
        ('"just text"', {}, 1, 0),
        ("NaN", {}, 1, 0),
    ],
)
def test_tool_arguments(arguments: Any, expected: dict[str, Any], bad: int, repaired: int) -> None:
    count = []
    fixed: list[int] = []
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    out = from_chat(
        _completion({"content": None, "tool_calls": [call]}, "tool_calls"),
        model="m",
        signing_key=KEY,
        on_bad_tool_args=lambda: count.append(1),
        on_repaired=lambda: fixed.append(1),
    )
    assert out["content"] == [{"type": "tool_use", "id": "call_1", "name": "f", "input": expected}]
    assert (len(count), len(fixed)) == (bad, repaired)


def test_arguments_cut_by_max_tokens_are_repaired_once() -> None:
    bad: list[int] = []
    fixed: list[int] = []
    _run(
        CASES / "tool-args-cut-by-max-tokens",
        on_bad_tool_args=lambda: bad.append(1),
        on_repaired=lambda: fixed.append(1),
    )
    assert (bad, fixed) == ([], [1])


@pytest.mark.parametrize(
    ("message", "finish", "stop_reason"),
    [
        ({"content": "ok"}, None, "end_turn"),  # a finished reply never has a null stop_reason
        ({"content": "ok"}, "eos", "end_turn"),
        ({"content": "ok"}, "some_new_reason", "end_turn"),
        (
            {"tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
            None,
            "tool_use",
        ),
        ({"function_call": {"name": "f", "arguments": "{}"}}, "function_call", "tool_use"),
    ],
)
def test_stop_reason_edges(message: dict[str, Any], finish: Any, stop_reason: str) -> None:
    out = from_chat(_completion(message, finish), model="m", signing_key=KEY)
    assert out["stop_reason"] == stop_reason
    assert out["stop_sequence"] is None


def test_stop_sequence_reported_only_when_requested() -> None:
    completion = _completion({"content": "a"}, "stop", stop_reason="END")
    asked = from_chat(completion, model="m", signing_key=KEY, stop_sequences=["END"])
    assert (asked["stop_reason"], asked["stop_sequence"]) == ("stop_sequence", "END")
    not_asked = from_chat(completion, model="m", signing_key=KEY)
    assert (not_asked["stop_reason"], not_asked["stop_sequence"]) == ("end_turn", None)


def test_content_parts_and_refusal_become_text() -> None:
    parts = _completion({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
    assert from_chat(parts, model="m", signing_key=KEY)["content"] == [
        {"type": "text", "text": "ab"}
    ]
    refusal = _completion({"content": None, "refusal": "I can't."})
    assert from_chat(refusal, model="m", signing_key=KEY)["content"] == [
        {"type": "text", "text": "I can't."}
    ]


@pytest.mark.parametrize(
    ("payload", "status", "error_type", "message"),
    [
        (
            {"error": {"message": "messages: field required", "type": "BadRequestError",
                       "code": 400}},
            400, "invalid_request_error", "messages: field required",
        ),
        (
            {"object": "error", "type": "BadRequestError", "code": 400, "param": None,
             "message": "The input (5000 tokens) is longer than the model's context length "
                        "(4096 tokens)."},
            400, "invalid_request_error", "prompt is too long: 5000 tokens > 4096 maximum",
        ),
        ({"error": {"message": "CUDA out of memory at /opt/x.py"}}, 500, "api_error",
         "Internal server error"),
        ({"error": "boom"}, 500, "api_error", "Internal server error"),
    ],
)  # fmt: skip
def test_inband_error_object_raises(
    payload: dict[str, Any], status: int, error_type: str, message: str
) -> None:
    with pytest.raises(errors.UpstreamError) as caught:
        from_chat(payload, model="m", signing_key=KEY)
    err = caught.value
    assert (err.status, err.error_type, err.message) == (status, error_type, message)


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"choices": []},
        {"choices": None},
        {"choices": ["x"]},
        {"choices": [{"index": 0, "finish_reason": "stop"}]},  # no message
        {"choices": [{"message": "text"}]},
        ["not", "an", "object"],
        "text",
    ],
)
def test_not_a_completion_is_a_500(payload: Any) -> None:
    with pytest.raises(errors.StreamProcessingError) as caught:
        from_chat(payload, model="m", signing_key=KEY)
    assert caught.value.status == 500
    assert caught.value.error_type == "api_error"


# --- usage: THE table (tables.usage_from_chat), the same for buffered and streamed -------

_CACHED = {
    "prompt_tokens": 12,
    "completion_tokens": 5,
    "total_tokens": 17,
    "prompt_tokens_details": {"cached_tokens": 8},
}
USAGE_SHAPES: list[tuple[str, Any, Any, dict[str, int]]] = [
    ("none", None, None, {"input_tokens": 0, "output_tokens": 0}),
    (
        "vllm-plain",
        {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
        None,
        {"input_tokens": 12, "output_tokens": 5},
    ),
    (
        "vllm-details-null",
        {"prompt_tokens": 12, "completion_tokens": 5, "prompt_tokens_details": None},
        None,
        {"input_tokens": 12, "output_tokens": 5},
    ),
    (
        "vllm-sglang-cached",
        _CACHED,
        None,
        {"input_tokens": 4, "cache_read_input_tokens": 8, "output_tokens": 5},
    ),
    (
        "llamacpp-cached-zero",
        {
            "prompt_tokens": 12,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
        {"cache_n": 0, "prompt_n": 12},
        {"input_tokens": 12, "cache_read_input_tokens": 0, "output_tokens": 5},
    ),
    (
        "llamacpp-timings-cache-n-only",
        {"prompt_tokens": 12, "completion_tokens": 5},
        {"cache_n": 10, "prompt_n": 2},
        {"input_tokens": 2, "cache_read_input_tokens": 10, "output_tokens": 5},
    ),
    (
        "details-win-over-timings",
        _CACHED,
        {"cache_n": 3},
        {"input_tokens": 4, "cache_read_input_tokens": 8, "output_tokens": 5},
    ),
    (
        "cached-above-prompt-clamped",
        {"prompt_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 9}},
        None,
        {"input_tokens": 0, "cache_read_input_tokens": 3, "output_tokens": 1},
    ),
    (
        "cached-not-a-count",
        {
            "prompt_tokens": 12,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": True},
        },
        {"cache_n": -1},
        {"input_tokens": 12, "output_tokens": 5},
    ),
    (
        "ollama",
        {"prompt_tokens": 26, "completion_tokens": 9, "total_tokens": 35},
        None,
        {"input_tokens": 26, "output_tokens": 9},
    ),
]


@pytest.mark.parametrize(
    ("usage", "timings", "expected"),
    [r[1:] for r in USAGE_SHAPES],
    ids=[r[0] for r in USAGE_SHAPES],
)
def test_usage_shapes(usage: Any, timings: Any, expected: dict[str, int]) -> None:
    assert tables.anthropic_usage(tables.usage_from_chat(usage, timings)) == expected
    completion = _completion({"content": "ok"})
    completion["usage"] = usage
    if timings is not None:
        completion["timings"] = timings
    buffered = from_chat(completion, model="m", signing_key=KEY)["usage"]
    assert jsonutil.dumps(buffered) == jsonutil.dumps(expected)  # key order too
    # the same upstream output streamed: the final message the SDKs fold is the same
    translator = StreamTranslator(model="m", message_id="msg_1", signing_key=KEY, input_tokens=99)
    last: dict[str, Any] = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    if usage is not None:
        last["usage"] = usage
    if timings is not None:
        last["timings"] = timings
    raw = translator.feed(
        jsonutil.dumpb(
            {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]}
        )
    )
    raw += translator.feed(jsonutil.dumpb(last)) + translator.feed(b"[DONE]")
    streamed = aggregate(raw)["usage"]
    if usage is None:  # nothing reported: the estimate stays, chunks count the output
        assert streamed == {"input_tokens": 99, "output_tokens": 1}
    else:
        assert jsonutil.dumps(streamed) == jsonutil.dumps(expected)
