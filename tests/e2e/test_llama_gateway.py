"""Real clients through the real gateway process to a real llama.cpp server.

The upstream serves the generated tiny model, whose replies are known exactly
(tests/fixtures_llama.py), so these tests assert exact text and token counts.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import anthropic
import pytest

from tests import sdk
from tests.anthropic_stream_check import check_stream
from tests.procs import post

pytestmark = [pytest.mark.e2e, pytest.mark.llamacpp]

OPENAI_NAMES = (
    "choices",
    "finish_reason",
    "object",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "reasoning_content",
    "tool_calls",
    "chat.completion",
    "created",
    "system_fingerprint",
    "timings",
)


def _post(url: str, body: dict[str, Any], timeout: float = 60) -> tuple[int, bytes]:
    status, _, raw = post(url, body, {"anthropic-version": "2023-06-01"}, timeout)
    return status, raw


def _client(base: str, **kw: Any) -> anthropic.Anthropic:
    return sdk.client(
        base, api_key="test-key", max_retries=0, _strict_response_validation=True, **kw
    )


HI = [{"role": "user", "content": "hi"}]
ADAPTIVE: Any = {"type": "adaptive"}  # thinking only when asked: these replies reason


def test_buffered_reasoning_reply_is_thinking_then_text(llama_gateway, tiny_model) -> None:
    _, base = llama_gateway
    _, expect = tiny_model
    status, raw = _post(
        base + "/v1/messages",
        {"model": "demo", "max_tokens": 200, "messages": HI, "thinking": ADAPTIVE},
    )
    assert status == 200
    body = json.loads(raw)
    assert [b["type"] for b in body["content"]] == ["thinking", "text"]
    assert body["content"][0]["thinking"] == expect["reasoning"]
    assert isinstance(body["content"][0]["signature"], str) and body["content"][0]["signature"]
    assert body["content"][1]["text"] == expect["answer"]
    assert body["stop_reason"] == "end_turn" and body["stop_sequence"] is None
    assert body["model"] == "demo"
    assert body["usage"]["output_tokens"] == expect["completion_tokens_thinking"]
    text = raw.decode()
    for name in OPENAI_NAMES:
        assert f'"{name}"' not in text, name


def test_max_tokens_cap_gives_max_tokens_and_exact_usage_keys(llama_gateway) -> None:
    _, base = llama_gateway
    status, raw = _post(base + "/v1/messages", {"model": "demo", "max_tokens": 4, "messages": HI})
    assert status == 200
    body = json.loads(raw)
    assert body["stop_reason"] == "max_tokens"
    # llama-server reports prompt_tokens_details.cached_tokens: the API's cache field
    assert list(body["usage"]) == ["input_tokens", "cache_read_input_tokens", "output_tokens"]
    assert body["usage"]["output_tokens"] == 4


def test_thinking_disabled_gives_text_only(llama_gateway, tiny_model) -> None:
    _, base = llama_gateway
    msg = _client(base).messages.create(
        model="demo", max_tokens=200, messages=HI, thinking={"type": "disabled"}
    )
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == tiny_model[1]["answer"]
    assert msg.usage.output_tokens == tiny_model[1]["completion_tokens_nothink"]


def test_python_sdk_strict_create_stream_count_models(llama_gateway, tiny_model) -> None:
    _, base = llama_gateway
    _, expect = tiny_model
    client = _client(base)
    created = client.messages.create(model="demo", max_tokens=200, messages=HI, thinking=ADAPTIVE)
    # Strict validation cannot take a stream's thinking block start: by the gateway's
    # protocol decision it carries no `signature` key (sent later as a signature_delta).
    lenient = sdk.client(base, api_key="test-key", max_retries=0)
    with lenient.messages.stream(
        model="demo", max_tokens=200, messages=HI, thinking=ADAPTIVE
    ) as stream:
        final = stream.get_final_message()
    for msg in (created, final):
        assert msg.content[0].type == "thinking" and msg.content[0].thinking == expect["reasoning"]
        assert msg.content[1].type == "text" and msg.content[1].text == expect["answer"]
        assert msg.stop_reason == "end_turn"
        assert msg.usage.output_tokens == expect["completion_tokens_thinking"]
    # the stream's signature is the buffered reply's: same text, same key
    assert final.content[0].signature == created.content[0].signature
    counted = client.messages.count_tokens(model="demo", messages=HI, thinking=ADAPTIVE)
    cached = created.usage.cache_read_input_tokens or 0  # the llama-server prefix cache
    assert counted.input_tokens == created.usage.input_tokens + cached
    assert [m.id for m in client.models.list()] == ["demo"]
    assert client.models.retrieve("demo").max_input_tokens == 1024  # models[].context_window


def test_python_async_sdk(llama_gateway, tiny_model) -> None:
    _, base = llama_gateway

    async def run() -> tuple[Any, Any]:
        client = anthropic.AsyncAnthropic(base_url=base, api_key="k", max_retries=0)
        created = await client.messages.create(
            model="demo", max_tokens=200, messages=HI, thinking=ADAPTIVE
        )
        async with client.messages.stream(
            model="demo", max_tokens=200, thinking=ADAPTIVE, messages=HI
        ) as stream:
            final = await stream.get_final_message()
        await client.close()
        return created, final

    created, final = asyncio.run(run())
    assert created.content[1].text == final.content[1].text == tiny_model[1]["answer"]


def test_raw_stream_is_well_formed_with_exact_texts(llama_gateway, tiny_model) -> None:
    _, base = llama_gateway
    status, raw = _post(
        base + "/v1/messages?beta=true",
        {"model": "demo", "max_tokens": 200, "messages": HI, "stream": True, "thinking": ADAPTIVE},
    )
    assert status == 200
    events = check_stream(raw)
    thinking = "".join(
        e["delta"]["thinking"]
        for e in events
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "thinking_delta"
    )
    text = "".join(
        e["delta"]["text"]
        for e in events
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta"
    )
    assert thinking == tiny_model[1]["reasoning"] and text == tiny_model[1]["answer"]
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["usage"]["output_tokens"] == tiny_model[1]["completion_tokens_thinking"]
    # the real prompt count already in message_start (llama.cpp's prompt_progress)
    _, buffered = _post(
        base + "/v1/messages",
        {"model": "demo", "max_tokens": 200, "messages": HI, "thinking": ADAPTIVE},
    )
    usage = json.loads(buffered)["usage"]
    prompt = usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
    assert events[0]["message"]["usage"]["input_tokens"] == prompt
    # the final usage is the buffered reply's way of counting (cached part apart)
    if "input_tokens" in delta["usage"]:
        assert set(delta["usage"]) == set(usage)


def test_stream_hits_max_tokens(llama_gateway) -> None:
    _, base = llama_gateway
    client = sdk.client(base, api_key="k", max_retries=0)
    with client.messages.stream(model="demo", max_tokens=4, messages=HI) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 4


def test_context_overflow_uses_claude_code_wording(llama_gateway) -> None:
    _, base = llama_gateway
    long = [{"role": "user", "content": "x" * 1500}]  # one token per byte; a slot holds 1024
    for stream in (False, True):
        status, raw = _post(
            base + "/v1/messages",
            {"model": "demo", "max_tokens": 50, "messages": long, "stream": stream},
        )
        assert status == 400
        err = json.loads(raw)["error"]
        assert err["type"] == "invalid_request_error"
        assert err["message"].startswith("prompt is too long: ")
        assert err["message"].endswith(" tokens > 1024 maximum")
    with pytest.raises(anthropic.BadRequestError):
        _client(base).messages.create(model="demo", max_tokens=50, messages=long)


def test_midstream_context_overflow_ends_with_failure_envelope(
    llama_unified, gateway_factory
) -> None:
    """Two concurrent generations overflow llama.cpp's shared KV cache mid-stream."""
    from tests.conftest import llama_config

    _, url = gateway_factory(llama_config(llama_unified.base_url))
    base = url + "/llm"
    # 121 tokens each: both prompts fit the 256 cells, both replies (18 tokens) do not
    prompt = [{"role": "user", "content": "y" * 110}]
    results: list[bytes] = [b"", b""]

    def one(i: int) -> None:
        results[i] = _post(
            base + "/v1/messages",
            {
                "model": "demo",
                "max_tokens": 200,
                "messages": prompt,
                "stream": True,
                "thinking": ADAPTIVE,
            },
        )[1]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    errored = 0
    for raw in results:
        events = check_stream(raw)  # well-formed either way
        errs = [e for e in events if e["type"] == "error"]
        if errs:
            errored += 1
            assert errs[0]["error"]["type"] == "api_error"
            assert events[-1]["type"] == "message_stop"
    assert errored >= 1, [r[-300:] for r in results]


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
def test_stop_sequence_is_reported_with_its_string(llama_gateway, tiny_model, stream) -> None:
    """llama.cpp never says which stop string matched: the gateway matches it itself."""
    _, base = llama_gateway
    answer = tiny_model[1]["answer"]
    cut = answer.index(" demo model")
    client = sdk.client(base, api_key="k", max_retries=0)
    kwargs = {
        "model": "demo",
        "max_tokens": 200,
        "messages": HI,
        "stop_sequences": ["never-appears", " demo model"],
        "thinking": {"type": "disabled"},
    }
    if stream:
        with client.messages.stream(**kwargs) as s:
            msg = s.get_final_message()
    else:
        msg = _client(base).messages.create(**kwargs)
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == " demo model"
    assert msg.content[-1].text == answer[:cut]
    assert 0 < msg.usage.output_tokens < tiny_model[1]["completion_tokens_nothink"]


def test_stop_sequence_that_never_matches_changes_nothing(llama_gateway, tiny_model) -> None:
    _, base = llama_gateway
    msg = _client(base).messages.create(
        model="demo",
        max_tokens=200,
        messages=HI,
        stop_sequences=["demo!"],
        thinking={"type": "disabled"},
    )
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    assert msg.content[0].text == tiny_model[1]["answer"]


def test_pass_through_to_llamacpp_reports_the_alias(llama_gateway, tiny_model) -> None:
    _, base = llama_gateway
    body = {"model": "demo", "messages": HI, "max_tokens": 200, "stream": True}
    status, raw = _post(base + "/v1/chat/completions", body)
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    chunks = [json.loads(line[6:]) for line in raw.split(b"\n\n") if line.startswith(b"data: {")]
    assert {c["model"] for c in chunks} == {"demo"}
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")
    )
    assert text == tiny_model[1]["answer"]
