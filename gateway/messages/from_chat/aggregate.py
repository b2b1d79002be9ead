"""Anthropic stream events -> one buffered Message, the way the SDKs' accumulators fold them.

Used when a buffered request has to be served from an upstream stream: the gateway
matches stop sequences itself for upstreams that cannot report which one matched
(``tables.LOCAL_STOP_KINDS``), and it can only stop a generation it is streaming.
The input is the translator's own output, so the event shapes are known: blocks
open with an empty shell, ``text_delta``/``thinking_delta`` append, one
``signature_delta`` sets the signature, ``input_json_delta`` pieces join to the
tool input's JSON, ``message_delta`` sets the stop reason and the usage fields it carries.
"""

from __future__ import annotations

from typing import Any

from gateway.text import jsonutil

_APPEND = {"text_delta": "text", "thinking_delta": "thinking"}


def aggregate(sse: bytes) -> dict[str, Any]:
    """Fold complete Anthropic SSE frames (without an error event) into a Message."""
    message: dict[str, Any] = {}
    content: list[dict[str, Any]] = []
    partial: dict[int, list[str]] = {}
    for frame in sse.split(b"\n\n"):
        at = frame.find(b"\ndata: ")
        if at < 0:
            continue
        event = jsonutil.loads_upstream(frame[at + 7 :])
        kind = event["type"]
        if kind == "message_start":
            message = event["message"]
        elif kind == "content_block_start":
            content.append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            block, delta = content[event["index"]], event["delta"]
            dtype = delta["type"]
            if dtype in _APPEND:
                field = _APPEND[dtype]
                block[field] += delta[field]
            elif dtype == "citations_delta":
                block.setdefault("citations", []).append(delta["citation"])
            elif dtype == "signature_delta":
                block["signature"] = delta["signature"]
            elif dtype == "input_json_delta":
                partial.setdefault(event["index"], []).append(delta["partial_json"])
        elif kind == "message_delta":
            message["stop_reason"] = event["delta"]["stop_reason"]
            message["stop_sequence"] = event["delta"]["stop_sequence"]
            message["usage"].update(event["usage"])  # present fields overwrite, as the SDKs do
    for index, pieces in partial.items():
        content[index]["input"] = jsonutil.loads_upstream("".join(pieces) or "{}")
    if not content:
        content.append({"type": "text", "text": ""})  # a Message never has empty content
    return {
        "id": message["id"],
        "type": "message",
        "role": "assistant",
        "model": message["model"],
        "content": content,
        "stop_reason": message.get("stop_reason"),
        "stop_sequence": message.get("stop_sequence"),
        "usage": _usage(message["usage"]),
    }


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    """The buffered reply's usage fields, in its order (``tables.anthropic_usage``), and
    the server tools' counts where the reply ran them (web search, gateway/tools/)."""
    out = {"input_tokens": usage["input_tokens"]}
    if "cache_read_input_tokens" in usage:
        out["cache_read_input_tokens"] = usage["cache_read_input_tokens"]
    out["output_tokens"] = usage["output_tokens"]
    if "server_tool_use" in usage:
        out["server_tool_use"] = usage["server_tool_use"]
    return out
