"""Anthropic request -> OpenAI chat request, driven by the golden pairs.

Each directory under tests/golden/requests/ holds ``anthropic.json`` (what the client
sent) and ``openai.json`` (exactly what the upstream must receive); base64 PDFs become
text first (gateway/messages/documents/pdf_text.py), as the handler does. Optional files:
``route.json`` (``kind``: the upstream kind, default vllm; ``keep_billing_header``;
``count_tokens``) and ``dropped.json`` (the names reported through ``on_drop``; absent
means none may be reported).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.messages.documents import pdf_text as documents
from gateway.messages.request.validate import validate_messages
from gateway.messages.to_chat.translate import to_chat
from gateway.ops.config import ModelRoute, UpstreamConfig
from gateway.text import jsonutil

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "requests"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "anthropic.json").is_file())
# No thinking asked for: a vLLM/SGLang/llama.cpp template is asked not to think.
THINKING_OFF = {"thinking": False, "enable_thinking": False}


def _route(kind: str = "vllm") -> ModelRoute:
    upstream = UpstreamConfig(name="u", base_url="http://127.0.0.1:9/v1", kind=kind)
    return ModelRoute(name="m", upstream=upstream, upstream_model="org/model")


def _load(case: str, name: str, default: Any = None) -> Any:
    path = GOLDEN / case / name
    return json.loads(path.read_text("utf-8")) if path.is_file() else default


def _translate(case: str) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    req = _load(case, "anthropic.json")
    opts = _load(case, "route.json", {})
    count = opts.get("count_tokens", False)
    pristine = copy.deepcopy(req)
    dropped: list[str] = []
    valid = validate_messages(req, count_tokens=count)
    where = documents.find_pdfs(valid["messages"])  # as the handler does, off its loop
    body = to_chat(
        documents.pdfs_to_text(valid, where) if where else valid,
        _route(opts.get("kind", "vllm")),
        keep_billing_header=opts.get("keep_billing_header", False),
        count_tokens=count,
        on_drop=dropped.append,
    )
    return body, dropped, {"request": req, "pristine": pristine}


def test_there_is_a_golden_case_per_rule() -> None:
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", CASES)
def test_golden_request(case: str) -> None:
    body, dropped, _ = _translate(case)
    # Compare what goes on the wire: the body must survive the one JSON encoder.
    assert jsonutil.loads(jsonutil.dumpb(body)) == _load(case, "openai.json")
    assert sorted(dropped) == sorted(_load(case, "dropped.json", []))


@pytest.mark.parametrize("case", CASES)
def test_translation_does_not_touch_the_request(case: str) -> None:
    _, _, seen = _translate(case)
    assert seen["request"] == seen["pristine"]


def test_on_drop_is_optional() -> None:
    req = {
        "model": "m",
        "max_tokens": 5,
        "metadata": {},
        "messages": [{"role": "user", "content": "x"}],
    }
    assert to_chat(validate_messages(req), _route()) == {
        "model": "org/model",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "x"}],
        "chat_template_kwargs": THINKING_OFF,
    }


def test_each_dropped_field_is_reported_once() -> None:
    """Top-level names come once each; tools are never reported: a client tool is
    translated (tests/unit/messages/test_client_tools.py) and a server tool refused before this."""
    tools = [
        {"type": "bash_20250124", "name": "bash", "cache_control": {"type": "ephemeral"}},
        {"type": "memory_20250818", "name": "memory"},
    ]
    req = {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "x"}],
        "tools": tools,
        "seed": 1,
        "metadata": {},
    }
    dropped: list[str] = []
    to_chat(validate_messages(req), _route(), on_drop=dropped.append)
    assert sorted(dropped) == ["metadata", "seed"]


def test_tool_reference_short_name_form() -> None:
    """The SDK sends tool_name; a bare `name` (as in some docs) is read the same way."""
    req = {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "s", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [{"type": "tool_reference", "name": "Read"}],
                    }
                ],
            },
        ],
    }
    body = to_chat(validate_messages(req), _route())
    assert body["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "t",
        "content": [{"type": "tool_reference", "name": "Read"}],
    }


def test_client_continue_final_message_true_turns_off_generation_prompt() -> None:
    """vLLM refuses continue_final_message together with its default add_generation_prompt."""
    req = {
        "model": "m",
        "max_tokens": 5,
        "continue_final_message": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    body = to_chat(validate_messages(req), _route())
    assert body["continue_final_message"] is True
    assert body["add_generation_prompt"] is False


def test_prefill_after_tool_turn_is_still_a_prefill() -> None:
    req = {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "text", "text": "A"}]},
            {"role": "user", "content": "y"},
            {"role": "assistant", "content": "B"},
        ],
    }
    body = to_chat(validate_messages(req), _route())
    assert (body["continue_final_message"], body["add_generation_prompt"]) == (True, False)
    assert body["messages"][-1] == {"role": "assistant", "content": "B"}


def test_system_turns_do_not_rewrite_earlier_turns() -> None:
    """A mid-conversation system turn only appends: the prefix of the previous request's
    upstream messages is unchanged (the upstream's prefix cache stays valid)."""
    first = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]
    later = [*first, {"role": "system", "content": "note"}, {"role": "user", "content": "q2"}]
    base = {"model": "m", "max_tokens": 5, "system": "S"}
    before = to_chat(
        validate_messages({**base, "messages": [*first, {"role": "user", "content": "q2"}]}),
        _route(),
    )["messages"]
    after = to_chat(validate_messages({**base, "messages": later}), _route())["messages"]
    assert after[: len(before) - 1] == before[:-1]
    assert after[len(before) - 1] == {"role": "system", "content": "note"}


