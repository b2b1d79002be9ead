"""Pre-encoded Anthropic SSE fragments for the stream translator's hot path.

Every constant part of a frame is written once here; per event only the index
and the JSON string of the text are encoded (``jstr``). Frame shapes follow
https://docs.anthropic.com/en/docs/build-with-claude/streaming (and the Python SDK's
decoder, ``anthropic/_streaming.py``): ``event: <type>`` equal to the JSON ``type``,
one ``data:`` line of compact JSON, a blank line.
"""

from __future__ import annotations

import re

from gateway.text import jsonutil

DONE = b"[DONE]"
CBS = b'event: content_block_start\ndata: {"type":"content_block_start","index":'
TEXT_SHELL = b',"content_block":{"type":"text","text":""}}\n\n'
THINKING_SHELL = b',"content_block":{"type":"thinking","thinking":""}}\n\n'
CBD = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
TEXT_DELTA = b',"delta":{"type":"text_delta","text":'
THINKING_DELTA = b',"delta":{"type":"thinking_delta","thinking":'
SIGNATURE_DELTA = b',"delta":{"type":"signature_delta","signature":'
JSON_DELTA = b',"delta":{"type":"input_json_delta","partial_json":'
DELTA_END = b"}}\n\n"
CB_STOP = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}\n\n'
MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'

SURROGATE = re.compile("[\ud800-\udfff]")


def clean(text: str) -> str:
    # A lone UTF-16 surrogate (from a "\udXXX" escape) cannot be written as UTF-8.
    return SURROGATE.sub("\ufffd", text)


def jstr(text: str) -> bytes:
    try:
        return jsonutil.dumpb_str(text)
    except UnicodeEncodeError:
        return jsonutil.dumpb(clean(text))
