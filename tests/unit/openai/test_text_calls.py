"""Tool calls written as text, parsed on the chat pass-through (gateway/openai/text_calls.py):
the same calls whatever the chunking, prose kept byte for byte, engine calls kept first."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.openai.text_calls import ChatTextCalls, offered_names
from gateway.text import jsonutil

CALL = '<tool_call>\n{"name": "Read", "arguments": {"file_path": "a.txt"}}\n</tool_call>'
CONTENT = "Let me look." + CALL


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _stream(content: str, size: int, names: tuple[str, ...] = ("Read",)) -> tuple[str, list, str]:
    calls_state = ChatTextCalls(names)
    text, calls, finish = "", [], None
    events = [_chunk({"content": content[i : i + size]}) for i in range(0, len(content), size)]
    events.append(_chunk({}, "stop"))
    for event in events:
        choice = calls_state.event(event)["choices"][0]
        text += choice["delta"].get("content") or ""
        calls += choice["delta"].get("tool_calls") or []
        finish = choice["finish_reason"] or finish
    return text, calls, finish


@pytest.mark.parametrize("size", [1, 3, 7, len(CONTENT)])
def test_the_call_is_found_whatever_the_chunks(size: int) -> None:
    text, calls, finish = _stream(CONTENT, size)
    assert text == "Let me look."
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "Read")]
    assert json.loads(calls[0]["function"]["arguments"]) == {"file_path": "a.txt"}
    assert finish == "tool_calls"


PROSE = [
    ("no tool offered", CONTENT, ()),
    ("another tool's name", CONTENT, ("Write",)),
    ("a mention of the tag", "I would write <tool_call> here.", ("Read",)),
]


@pytest.mark.parametrize(("name", "content", "names"), PROSE, ids=[p[0] for p in PROSE])
def test_prose_is_kept_byte_for_byte(name: str, content: str, names: tuple[str, ...]) -> None:
    text, calls, finish = _stream(content, 5, names)
    assert (text, calls, finish) == (content, [], "stop")
    body = jsonutil.dumpb(
        {"choices": [{"index": 0, "message": {"content": content}, "finish_reason": "stop"}]}
    )
    assert ChatTextCalls(names).body(body) == body


def test_buffered_reply_gets_tool_calls_after_the_engines() -> None:
    engine = {"id": "c0", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}
    body = jsonutil.dumpb(
        {
            "choices": [
                {
                    "index": 0,
                    "message": {"content": CALL, "tool_calls": [engine]},
                    "finish_reason": "stop",
                }
            ]
        }
    )
    choice = jsonutil.loads(ChatTextCalls(("Read", "Bash")).body(body))["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["Bash", "Read"]
    assert "index" not in choice["message"]["tool_calls"][1]


NAMES = [
    ({"tools": [{"type": "function", "function": {"name": "Read"}}]}, ("Read",)),
    ({"tools": [{"type": "function", "function": {"name": "Read"}}], "tool_choice": "none"}, ()),
    ({"tools": "x"}, ()),
    ({}, ()),
]


@pytest.mark.parametrize(("body", "names"), NAMES)
def test_offered_names(body: dict[str, Any], names: tuple[str, ...]) -> None:
    assert offered_names(body) == names