def test_count_tokens_tolerates_unchecked_generation_fields() -> None:
    """count_tokens bodies are not expected to carry these; junk values must not crash."""
    req = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": "lots",
        "stream": "yes",
        "stop_sequences": 5,
        "metadata": [],
        "service_tier": 1,
    }
    dropped: list[str] = []
    body = to_chat(
        validate_messages(req, count_tokens=True),
        _route(),
        count_tokens=True,
        on_drop=dropped.append,
    )
    assert body == {
        "model": "org/model",
        "messages": [{"role": "user", "content": "x"}],
        "chat_template_kwargs": THINKING_OFF,
    }
    assert sorted(dropped) == ["max_tokens", "metadata", "service_tier", "stop_sequences", "stream"]


_CITE = {
    "type": "web_search_result_location",
    "url": "https://a.example/r",
    "title": "R",
    "encrypted_index": "eA==",
    "cited_text": "Quoted.",
}


@pytest.mark.parametrize(
    ("blocks", "content"),
    [
        # plain blocks: a newline between them, as before
        ([("One.", False), ("Two.", False)], "One.\nTwo."),
        # a cited passage split out of one run of text goes back as the model wrote it
        (
            [("According to R: ", False), ("Quoted.", True), (" That is all.", False)],
            "According to R: Quoted. That is all.",
        ),
        ([("Quoted.", True), ("Quoted.", True)], "Quoted.Quoted."),
        ([("A.", False), ("B.", False), ("Quoted.", True), ("C.", False)], "A.\nB.Quoted.C."),
    ],
)
def test_cited_text_blocks_are_joined_as_written(
    blocks: list[tuple[str, bool]], content: str
) -> None:
    req = {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": t, **({"citations": [_CITE]} if c else {})}
                    for t, c in blocks
                ],
            },
            {"role": "user", "content": "y"},
        ],
    }
    body = to_chat(validate_messages(req), _route())
    assert body["messages"][1] == {"role": "assistant", "content": content}


# --- deferred tools (defer_loading: true) ---------------------------------------------------

_PLAIN = {"name": "Read", "input_schema": {"type": "object"}}


def _deferred(name: str) -> dict[str, Any]:
    return {"name": name, "input_schema": {"type": "object"}, "defer_loading": True}


def _loading(*names: str, short: bool = False) -> list[dict[str, Any]]:
    """A ToolSearch turn whose result loads ``names`` (``short``: the ``name`` form)."""
    key = "name" if short else "tool_name"
    refs = [{"type": "tool_reference", key: n} for n in names]
    return [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": refs}],
        },
    ]


DEFERRAL = [
    ("nothing loaded", [], None, ["Read"]),
    ("one loaded", _loading("a"), None, ["Read", "a"]),
    ("short reference form", _loading("b", short=True), None, ["Read", "b"]),
    ("both loaded", _loading("b", "a"), None, ["Read", "a", "b"]),
    ("tool_choice names it", [], {"type": "tool", "name": "b"}, ["Read", "b"]),
    ("a reference to an unknown tool", _loading("zz"), None, ["Read"]),
]


@pytest.mark.parametrize(
    ("name", "history", "choice", "offered"), DEFERRAL, ids=[d[0] for d in DEFERRAL]
)
def test_a_deferred_tool_is_offered_once_a_reference_loads_it(
    name: str, history: list[Any], choice: Any, offered: list[str]
) -> None:
    req: dict[str, Any] = {
        "model": "m",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "q"}, *history, {"role": "user", "content": "go"}],
        "tools": [_PLAIN, _deferred("a"), _deferred("b")],
    }
    if choice is not None:
        req["tool_choice"] = choice
    body = to_chat(validate_messages(req), _route("llamacpp"))
    assert [t["function"]["name"] for t in body["tools"]] == offered
    assert all("defer_loading" not in t["function"] for t in body["tools"])


def test_only_deferred_tools_and_none_loaded_offers_no_tools() -> None:
    req = {
        "model": "m",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "q"}],
        "tools": [_deferred("a")],
    }
    assert "tools" not in to_chat(validate_messages(req), _route())
