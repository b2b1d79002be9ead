"""The golden streams of ``tests/golden/streams`` and the driver that plays one through
the SSE decoder and the stream translator as the handler does (tests/unit/messages/test_stream.py
says what a case directory holds).

Shared by tests/unit/messages/test_stream.py and tests/unit/local/test_local_buffered.py.
"""

from __future__ import annotations

import pathlib
import re
from typing import Any

from gateway import errors
from gateway.local.normalise import ContentNormaliser
from gateway.messages.from_chat import tables
from gateway.messages.stream.translator import StreamTranslator
from gateway.text import jsonutil
from gateway.text.sse import SSEDecoder

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden" / "streams"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "upstream.sse").exists())
LOCAL_CASES = [case for case in CASES if case.startswith("local_")]


NORMALISER_KEYS = ("tool_names", "inline_thinking", "text_tool_calls")


def normaliser(meta: dict[str, Any]) -> ContentNormaliser | None:
    """The ContentNormaliser a case's meta asks for (as ``Call.normaliser`` builds it)."""
    if not any(key in meta for key in NORMALISER_KEYS):
        return None
    return ContentNormaliser(
        thinking=meta.get("inline_thinking", "auto"),
        tool_names=meta.get("tool_names", ()),
        text_calls=meta.get("text_tool_calls", True),
    )


def translator_for(meta: dict[str, Any]) -> StreamTranslator:
    return StreamTranslator(
        model=meta["model"],
        message_id=meta.get("message_id", "msg_golden01"),
        signing_key=meta.get("signing_key", "golden-key").encode(),
        stop_sequences=meta.get("stop_sequences", ()),
        match_stops=meta.get("match_stops", False),
        input_tokens=meta.get("input_tokens", 0),
        hosts=meta.get("hosts", ()),
        hide_thinking=meta.get("hide_thinking", False),
        show_thinking=tables.shows_thinking({"thinking": meta.get("thinking")}),
        normaliser=normaliser(meta),
    )


def run_case(
    upstream: bytes, meta: dict[str, Any], step: int = 0, reads: list[bytes] | None = None
) -> tuple[bytes, StreamTranslator]:
    """Drive decoder + translator as the handler does; ``step`` > 0 splits the body, or
    ``reads`` gives the reads it arrives in."""
    translator = translator_for(meta)
    decoder = SSEDecoder()
    out: list[bytes] = []
    if reads is None:
        reads = (
            [upstream[i : i + step] for i in range(0, len(upstream), step)] if step else [upstream]
        )
    for read in [*reads, None]:
        payloads = decoder.feed(read) if read is not None else decoder.flush()
        for payload in payloads:
            out.append(translator.feed(payload))
            if translator.done:
                break
        if translator.done:
            break
    if not translator.done:
        fail = meta.get("fail")
        if fail:
            err = getattr(errors, fail["error"])()
            out.append(translator.fail(err, reason=fail["reason"]))
        else:
            out.append(translator.eof())
    return b"".join(out), translator


# A tool_use block's id is the upstream's call id; a call the model wrote as text has none,
# so the gateway makes a random one: goldens hold it as this placeholder.
_GENERATED_ID = re.compile(rb'"id":"toolu_[0-9A-Za-z]{24}"')
GENERATED_ID = b'"id":"toolu_generatedbythegateway000"'


def mask_generated_ids(raw: bytes) -> bytes:
    return _GENERATED_ID.sub(GENERATED_ID, raw)


def load_case(case: str) -> tuple[bytes, dict[str, Any]]:
    d = GOLDEN / case
    return (d / "upstream.sse").read_bytes(), jsonutil.loads((d / "meta.json").read_bytes())
