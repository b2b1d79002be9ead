"""Tool calls an engine writes as text reach OpenAI SDK clients as tool calls, where the route
asks for it, through a real gateway process and the official OpenAI SDK.

The stub's ``text-tool:PATH`` is an engine started without its tool parser: it writes a Read
of PATH as Hermes ``<tool_call>{...}</tool_call>`` in ``content`` with finish ``stop``,
streamed in 7-character pieces (the tags split across chunks). With
``passthrough_text_tool_calls`` the chat pass-through gives ``message.tool_calls`` (buffered)
or ``tool_calls`` deltas (streamed) and ``finish_reason: "tool_calls"``, and ``/v1/responses``
a ``function_call`` output item (buffered, streamed, and through the SDK's ``responses.stream()``
helper); without it the bytes are relayed as the engine sent them.
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


# ---------------------------------------------------------------- /v1/responses

READ_FLAT = {"type": "function", **READ["function"]}  # a Responses tool is flat


def _respond(client: openai.OpenAI, model: str, **extra: Any) -> Any:
    return client.responses.create(
        model=model,
        input="Read hello.txt",
        tools=[READ_FLAT],  # type: ignore[list-item]
        **extra,
    )


def _message_text(output: list[Any]) -> str:
    return "".join(part.text for item in output if item.type == "message" for part in item.content)


def test_responses_buffered_reply_has_a_function_call_item(client: openai.OpenAI) -> None:
    reply = _respond(client, "parsed")
    kinds = [item.type for item in reply.output]
    assert kinds == ["message", "function_call"], kinds
    call = reply.output[1]
    assert call.name == "Read" and json.loads(call.arguments) == {"file_path": PATH}
    assert call.call_id.startswith("call_") and call.status == "completed"
    assert _message_text(reply.output).strip() == "I'll read it."
    assert "<tool_call>" not in reply.output_text
    assert reply.model == "parsed"


def test_responses_stream_has_the_function_call_events(client: openai.OpenAI) -> None:
    events = list(_respond(client, "parsed", stream=True))
    kinds = [e.type for e in events]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.strip() == "I'll read it.", text
    done_text = next(e for e in events if e.type == "response.output_text.done").text
    assert done_text == text
    at = kinds.index("response.function_call_arguments.delta")
    # the message item done, then the call's four events
    assert kinds[at - 2 : at + 3] == [
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ], kinds
    added, delta, done, item_done = events[at - 1 : at + 3]
    assert added.output_index == delta.output_index == done.output_index == 1
    assert added.item.type == "function_call" and added.item.arguments == ""
    assert delta.item_id == done.item_id == added.item.id == item_done.item.id
    assert json.loads(delta.delta) == json.loads(done.arguments) == {"file_path": PATH}
    assert item_done.item.name == "Read" and item_done.item.status == "completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1]
    assert final.type == "response.completed"
    assert [item.type for item in final.response.output] == ["message", "function_call"]
    assert final.response.output[1].call_id == added.item.call_id


def test_responses_stream_helper_accumulates_the_call(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model="parsed",
        input="Read hello.txt",
        tools=[READ_FLAT],  # type: ignore[list-item]
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    call = final.output[1]
    assert call.type == "function_call"
    assert json.loads(call.arguments) == {"file_path": PATH}


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
@pytest.mark.parametrize("model", ["relayed", "not-offered"])
def test_responses_text_stays_text(client: openai.OpenAI, model: str, stream: bool) -> None:
    """Without the knob, or without the tool offered: the engine's text as it wrote it."""
    extra: dict[str, Any] = {"tools": [READ_FLAT]} if model == "relayed" else {}
    asked = client.responses.create(
        model="relayed" if model == "relayed" else "parsed",
        input="Read hello.txt",
        stream=stream,
        **extra,
    )
    if stream:
        text = "".join(e.delta for e in asked if e.type == "response.output_text.delta")
    else:
        assert [item.type for item in asked.output] == ["message"]
        text = asked.output_text
    assert "<tool_call>" in text and "Read" in text
