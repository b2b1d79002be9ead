"""aggregate(): the translator's events folded into one Message, as the SDKs fold them."""

from __future__ import annotations

import json
import pathlib

import anthropic.types
import pytest

from gateway.messages.from_chat.aggregate import aggregate

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "golden" / "streams"
CASES = sorted(
    p.name
    for p in GOLDEN.iterdir()
    if (p / "expected.sse").exists() and b"event: error" not in (p / "expected.sse").read_bytes()
)


def _events(raw: bytes) -> list[dict]:
    return [json.loads(f.split(b"\ndata: ", 1)[1]) for f in raw.split(b"\n\n") if b"\ndata: " in f]


@pytest.mark.parametrize("case", CASES)
def test_golden_streams_fold_into_a_valid_message(case: str) -> None:
    raw = (GOLDEN / case / "expected.sse").read_bytes()
    events = _events(raw)
    message = aggregate(raw)
    anthropic.types.Message.model_validate(message, strict=True)  # the SDK's own model
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert len(message["content"]) == max(1, len(starts))
    for i, start in enumerate(starts):
        block = message["content"][i]
        assert block["type"] == start["content_block"]["type"]
        deltas = [
            e["delta"] for e in events if e["type"] == "content_block_delta" and e["index"] == i
        ]
        if block["type"] == "text":
            assert block["text"] == "".join(d["text"] for d in deltas)
        elif block["type"] == "thinking":
            assert block["thinking"] == "".join(d.get("thinking", "") for d in deltas)
            assert block["signature"] == deltas[-1]["signature"]
        elif block["type"] == "tool_use":
            assert block["input"] == json.loads("".join(d["partial_json"] for d in deltas))
    final = next(e for e in events if e["type"] == "message_delta")
    assert message["stop_reason"] == final["delta"]["stop_reason"]
    start = events[0]["message"]["usage"]
    # the SDKs' fold: message_start's usage, then each field message_delta carries
    assert message["usage"] == {"input_tokens": start["input_tokens"], **final["usage"]}


def test_stream_without_blocks_gets_one_empty_text_block() -> None:
    raw = (
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1",'
        b'"type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,'
        b'"stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":0}}}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":'
        b'"end_turn","stop_sequence":null},"usage":{"output_tokens":0}}\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    message = aggregate(raw)
    assert message["content"] == [{"type": "text", "text": ""}]
    assert message["usage"] == {"input_tokens": 3, "output_tokens": 0}
    assert message["stop_reason"] == "end_turn"
