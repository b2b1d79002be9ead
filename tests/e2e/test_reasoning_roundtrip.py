"""Reasoning survives a tool loop whatever ``thinking.display`` is, through the real gateway.

With ``display: "omitted"`` (or ``"updates"``, Claude Code 2.1.332's default) a thinking block
comes back empty; the client replays ``{"thinking": "", "signature": ...}``. The signature
holds the reasoning sealed, so the next upstream request still carries the first turn's
reasoning as ``reasoning_content``, as Anthropic's own signatures let Claude see it.
"""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests import sdk
from tests.conftest import stub_config, stub_requests

pytestmark = pytest.mark.e2e

ROUTE = """
[[models]]
name = "m-think"
upstream = "stub"
upstream_model = 'think-tool:get_weather:{"city": "Paris"}'
"""
TOOL = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
FIRST_REASONING = "REASONING_1: I need get_weather before I can answer."


def _upstream_requests(stub_url: str) -> list[dict[str, Any]]:
    return [x for x in stub_requests(stub_url) if x["path"].endswith("/chat/completions")]


@pytest.fixture(scope="module")
def think_gateway(stub_url, tmp_path_factory):
    from tests.procs import start_gateway

    proc, url = start_gateway(
        stub_config(stub_url, models=("ok",)) + ROUTE, tmp_path_factory.mktemp("think")
    )
    yield url + "/llm"
    proc.stop()


def _turn(
    client: anthropic.Anthropic, messages: list[Any], display: str | None, stream: bool
) -> anthropic.types.Message:
    thinking: dict[str, Any] = {"type": "adaptive"}
    if display:
        thinking["display"] = display
    kwargs: dict[str, Any] = {
        "model": "m-think",
        "max_tokens": 500,
        "messages": messages,
        "tools": [TOOL],
        "thinking": thinking,
    }
    if stream:
        with client.messages.stream(**kwargs) as s:
            return s.get_final_message()
    return client.messages.create(**kwargs)


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
@pytest.mark.parametrize("display", [None, "summarized", "omitted", "updates"])
def test_two_turn_tool_loop_keeps_the_reasoning(think_gateway, stub_url, display, stream) -> None:
    client = sdk.client(think_gateway, api_key="k", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = _turn(client, messages, display, stream)
    thinking, call = first.content[0], first.content[-1]
    assert thinking.type == "thinking" and call.type == "tool_use"
    hidden = display in ("omitted", "updates")
    assert thinking.thinking == ("" if hidden else FIRST_REASONING)
    assert thinking.signature  # carries the reasoning in either case

    before = len(_upstream_requests(stub_url))
    messages += [
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"}],
        },
    ]
    second = _turn(client, messages, display, stream)
    assert second.content[-1].text == "The tool said: Sunny, 21 C"

    sent = _upstream_requests(stub_url)[before]["body"]
    assistant = next(m for m in sent["messages"] if m["role"] == "assistant")
    assert assistant["reasoning_content"] == FIRST_REASONING
    assert assistant["tool_calls"][0]["function"]["name"] == "get_weather"


def test_a_signature_from_elsewhere_is_refused(think_gateway) -> None:
    client = sdk.client(think_gateway, api_key="k", max_retries=0)
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "", "signature": "EqQBCkgIARABGAIiQLm9"},
                {"type": "text", "text": "Let me check."},
            ],
        },
        {"role": "user", "content": "Go on."},
    ]
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="m-think", max_tokens=50, messages=messages)
    assert err.value.body["error"]["message"] == (  # type: ignore[index]
        "messages.1.content.0.signature: Invalid `signature` in `thinking` block"
    )
