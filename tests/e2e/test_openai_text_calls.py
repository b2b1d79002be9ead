"""Tool calls an engine writes as text reach OpenAI SDK clients as tool calls, where the route
asks for it, through a real gateway process and the official OpenAI SDK.

The stub's ``text-tool:PATH`` is an engine started without its tool parser: it writes a Read
of PATH as Hermes ``<tool_call>{...}</tool_call>`` in ``content`` with finish ``stop``,
streamed in 7-character pieces (the tags split across chunks). With
``passthrough_text_tool_calls`` the chat pass-through gives ``message.tool_calls`` (buffered)
or ``tool_calls`` deltas (streamed) and ``finish_reason: "tool_calls"``; without it the bytes
are relayed as the engine sent them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.conftest import stub_config
from tests.procs import start_gateway

pytestmark = pytest.mark.e2e

PATH = "/work/hello.txt"
READ = {
    "type": "function",
    "function": {
        "name": "Read",
        "description": "Read a file",
        "parameters": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}},
            "required": ["file_path"],
        },
    },
}


@pytest.fixture(scope="module")
def base(stub_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = stub_config(stub_url, models=(), extra_upstream="passthrough_text_tool_calls = true")
    config += f"""
[upstreams.plain]
base_url = "{stub_url}"

[[models]]
name = "parsed"
upstream = "stub"
upstream_model = "text-tool:{PATH}"

[[models]]
name = "relayed"
upstream = "plain"
upstream_model = "text-tool:{PATH}"
"""
    proc, url = start_gateway(config, tmp_path_factory.mktemp("openai-text-calls"))
    try:
        yield url + "/llm/v1"
    finally:
        proc.stop()


@pytest.fixture
def client(base: str) -> Iterator[openai.OpenAI]:
    made = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=10)
    yield made
    made.close()


def _ask(client: openai.OpenAI, model: str, **extra: Any) -> Any:
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Read hello.txt"}],
        tools=[READ],  # type: ignore[list-item]
        **extra,
    )


def test_buffered_reply_has_the_call(client: openai.OpenAI) -> None:
    reply = _ask(client, "parsed")
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "Read"
    assert json.loads(call.function.arguments) == {"file_path": PATH}
    assert call.id.startswith("call_")
    assert "<tool_call>" not in (choice.message.content or "")
    assert reply.model == "parsed"


def test_streamed_reply_has_the_call_as_deltas(client: openai.OpenAI) -> None:
    text, calls, finish = "", [], None
    for chunk in _ask(client, "parsed", stream=True):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        calls += choice.delta.tool_calls or []
        finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert "<tool_call>" not in text and "tool_call" not in text
    (call,) = calls
    assert (call.index, call.function.name) == (0, "Read")
    assert json.loads(call.function.arguments) == {"file_path": PATH}


def test_a_tool_not_offered_stays_text(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="parsed", messages=[{"role": "user", "content": "Read hello.txt"}]
    )
    assert reply.choices[0].finish_reason == "stop"
    assert "<tool_call>" in (reply.choices[0].message.content or "")


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
def test_without_the_knob_the_engine_bytes_are_relayed(client: openai.OpenAI, stream) -> None:
    if stream:
        text = "".join(
            c.choices[0].delta.content or ""
            for c in _ask(client, "relayed", stream=True)
            if c.choices
        )
    else:
        reply = _ask(client, "relayed")
        assert reply.choices[0].finish_reason == "stop"
        text = reply.choices[0].message.content or ""
    assert "<tool_call>" in text and "Read" in text
