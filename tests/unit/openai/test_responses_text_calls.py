"""Tool calls written as text on the Responses pass-through (gateway/openai/text_calls.py,
:class:`ResponsesTextCalls`): ``function_call`` items after the message, whatever the deltas'
sizes; later items' ``output_index`` moved up; held text that was no call still sent; a
llama.cpp stream (no indices) indexed after the rewrite; buffered bodies alike."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.openai.responses_index import ResponsesIndexer
from gateway.openai.text_calls import ResponsesTextCalls, offered_response_names
from gateway.text import jsonutil

CALL = '<tool_call>\n{"name": "Read", "arguments": {"file_path": "a.txt"}}\n</tool_call>'
CONTENT = "Let me look." + CALL


def _message(item_id: str, text: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _events(content: str, size: int, indexed: bool, after: bool = False) -> list[dict[str, Any]]:
    """A Responses stream: one message of ``content`` in deltas of ``size`` (vLLM: indices
    and sequence numbers; else llama.cpp: none), and with ``after`` a second message."""
    at = {"output_index": 0, "content_index": 0} if indexed else {}
    out: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"output": []}},
        {"type": "response.output_item.added", "item": {**_message("m1", ""), "content": []}},
    ]
    if indexed:
        out[1]["output_index"] = 0
    out += [
        {
            "type": "response.output_text.delta",
            "item_id": "m1",
            **at,
            "delta": content[i : i + size],
        }
        for i in range(0, len(content), size)
    ]
    out += [
        {"type": "response.output_text.done", "item_id": "m1", **at, "text": content},
        {"type": "response.output_item.done", "item": _message("m1", content), **at},
    ]
    output = [_message("m1", content)]
    if after:
        two = {"output_index": 1} if indexed else {}
        out += [
            {"type": "response.output_item.added", "item": _message("m2", ""), **two},
            {"type": "response.output_item.done", "item": _message("m2", "bye"), **two},
        ]
        output.append(_message("m2", "bye"))
    out.append({"type": "response.completed", "response": {"output": output}})
    if indexed:
        for i, e in enumerate(out):
            e["sequence_number"] = i
    for e in out:  # the content_index key only where the item has text
        if not indexed:
            e.pop("content_index", None)
    return out


def _run(events: list[dict[str, Any]], names=("Read",), llama: bool = False) -> list[dict]:
    calls = ResponsesTextCalls(names)
    fill = ResponsesIndexer() if llama else None
    out = []
    for e in events:
        for o in calls.event(json.loads(json.dumps(e))):
            out.append(fill(o) if fill else o)
    return out


@pytest.mark.parametrize("indexed", [True, False], ids=["vllm", "llamacpp"])
@pytest.mark.parametrize("size", [1, 5, 7, len(CONTENT)])
def test_the_call_follows_the_message_whatever_the_deltas(size: int, indexed: bool) -> None:
    out = _run(_events(CONTENT, size, indexed, after=True), llama=not indexed)
    text = "".join(e["delta"] for e in out if e["type"] == "response.output_text.delta")
    assert text == "Let me look."
    assert next(e for e in out if e["type"] == "response.output_text.done")["text"] == text
    kinds = [e["type"] for e in out]
    at = kinds.index("response.function_call_arguments.delta")
    added, delta, done, item_done = out[at - 1 : at + 3]
    assert out[at - 2]["item"]["id"] == "m1"  # the message ended first
    assert out[at - 2]["item"]["content"][0]["text"] == "Let me look."
    assert added["type"] == "response.output_item.added" and added["item"]["arguments"] == ""
    assert json.loads(delta["delta"]) == json.loads(done["arguments"]) == {"file_path": "a.txt"}
    assert item_done["item"]["name"] == "Read" and item_done["item"]["status"] == "completed"
    assert added["output_index"] == delta["output_index"] == item_done["output_index"] == 1
    # the upstream's next item moved up past the call
    m2 = [e for e in out if e.get("item", {}).get("id") == "m2"]
    assert {e["output_index"] for e in m2} == {2}
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    final = out[-1]["response"]["output"]
    assert [i["type"] for i in final] == ["message", "function_call", "message"]
    assert final[1]["call_id"] == added["item"]["call_id"] and final[1]["id"] == added["item"]["id"]


@pytest.mark.parametrize(
    ("content", "names"),
    [
        ("Plain words, no call.", ("Read",)),
        ("Looks like <tool but is not", ("Read",)),  # held, then sent as text
        (CONTENT, ("Write",)),  # a call of a tool not offered stays text
        (CONTENT, ()),
    ],
)
def test_text_without_an_offered_call_is_kept_byte_for_byte(content: str, names) -> None:
    for size in (1, 4, len(content)):
        out = _run(_events(content, size, indexed=True), names=names)
        text = "".join(e["delta"] for e in out if e["type"] == "response.output_text.delta")
        assert text == content
        assert not any(e["type"].startswith("response.function_call") for e in out)
        assert [i["type"] for i in out[-1]["response"]["output"]] == ["message"]


def test_buffered_reply_gets_a_function_call_item_after_its_message() -> None:
    reply = {
        "id": "resp_1",
        "output": [
            {"type": "reasoning", "id": "r1", "summary": []},
            _message("m1", CONTENT),
            _message("m2", "bye"),
        ],
    }
    data = jsonutil.dumpb(reply)
    out = json.loads(ResponsesTextCalls(("Read",)).body(data))
    kinds = [i["type"] for i in out["output"]]
    assert kinds == ["reasoning", "message", "function_call", "message"]
    assert out["output"][1]["content"][0]["text"] == "Let me look."
    call = out["output"][2]
    assert call["name"] == "Read" and json.loads(call["arguments"]) == {"file_path": "a.txt"}
    assert call["call_id"].startswith("call_") and call["id"].startswith("fc_")
    plain = jsonutil.dumpb({"output": [_message("m1", "no call here")]})
    assert ResponsesTextCalls(("Read",)).body(plain) is plain  # untouched bytes


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"tools": [{"type": "function", "name": "Read"}]}, ("Read",)),
        ({"tools": [{"type": "function", "name": "Read"}], "tool_choice": "none"}, ()),
        ({"tools": [{"type": "web_search"}, {"type": "function", "name": "A"}]}, ("A",)),
        ({"tools": "no"}, ()),
        ({}, ()),
    ],
)
def test_offered_response_names(body: dict[str, Any], names: tuple[str, ...]) -> None:
    assert offered_response_names(body) == names


@pytest.mark.parametrize("content", [CONTENT, "Looks like <tool but is not"])
def test_a_message_ended_without_its_text_done_event_still_gets_all(content: str) -> None:
    events = [
        e for e in _events(content, 3, indexed=True) if e["type"] != "response.output_text.done"
    ]
    out = _run(events)
    deltas = [e for e in out if e["type"] == "response.output_text.delta"]
    text = "".join(e["delta"] for e in deltas)
    calls = [e for e in out if e["type"] == "response.function_call_arguments.done"]
    assert (text, len(calls)) == (("Let me look.", 1) if content == CONTENT else (content, 0))
    assert all(e["item_id"] == "m1" and e["output_index"] == 0 for e in deltas)
