"""The stream checker (tests/anthropic_stream_check.py) on web-search streams: it takes the
API's shape (server_tool_use shell + input_json_delta, a web_search_tool_result complete at
its start, ``usage.server_tool_use``) and refuses each way a gateway could get it wrong."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.anthropic_stream_check import check_stream

USE = {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search", "input": {}}
RESULT = {
    "type": "web_search_result",
    "url": "https://docs.example.org/a/1",
    "title": "A",
    "encrypted_content": "sealed",
    "page_age": "March 13, 2026",
}
OUTCOME = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01", "content": [RESULT]}
START = {
    "type": "message_start",
    "message": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 1},
    },
}
DELTA = {
    "type": "message_delta",
    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
    "usage": {
        "output_tokens": 5,
        "server_tool_use": {"web_search_requests": 1, "web_fetch_requests": 0},
    },
}


CITATION = {
    "type": "web_search_result_location",
    "url": RESULT["url"],
    "title": "A",
    "encrypted_index": "sealed-index",
    "cited_text": "See A.",
}


def _events(
    use: dict = USE,
    outcome: dict = OUTCOME,
    pieces: tuple[str, ...] = ('{"query": ', '"a"}'),
    extra: list[dict] | None = None,
    delta: dict = DELTA,
    citation: dict | None = None,
) -> list[dict]:
    return [
        START,
        {"type": "content_block_start", "index": 0, "content_block": use},
        *(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": p},
            }
            for p in pieces
        ),
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": outcome},
        *(extra or []),
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}},
        *(
            [
                {
                    "type": "content_block_delta",
                    "index": 2,
                    "delta": {"type": "citations_delta", "citation": citation},
                }
            ]
            if citation is not None
            else []
        ),
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "text_delta", "text": "See A."},
        },
        {"type": "content_block_stop", "index": 2},
        delta,
        {"type": "message_stop"},
    ]


def _raw(events: list[dict]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def test_the_apis_shape_passes() -> None:
    events = check_stream(_raw(_events()))
    assert events[5]["content_block"] == OUTCOME
    error = {
        **OUTCOME,
        "content": {"type": "web_search_tool_result_error", "error_code": "max_uses_exceeded"},
    }
    check_stream(_raw(_events(outcome=error)))
    check_stream(_raw(_events(outcome={**OUTCOME, "content": []})))  # no results
    check_stream(_raw(_events(citation=CITATION)))  # a quoted passage


@pytest.mark.parametrize(
    ("events", "why"),
    [
        (_events(use={**USE, "input": {"query": "a"}}), "not an empty shell"),
        (_events(use={**USE, "id": "toolu_01"}), "not an empty shell"),
        (_events(outcome={**OUTCOME, "tool_use_id": "srvtoolu_02"}), "no such call"),
        (_events(outcome={**OUTCOME, "content": [{**RESULT, "extra": 1}]}), "not an empty shell"),
        (
            _events(
                outcome={
                    **OUTCOME,
                    "content": [{k: v for k, v in RESULT.items() if k != "encrypted_content"}],
                }
            ),
            "not an empty shell",
        ),
        (
            _events(
                outcome={
                    **OUTCOME,
                    "content": {
                        "type": "web_search_tool_result_error",
                        "error_code": "search_failed",
                    },
                }
            ),
            "not an empty shell",
        ),
        (
            _events(
                extra=[
                    {
                        "type": "content_block_delta",
                        "index": 1,
                        "delta": {"type": "text_delta", "text": "x"},
                    }
                ]
            ),
            "on a web_search",
        ),
        (_events(pieces=('{"query": ',)), "partial_json joins"),
        (_events(citation={**CITATION, "cited_text": ""}), "citation"),
        (
            _events(citation={k: v for k, v in CITATION.items() if k != "encrypted_index"}),
            "citation",
        ),
        (_events(citation={**CITATION, "type": "char_location"}), "citation"),
        (
            _events(
                delta={
                    **DELTA,
                    "usage": {"output_tokens": 5, "server_tool_use": {"web_search_requests": "1"}},
                }
            ),
            "server_tool_use",
        ),
    ],
)
def test_a_wrong_stream_fails(events: list[Any], why: str) -> None:
    with pytest.raises(AssertionError, match=why):
        check_stream(_raw(events))
