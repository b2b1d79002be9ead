"""Anthropic-defined tools through the real gateway, driven by the official Python SDK.

Client tools (``bash_20250124``, ``text_editor_20250728``, ...) reach the upstream as
function tools with the schemas Anthropic documents, and the model's call comes back as a
``tool_use`` block under the client's tool name. A server tool (``web_search_20250305``, the
only tool of Claude Code's WebSearch side request) is a 400 naming ``tools.0``: the SDK
raises ``BadRequestError`` and the upstream never hears of the request.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from tests import sdk
from tests.client_tool_schemas import BASH, NEW_EDITOR
from tests.conftest import clear_stub, stub_config, stub_requests

pytestmark = pytest.mark.e2e

BASH_TOOL = {"type": "bash_20250124", "name": "bash"}
EDITOR_TOOL = {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}
WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 8}
ARGS = '{"command": "ls -la /repo"}'


@pytest.fixture
def client(stub_url: str, gateway_factory: Any) -> anthropic.Anthropic:
    # the stub's `agent:NAME:ARGS` calls tool NAME with ARGS, then answers with its result
    config = stub_config(stub_url, models=("ok",)) + (
        '\n[[models]]\nname = "m-bash"\nupstream = "stub"\n'
        f"upstream_model = 'agent:bash:{ARGS}'\n"
    )
    _, url = gateway_factory(config)
    clear_stub(stub_url)
    return sdk.client(url + "/llm", api_key="k", max_retries=0)


def test_client_tools_reach_the_upstream_as_documented_function_tools(
    client: anthropic.Anthropic, stub_url: str
) -> None:
    ask = [{"role": "user", "content": "What is in /repo?"}]
    msg = client.messages.create(
        model="m-bash", max_tokens=256, messages=ask, tools=[BASH_TOOL, EDITOR_TOOL]
    )
    assert msg.stop_reason == "tool_use"
    (call,) = [b for b in msg.content if b.type == "tool_use"]
    assert call.name == "bash" and call.input == json.loads(ARGS)  # the client's name

    (seen,) = stub_requests(stub_url)
    tools = seen["body"]["tools"]
    assert [t["type"] for t in tools] == ["function", "function"]
    bash, editor = (t["function"] for t in tools)
    assert bash["name"] == "bash" and bash["parameters"] == BASH
    assert editor["name"] == "str_replace_based_edit_tool"
    assert editor["parameters"] == NEW_EDITOR
    assert "undo_edit" not in editor["description"] and bash["description"]

    # the tool loop goes on, streamed: the call goes back under its name, with its result
    clear_stub(stub_url)
    history = [
        *ask,
        {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "README.md  src"}
            ],
        },
    ]
    with client.messages.stream(
        model="m-bash",
        max_tokens=256,
        messages=history,
        tools=[BASH_TOOL, EDITOR_TOOL],
        tool_choice={"type": "tool", "name": "bash"},
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "end_turn"
    assert final.content[0].type == "text"
    assert final.content[0].text == "The tool said: README.md  src"
    (seen,) = stub_requests(stub_url)
    body = seen["body"]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "bash"}}
    assistant, result = body["messages"][-2:]
    assert assistant["tool_calls"][0]["function"]["name"] == "bash"
    assert result == {"role": "tool", "tool_call_id": call.id, "content": "README.md  src"}


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
def test_web_search_is_refused_naming_the_tool(
    client: anthropic.Anthropic, stub_url: str, stream: bool
) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model="m-ok",
            max_tokens=256,
            stream=stream,  # type: ignore[call-overload]
            messages=[{"role": "user", "content": "Search: llama.cpp news"}],
            tools=[WEB_SEARCH],
        )
    err = info.value
    assert err.status_code == 400
    assert isinstance(err.body, dict)
    assert err.body["error"]["type"] == "invalid_request_error"
    assert err.body["error"]["message"] == (
        "tools.0.type: 'web_search_20250305' is an Anthropic server tool; this gateway's models "
        "cannot run Anthropic server tools"
    )
    assert stub_requests(stub_url) == []  # nothing reached the upstream


def test_count_tokens_takes_client_tools_and_refuses_server_tools(
    client: anthropic.Anthropic, stub_url: str
) -> None:
    ask = [{"role": "user", "content": "hi"}]
    count = client.messages.count_tokens(model="m-ok", messages=ask, tools=[BASH_TOOL, EDITOR_TOOL])
    bare = client.messages.count_tokens(model="m-ok", messages=ask)
    assert count.input_tokens > bare.input_tokens  # the schemas are part of the prompt
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.count_tokens(model="m-ok", messages=ask, tools=[WEB_SEARCH])
    assert "tools.0.type: 'web_search_20250305' is an Anthropic server tool" in str(info.value)
