"""The chat prompt of a turn is the start of the next turn's, across a resume (issue 35).

An engine's prefix cache (llama.cpp's ``cache_prompt``, vLLM's prefix caching) reuses a prompt
only as far as its bytes match. A session goes on (or is resumed with ``--continue``) by
sending the whole history again with one more exchange; what Claude Code changes between the
two requests must not change the translated prefix: ``cache_control`` moves to the newest
block, the billing header's hash changes per request, the thinking of earlier turns comes back
with its signature, ``role: "system"`` turns stay where they were. Measured with Claude Code
2.1.197 on a real llama.cpp (tests/clients/claude_code_run.py ``llama-resume``): the resumed
session's first request read its whole earlier prompt from the engine's cache.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.messages.from_chat.signatures import restorable, restore_reasoning, seal
from gateway.messages.request.validate import validate_messages
from gateway.messages.to_chat.translate import to_chat
from gateway.ops.config import ModelRoute, UpstreamConfig
from gateway.text import jsonutil

KEY = b"k" * 32
REASONING = "The user wants the file.\n\nI will call Read."
TOOL = {
    "name": "Read",
    "description": "Read a file",
    "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
}
EPHEMERAL = {"type": "ephemeral"}


def _route() -> ModelRoute:
    upstream = UpstreamConfig(name="u", base_url="http://127.0.0.1:9/v1", kind="llamacpp")
    return ModelRoute(name="tiny-demo", upstream=upstream, upstream_model="demo")


def _system(cch: str) -> list[dict[str, Any]]:
    return [
        {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.197.a1f; cch={cch};"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": EPHEMERAL},
    ]


def _turn_n(thinking: str) -> list[dict[str, Any]]:
    """A first exchange: the question, a thinking Read call, its result (cache-marked, as the
    newest block of a request is)."""
    return [
        {"role": "user", "content": [{"type": "text", "text": "Read a.txt"}]},
        {"role": "system", "content": "Reminder: be brief."},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": thinking, "signature": seal(KEY, REASONING)},
                {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"file_path": "a"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": "1\thello",
                    "cache_control": EPHEMERAL,
                }
            ],
        },
    ]


def _request(
    messages: list[dict[str, Any]], cch: str, display: str | None = None
) -> dict[str, Any]:
    thinking = {"type": "adaptive", **({"display": display} if display else {})}
    return {
        "model": "tiny-demo",
        "max_tokens": 512,
        "stream": True,
        "system": _system(cch),
        "tools": [TOOL],
        "thinking": thinking,
        "messages": messages,
    }


def _resumed(turn: list[dict[str, Any]], thinking: str) -> list[dict[str, Any]]:
    """The next request: the same history, the cache mark moved to the newest block, the
    answer and a new question after it."""
    history = copy.deepcopy(turn)
    for block in history[-1]["content"]:
        block.pop("cache_control", None)
    history[2]["content"][0]["thinking"] = thinking
    return [
        *history,
        {"role": "assistant", "content": [{"type": "text", "text": "It says hello."}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Go on", "cache_control": EPHEMERAL}],
        },
    ]


def _chat(req: dict[str, Any]) -> dict[str, Any]:
    valid = validate_messages(req)
    restore_reasoning(valid, KEY, blocks=restorable(valid))
    return to_chat(valid, _route())


# How Claude Code replays the first turn's thinking: as it came (2.1.197: the text; 2.1.332:
# empty, display "omitted" or "updates", which hide it alike), sealed in the signature.
REPLAYS = [
    ("text", REASONING, REASONING),
    ("omitted", "", ""),
    ("text then omitted", REASONING, ""),
    ("updates", "", ""),
]


@pytest.mark.parametrize(("name", "first", "again"), REPLAYS, ids=[r[0] for r in REPLAYS])
def test_the_resumed_prompt_starts_with_the_last_one(name: str, first: str, again: str) -> None:
    display = "updates" if name == "updates" else None
    before = _chat(_request(_turn_n(first), cch="0a1b2", display=display))
    after = _chat(_request(_resumed(_turn_n(first), again), cch="9f8e7", display=display))
    assert after["tools"] == before["tools"]
    assert after["chat_template_kwargs"] == before["chat_template_kwargs"]
    n = len(before["messages"])
    # byte for byte, as the engine's template reads them
    assert jsonutil.dumpb(after["messages"][:n]) == jsonutil.dumpb(before["messages"])
    assistant = next(m for m in after["messages"] if m["role"] == "assistant")
    assert assistant["reasoning_content"] == REASONING


def test_the_billing_header_is_not_in_the_prompt() -> None:
    """Its ``cch`` differs on every request: kept, it would change the prompt's first bytes."""
    chat = _chat(_request(_turn_n(REASONING), cch="0a1b2"))
    assert "cch=" not in jsonutil.dumps(chat["messages"])
