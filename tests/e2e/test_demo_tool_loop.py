"""The tool loop of ``llm-gateway --demo``, driven by the official Python SDK.

Offered tools, the tiny demo model writes a call as text in Hermes/Qwen's format (its chat
template leaves llama.cpp's own tool parser off: gateway/demo/toolcall.py); the gateway's text
tool-call parser makes it a ``tool_use`` block with ``stop_reason: tool_use``. With the tool's
result sent back the model answers in text and the loop ends.
"""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.demo import toolcall
from gateway.demo.tinymodel import ANSWER_TEXT
from tests import sdk
from tests.procs import Proc, free_port, require_demo_extra, wait_http

pytestmark = [pytest.mark.e2e, pytest.mark.llamacpp]

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
BASH = {
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
        "required": ["command"],
    },
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``llm-gateway --demo`` as the README runs it (the model built into a fresh cache)."""
    require_demo_extra()
    port = free_port()
    cache = tmp_path_factory.mktemp("demo-cache")
    proc = Proc(
        [sys.executable, "-m", "gateway", "--demo", "--port", str(port)],
        env={"XDG_CACHE_HOME": str(cache)},
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=120, proc=proc.popen)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


def _text_tool_calls(root: str) -> float:
    """llm_gateway_local_fixes_total{fix="text_tool_call"}: calls the text parser found."""
    with urllib.request.urlopen(root + "/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith("llm_gateway_local_fixes_total{") and 'fix="text_tool_call"' in line
    )


def _call(client: Any, stream: bool, **kw: Any) -> Any:
    if stream:
        with client.messages.stream(**kw) as s:
            return s.get_final_message()
    return client.messages.create(**kw)


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
@pytest.mark.parametrize(
    ("tools", "expected_input"),
    [
        ([WEATHER], {"city": "demo"}),
        ([WEATHER, BASH], toolcall.BASH_ARGUMENTS),  # Bash is preferred wherever it is
    ],
)
def test_one_tool_round_trip(demo: str, stream: bool, tools: list, expected_input: dict) -> None:
    client = sdk.client(demo + "/llm", api_key="k", max_retries=0)
    before = _text_tool_calls(demo)
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = _call(client, stream, model="demo", max_tokens=400, messages=question, tools=tools)
    assert first.stop_reason == "tool_use", first
    uses = [b for b in first.content if b.type == "tool_use"]
    assert len(uses) == 1 and [b.type for b in first.content][-1] == "tool_use", first.content
    use = uses[0]
    assert use.name == ("Bash" if len(tools) > 1 else "get_weather")
    assert isinstance(use.input, dict) and use.input == expected_input
    assert use.id.startswith("toolu_")
    # no text around the call: the whole reply was the call
    assert not [b for b in first.content if b.type == "text" and b.text.strip()], first.content
    assert _text_tool_calls(demo) == before + 1  # the gateway's text parser made the block

    answered = [
        *question,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "demo-tool-loop"}
            ],
        },
    ]
    second = _call(client, stream, model="demo", max_tokens=400, messages=answered, tools=tools)
    assert second.stop_reason == "end_turn", second
    assert [b.type for b in second.content if b.type != "thinking"] == ["text"]
    assert second.content[-1].text == ANSWER_TEXT


def test_no_tools_reply_is_unchanged(demo: str) -> None:
    client = sdk.client(demo + "/llm", api_key="k", max_retries=0)
    msg = client.messages.create(
        model="demo", max_tokens=400, messages=[{"role": "user", "content": "hi"}]
    )
    assert msg.stop_reason == "end_turn" and msg.content[-1].text == ANSWER_TEXT
