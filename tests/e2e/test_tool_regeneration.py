"""A stream an engine cuts while a tool call's arguments stream: the gateway asks again and
the client's SDK sees one well-formed reply with the whole call (``tool-cut:N`` in
tests/stub_upstream.py cuts the first N streams of a conversation after half the arguments;
``text-tool-cut:N`` halfway through the call written as text, which the gateway holds
unshown: it is written again whole, not prefilled)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests import sdk
from tests.procs import Proc, get, post

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _config(stub_url: str) -> str:
    return f"""
[upstreams.stub]
base_url = "{stub_url}"

[[models]]
name = "cut-once"
upstream = "stub"
upstream_model = "tool-cut:1"

[[models]]
name = "cut-always"
upstream = "stub"
upstream_model = "tool-cut:9"

[[models]]
name = "text-cut-once"
upstream = "stub"
upstream_model = "text-tool-cut:1"
"""


def test_a_tool_call_cut_mid_arguments_reaches_the_sdk_whole(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]]
) -> None:
    stub = stub_url.removesuffix("/v1")
    _, base = gateway_factory(_config(stub_url))
    cut_before = json.loads(get(f"{stub}/_stats")[2])["cut"]
    client = sdk.client(f"{base}/llm", api_key="k", max_retries=0)
    try:
        for n in range(3):  # each a new conversation, each cut once
            messages = [{"role": "user", "content": f"What is the weather in Paris? ({n})"}]
            with client.messages.stream(
                model="cut-once", max_tokens=64, tools=TOOLS, messages=messages
            ) as stream:
                kinds = [event.type for event in stream]
                message = stream.get_final_message()
            assert "error" not in kinds and kinds[-1] == "message_stop", kinds
            assert message.stop_reason == "tool_use"
            assert message.model == "cut-once"
            text = [b.text for b in message.content if b.type == "text"]
            calls = [b for b in message.content if b.type == "tool_use"]
            assert text == ["Let me check the weather."]
            assert len(calls) == 1  # never a duplicated or a half call
            assert (calls[0].id, calls[0].name, calls[0].input) == (
                "call_1",
                "get_weather",
                {"city": "Paris"},
            )
            assert kinds.count("content_block_start") == 2
    finally:
        sdk.close_all()
    assert json.loads(get(f"{stub}/_stats")[2])["cut"] == cut_before + 3
    sent = [
        r["body"]
        for r in json.loads(get(f"{stub}/_requests")[2])
        if r["path"].endswith("/chat/completions") and r["body"]["model"] == "tool-cut:1"
    ]
    again = [b for b in sent if b["messages"][-1]["role"] == "assistant"]
    assert len(again) == 3  # one continuation per conversation, the text as its prefill
    assert all(b["messages"][-1]["content"] == "Let me check the weather." for b in again)


def test_past_the_budget_the_stream_ends_with_the_envelope(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]]
) -> None:
    _, base = gateway_factory(_config(stub_url))
    status, _, body = post(
        f"{base}/llm/v1/messages",
        {"model": "cut-always", "max_tokens": 64, "tools": TOOLS, "messages": ASK, "stream": True},
    )
    assert status == 200
    assert body.count(b"event: error") == 1 and body.endswith(
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    assert body.count(b'"type":"tool_use"') == 1


def test_a_call_written_as_text_cut_midway_reaches_the_sdk_whole(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]]
) -> None:
    """An engine without its tool parser, cut inside ``<tool_call>...``: the held call text
    never reached the client, so the continuation's prefill is the text the client was shown
    (and the newlines held after it), and the call the engine writes again becomes the one
    tool_use block (prefilled with the held part, the call came out twice over, as text)."""
    stub = stub_url.removesuffix("/v1")
    _, base = gateway_factory(_config(stub_url))
    cut_before = json.loads(get(f"{stub}/_stats")[2])["cut"]
    client = sdk.client(f"{base}/llm", api_key="k", max_retries=0)
    try:
        for n in range(2):  # each a new conversation, each cut once
            messages = [{"role": "user", "content": f"What is the weather in Paris? ({n})"}]
            with client.messages.stream(
                model="text-cut-once", max_tokens=64, tools=TOOLS, messages=messages
            ) as stream:
                kinds = [event.type for event in stream]
                message = stream.get_final_message()
            assert "error" not in kinds and kinds[-1] == "message_stop", kinds
            assert message.stop_reason == "tool_use"
            assert [b.text for b in message.content if b.type == "text"] == [
                "Let me check the weather."
            ]
            calls = [b for b in message.content if b.type == "tool_use"]
            assert [(c.name, c.input) for c in calls] == [("get_weather", {"city": "Paris"})]
    finally:
        sdk.close_all()
    assert json.loads(get(f"{stub}/_stats")[2])["cut"] == cut_before + 2
    sent = [
        r["body"]
        for r in json.loads(get(f"{stub}/_requests")[2])
        if r["path"].endswith("/chat/completions") and r["body"]["model"] == "text-tool-cut:1"
    ]
    again = [b for b in sent if b["messages"][-1]["role"] == "assistant"]
    assert len(again) == 2
    assert all(b["messages"][-1]["content"] == "Let me check the weather.\n\n" for b in again)
    assert all(b["max_tokens"] == 62 for b in again)  # the two text deltas before the call
