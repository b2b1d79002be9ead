"""What the upstream actually receives for an Anthropic request, through the real gateway."""

from __future__ import annotations

import json
import urllib.request

import anthropic
import pytest

from tests import sdk
from tests.anthropic_stream_check import check_stream
from tests.conftest import clear_stub, stub_config, stub_requests

pytestmark = pytest.mark.e2e


CLAUDE_CODE_LIKE = {
    "model": "m-tools",
    "max_tokens": 2048,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0.abc;"},
        {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "system", "content": "Available agent types: none."},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Need the tool.", "signature": "c2ln"},
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "Sunny, 21 C"},
                {
                    "type": "text",
                    "text": "Thanks; summarise.",
                    "cache_control": {"type": "ephemeral"},
                },
            ],
        },
    ],
    "tools": [
        {
            "name": "get_weather",
            "description": "Weather for a city",
            "input_schema": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "thinking": {"type": "adaptive", "display": "omitted"},
    "output_config": {"effort": "high"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
    "stop_sequences": ["\n\nHuman:"],
    "temperature": 0.5,
    "service_tier": "auto",
    "stream": True,
}


def test_claude_code_shaped_request_is_translated(stub_url, gateway_factory) -> None:
    _, url = gateway_factory(stub_config(stub_url, models=("tools",)))
    clear_stub(stub_url)
    req = urllib.request.Request(
        url + "/llm/v1/messages?beta=true",
        data=json.dumps(CLAUDE_CODE_LIKE).encode(),
        method="POST",
        headers={
            "content-type": "application/json",
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "claude-code-20250219,x-unknown-1",
            "x-api-key": "client-key",
        },
    )
    with urllib.request.urlopen(req, timeout=20) as resp:
        check_stream(resp.read())
    (seen,) = stub_requests(stub_url)
    body = seen["body"]
    assert body["model"] == "tools"  # the route's upstream_model
    assert body["max_tokens"] == 2048 and body["temperature"] == 0.5
    assert body["stop"] == ["\n\nHuman:"]
    assert body["stream"] is True and body["stream_options"]["include_usage"] is True
    for dropped in (
        "metadata",
        "context_management",
        "service_tier",
        "output_config",
        "thinking",
        "system",
        "stop_sequences",
    ):
        assert dropped not in body, dropped
    assert body["reasoning_effort"] == "high"
    assert body["chat_template_kwargs"]["enable_thinking"] is True
    assert body["parallel_tool_calls"] is False and body["tool_choice"] == "auto"
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather"]
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user", "system", "assistant", "tool", "user"]
    assert body["messages"][0]["content"] == "You are a coding agent."  # billing line dropped
    assistant = body["messages"][3]
    assert assistant["content"] is None and assistant["reasoning_content"] == "Need the tool."
    call = assistant["tool_calls"][0]
    assert call["id"] == "toolu_01" and json.loads(call["function"]["arguments"]) == {
        "city": "Paris"
    }
    assert body["messages"][4] == {
        "role": "tool",
        "tool_call_id": "toolu_01",
        "content": "Sunny, 21 C",
    }
    assert body["messages"][5] == {"role": "user", "content": "Thanks; summarise."}
    assert "cache_control" not in seen["raw"] and "client-key" not in json.dumps(seen)


def test_prefill_and_sdk_request_reach_upstream(stub_url, gateway_factory) -> None:
    _, url = gateway_factory(stub_config(stub_url, models=("ok",)))
    clear_stub(stub_url)
    client = sdk.client(url + "/llm", api_key="k", max_retries=0)
    msg = client.messages.create(
        model="m-ok",
        max_tokens=30,
        extra_body={"top_k": 5},
        messages=[{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi"}],
    )
    assert msg.content[0].text == "Hello from the stub."
    (seen,) = stub_requests(stub_url)
    body = seen["body"]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["top_k"] == 5 and body.get("stream", False) is False
    assert body["messages"][-1] == {"role": "assistant", "content": "Hi"}


def test_count_tokens_uses_the_vllm_tokenizer_route(stub_url, gateway_factory) -> None:
    cfg = stub_config(stub_url, models=("ok",)).replace(
        "idle_timeout = 3", 'idle_timeout = 3\nkind = "vllm"'
    )
    _, url = gateway_factory(cfg)
    clear_stub(stub_url)
    client = sdk.client(url + "/llm", api_key="k", max_retries=0, _strict_response_validation=True)
    messages = [{"role": "user", "content": "count me, please"}]
    raw = client.messages.with_raw_response.count_tokens(
        model="m-ok", messages=messages, system="Be brief."
    )
    counted = raw.parse()
    assert raw.headers.get("x-token-count-estimated") is None
    (seen,) = stub_requests(stub_url)
    assert seen["path"] == "/tokenize" and seen["body"]["model"] == "ok"
    sent = seen["body"]["messages"]
    assert sent == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "count me, please"},
    ]
    assert counted.input_tokens == len(json.dumps(sent)) // 3


@pytest.mark.parametrize("kind", ["vllm", "llamacpp"])
def test_count_tokens_estimates_when_the_tokenizer_route_is_missing(
    stub_url, gateway_factory, kind: str
) -> None:
    """A vLLM or llama.cpp route whose server does not serve the tokenizer routes (a router
    such as sglang-router forwards the chat routes only: 404) counts by the estimate,
    flagged, never an error."""
    cfg = stub_config(stub_url, models=("status:404",)).replace(
        "idle_timeout = 3", f'idle_timeout = 3\nkind = "{kind}"'
    )
    _, url = gateway_factory(cfg)
    client = sdk.client(url + "/llm", api_key="k", max_retries=0, _strict_response_validation=True)
    raw = client.messages.with_raw_response.count_tokens(
        model="m-status:404", messages=[{"role": "user", "content": "x" * 400}]
    )
    assert raw.headers["x-token-count-estimated"] == "true"
    assert 100 <= raw.parse().input_tokens <= 120


def test_count_tokens_estimates_without_a_tokenizer(stub_gateway) -> None:
    _, base = stub_gateway
    client = sdk.client(base, api_key="k", max_retries=0)
    raw = client.messages.with_raw_response.count_tokens(
        model="m-ok", messages=[{"role": "user", "content": "x" * 400}]
    )
    assert raw.headers["x-token-count-estimated"] == "true"
    assert 100 <= raw.parse().input_tokens <= 120


def test_per_turn_control_entry_is_accepted_and_nothing_empty_goes_up(
    stub_url, gateway_factory
) -> None:
    """Claude Code 2.1.332 after /compact (and --bare, every request) ends the messages with
    ``{"role":"system","content":[],"output_config":{"effort":"medium"}}`` under beta
    ``per-turn-control-2026-07-01``: a 200, its effort used, no empty message upstream."""
    _, url = gateway_factory(stub_config(stub_url, models=("ok",)))
    clear_stub(stub_url)
    client = sdk.client(url + "/llm", api_key="k", max_retries=0, _strict_response_validation=True)
    control = {"role": "system", "content": [], "output_config": {"effort": "medium"}}
    msg = client.beta.messages.create(
        model="m-ok",
        max_tokens=30,
        betas=["per-turn-control-2026-07-01"],
        output_config={"effort": "high"},
        messages=[{"role": "user", "content": "Say hi"}, control],
    )  # type: ignore[list-item]
    assert msg.content[0].text == "Hello from the stub."  # type: ignore[union-attr]
    with client.beta.messages.stream(
        model="m-ok",
        max_tokens=30,
        betas=["per-turn-control-2026-07-01"],
        messages=[
            {"role": "user", "content": "Say hi"},
            {"role": "system", "content": "", "output_config": {"effort": "low"}},
        ],
    ) as stream:
        assert stream.get_final_text() == "Hello from the stub."
    first, second = stub_requests(stub_url)
    for seen, effort in ((first, "medium"), (second, "low")):
        body = seen["body"]
        assert body["messages"] == [{"role": "user", "content": "Say hi"}]
        assert body["reasoning_effort"] == effort
        assert "output_config" not in body


def test_empty_system_turn_without_output_config_is_still_refused(stub_gateway) -> None:
    _, base = stub_gateway
    client = sdk.client(base, api_key="k", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model="m-ok",
            max_tokens=30,
            messages=[{"role": "user", "content": "hi"}, {"role": "system", "content": []}],
        )  # type: ignore[list-item]
    assert "messages.1.content" in info.value.message


def test_cached_prompt_tokens_reach_both_sdk_paths(stub_url, gateway_factory) -> None:
    """The upstream reports 8 of 12 prompt tokens as cached: the buffered reply and the
    Python SDK's folded stream both say input_tokens 4, cache_read_input_tokens 8 (the
    stream's message_start keeps the estimate; message_delta.usage carries the figures)."""
    _, url = gateway_factory(stub_config(stub_url, models=("cached",)))
    client = sdk.client(url + "/llm", api_key="k", max_retries=0, _strict_response_validation=True)
    hi = [{"role": "user", "content": "hi"}]
    buffered = client.messages.create(model="m-cached", max_tokens=30, messages=hi)
    with client.messages.stream(model="m-cached", max_tokens=30, messages=hi) as stream:
        streamed = stream.get_final_message()
    for message in (buffered, streamed):
        usage = message.usage
        assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (4, 8, 5)
        assert usage.cache_creation_input_tokens is None  # not known: not sent
    raw = urllib.request.Request(
        url + "/llm/v1/messages",
        method="POST",
        data=json.dumps(
            {"model": "m-cached", "max_tokens": 30, "messages": hi, "stream": True}
        ).encode(),
        headers={"content-type": "application/json", "x-api-key": "k"},
    )
    with urllib.request.urlopen(raw, timeout=20) as resp:
        events = check_stream(resp.read())
    assert "cache_read_input_tokens" not in events[0]["message"]["usage"]
    final = next(e for e in events if e["type"] == "message_delta")
    assert final["usage"] == {"input_tokens": 4, "cache_read_input_tokens": 8, "output_tokens": 5}
