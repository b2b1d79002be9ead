"""``thinking.display: "updates"`` (Claude Code 2.1.332 asks it on every request).

The API then hides the reasoning and returns only short progress notes; the gateway shows
the note a local engine's reasoning ends on (its last paragraph, bounded), seals the whole
reasoning in the signature, and puts that reasoning back when the note is replayed, so the
engine sees what it wrote. The goldens ``responses/vllm-reasoning-display-updates`` and
``streams/vllm_reasoning_display_updates`` hold the reply shapes.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.messages.from_chat import signatures, tables
from gateway.messages.from_chat.message import from_chat
from gateway.messages.from_chat.signatures import restorable, restore_reasoning, seal
from gateway.messages.from_chat.updates import UPDATE_CHARS, is_update_of, progress_update

KEY = b"k" * 32
LONG = "word " * 400

NOTES = [
    ("one line", "Read the file.", "Read the file."),
    ("last paragraph", "Plan it.\n\nThen call Read on a.py.\n", "Then call Read on a.py."),
    ("blank paragraphs at the end", "First.\n\nSecond one.\n\n\n  \n", "Second one."),
    ("whitespace folded", "a\n b\t c", "a b c"),
    ("blank", " \n\n ", ""),
    ("empty", "", ""),
]


@pytest.mark.parametrize(("name", "reasoning", "note"), NOTES, ids=[n[0] for n in NOTES])
def test_the_note_is_the_last_paragraph(name: str, reasoning: str, note: str) -> None:
    assert progress_update(reasoning) == note


def test_a_long_paragraph_keeps_its_end_within_the_bound() -> None:
    note = progress_update(LONG + "so I call Bash now.")
    assert len(note) <= UPDATE_CHARS
    assert note.startswith("…word") and note.endswith("so I call Bash now.")


def test_a_huge_block_is_read_only_at_its_end() -> None:
    # the scan is bounded: a megabyte of reasoning with no paragraph break gives a note
    note = progress_update("x" * 1_000_000 + "\n\nDone.")
    assert note == "Done."
    assert len(progress_update("y" * 1_000_000)) <= UPDATE_CHARS


def test_only_updates_shows_notes() -> None:
    assert tables.shows_updates({"thinking": {"type": "adaptive", "display": "updates"}})
    for display in ("omitted", "summarized", None):
        assert not tables.shows_updates({"thinking": {"type": "adaptive", "display": display}})
    assert not tables.shows_updates({})
    # the reasoning itself stays hidden for updates, as for omitted
    assert tables.hides_thinking({"thinking": {"type": "adaptive", "display": "updates"}})


def _completion(message: dict[str, Any]) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


REASONING = "The user wants the date.\n\nI will run date in Bash."
NOTE = progress_update(REASONING)


def test_buffered_reply_shows_the_note_and_seals_the_reasoning() -> None:
    out = from_chat(
        _completion({"content": "ok", "reasoning_content": REASONING}),
        model="m",
        signing_key=KEY,
        hide_thinking=True,
        show_updates=True,
    )
    block = out["content"][0]
    assert block["thinking"] == "I will run date in Bash."
    assert signatures.open_signature(KEY, block["signature"]) == REASONING


def _history(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": list(blocks)},
            {"role": "user", "content": "go on"},
        ]
    }


def test_a_replayed_note_gets_its_reasoning_back() -> None:
    req = _history({"type": "thinking", "thinking": NOTE, "signature": seal(KEY, REASONING)})
    restore_reasoning(req, KEY, blocks=restorable(req, notes=True))
    assert req["messages"][1]["content"][0]["thinking"] == REASONING


KEPT = [
    ("another text", {"type": "thinking", "thinking": "edited", "signature": seal(KEY, REASONING)}),
    (
        "not our signature",
        {"type": "thinking", "thinking": "Plan.", "signature": seal(b"other", "Plan.")},
    ),
    ("not base64", {"type": "thinking", "thinking": "Plan.", "signature": "??"}),
    (
        "longer than a note",
        {"type": "thinking", "thinking": LONG, "signature": seal(KEY, LONG)},
    ),
]


@pytest.mark.parametrize("block", [k[1] for k in KEPT], ids=[k[0] for k in KEPT])
def test_other_texts_are_kept(block: dict[str, Any]) -> None:
    req = _history(block)
    before = copy.deepcopy(req)
    restore_reasoning(req, KEY, blocks=restorable(req, notes=True))
    assert req == before


def test_without_updates_a_note_is_text() -> None:
    req = _history({"type": "thinking", "thinking": NOTE, "signature": seal(KEY, REASONING)})
    assert restorable(req) == []
    assert is_update_of(progress_update(REASONING), REASONING)
    assert not is_update_of("", "")
