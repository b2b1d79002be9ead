"""ResponsesIndexer: llama.cpp's Responses events (as its server sends them, no indices)
given the output_index / content_index / sequence_number the OpenAI SDKs key on."""

from __future__ import annotations

from typing import Any

from gateway.openai.responses_index import ResponsesIndexer

# what llama.cpp sent on /v1/responses for the demo (reasoning item, then the message)
LLAMA = [
    {"type": "response.created", "response": {"id": "r", "status": "in_progress"}},
    {"type": "response.output_item.added", "item": {"id": "rs_1", "type": "reasoning"}},
    {"type": "response.reasoning_text.delta", "delta": "x", "item_id": "rs_1"},
    {"type": "response.output_item.added", "item": {"id": "msg_1", "type": "message"}},
    {"type": "response.content_part.added", "item_id": "msg_1", "part": {"type": "output_text"}},
    {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "Hi"},
    {"type": "response.output_text.done", "item_id": "msg_1", "text": "Hi"},
    {"type": "response.output_item.done", "item": {"id": "msg_1", "type": "message"}},
    {"type": "response.completed", "response": {"id": "r", "status": "completed"}},
]
# (sequence_number, output_index, content_index) each event gets; None: not set
WANT: list[tuple[int, int | None, int | None]] = [
    (0, None, None),
    (1, 0, None),
    (2, 0, 0),
    (3, 1, None),
    (4, 1, 0),
    (5, 1, 0),
    (6, 1, 0),
    (7, 1, None),
    (8, None, None),
]


def test_llama_events_get_their_indices() -> None:
    index = ResponsesIndexer()
    got = [index(dict(e)) for e in LLAMA]
    assert [
        (e["sequence_number"], e.get("output_index"), e.get("content_index")) for e in got
    ] == WANT


def test_indices_the_upstream_sent_are_kept() -> None:
    index = ResponsesIndexer()
    event: dict[str, Any] = {
        "type": "response.output_item.added",
        "output_index": 5,
        "sequence_number": 9,
        "item": {"id": "a"},
    }
    assert index(event) == {**event}
    assert index({"type": "other"}) == {"type": "other"}
