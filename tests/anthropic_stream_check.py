"""Well-formedness checker for the Anthropic SSE streams the gateway emits.

``check_stream(raw)`` parses the raw response body and raises ``AssertionError`` (with the
offending event number) unless it is a stream every Anthropic client accepts, as this
gateway writes it (https://docs.anthropic.com/en/docs/build-with-claude/streaming, and the
SSE decoders of the SDKs: ``anthropic/_streaming.py``, ``@anthropic-ai/sdk/core/streaming``):

- frames are exactly ``event: NAME\\ndata: <one-line JSON>\\n\\n``; the body ends with
  ``\\n\\n``; the event name equals the JSON ``type``; keys in the documented order;
- ``message_start`` first, with ``id, type, role, model, content: [], stop_reason: null,
  stop_sequence: null, usage{input_tokens, output_tokens}``;
- blocks one at a time, indexes 0..n-1, each started as an empty shell (thinking without a
  ``signature`` key), deltas of the block's kind, closed exactly once; a thinking block ends
  with exactly one non-empty ``signature_delta``;
- web search (the ``web_search`` server tool): a ``server_tool_use`` block starts as
  ``{type, id: "srvtoolu_…", name, input: {}}`` and gets ``input_json_delta`` pieces, as a
  tool_use block does; a ``web_search_tool_result`` block is complete at its start
  (``{type, tool_use_id, content}``, content a list of ``{type: "web_search_result", url,
  title, encrypted_content, page_age}`` or one ``{type: "web_search_tool_result_error",
  error_code}``), its ``tool_use_id`` the id of a server_tool_use block before it, and has
  no deltas; ``message_delta.usage`` may end with ``server_tool_use: {web_search_requests}``;
  a text block may get ``citations_delta`` events whose ``citation`` is an object with the
  API's keys for its type (``web_search_result_location``: ``url``, ``title``,
  ``encrypted_index``, ``cited_text``; ``char_location``: ``cited_text``,
  ``document_index``, ``document_title``, ``start_char_index``, ``end_char_index``);
- web fetch likewise: ``server_tool_use`` named ``web_fetch``, then a
  ``web_fetch_tool_result`` complete at its start, content a ``{type: "web_fetch_result",
  url, retrieved_at, content: document}`` (its source ``text``/``text/plain`` or
  ``base64``/``application/pdf``) or a ``web_fetch_tool_result_error``; the usage's
  ``server_tool_use`` holds ``web_fetch_requests`` beside ``web_search_requests``;
- a completed stream: one ``message_delta`` after the last block stop, its usage carrying
  only ``output_tokens``; every tool block's ``partial_json`` pieces join to a JSON object;
- an error stream: no block left open, exactly one ``error`` event, then ``message_stop``;
- ``message_stop`` last; ``ping`` allowed anywhere.

It returns the parsed events (pings included) so callers can assert on content. No
dependency on golden files or on the gateway.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

__all__ = ["check_stream"]

_KEYS = {
    "message_start": ["type", "message"],
    "content_block_start": ["type", "index", "content_block"],
    "content_block_delta": ["type", "index", "delta"],
    "content_block_stop": ["type", "index"],
    "message_delta": ["type", "delta", "usage"],
    "message_stop": ["type"],
    "ping": ["type"],
}
_MESSAGE_KEYS = [
    "id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage",
]  # fmt: skip
_STOP_REASONS = {
    "end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal",
    "model_context_window_exceeded",
}  # fmt: skip
_DELTA_FOR = {
    "text": {"text_delta": "text", "citations_delta": "citation"},
    "thinking": {"thinking_delta": "thinking", "signature_delta": "signature"},
    "tool_use": {"input_json_delta": "partial_json"},
    "server_tool_use": {"input_json_delta": "partial_json"},
    "web_search_tool_result": {},  # complete at content_block_start
    "web_fetch_tool_result": {},  # complete at content_block_start
}
_RESULT_KEYS = ["type", "url", "title", "encrypted_content", "page_age"]
_CITATION_KEYS = {  # anthropic/types/citations_web_search_result_location.py (SDK 2.15)
    "web_search_result_location": {"type", "url", "title", "encrypted_index", "cited_text"},
    # anthropic/types/citation_char_location.py: a fetched document's (or a user document's)
    "char_location": {
        "type",
        "cited_text",
        "document_index",
        "document_title",
        "start_char_index",
        "end_char_index",
    },
}
WEB_FETCH_ERROR_CODES = frozenset(
    {
        "invalid_tool_input",
        "url_too_long",
        "url_not_allowed",
        "url_not_in_prior_context",
        "url_not_accessible",
        "unsupported_content_type",
        "too_many_requests",
        "max_uses_exceeded",
        "unavailable",
        "content_too_large",
    }
)  # anthropic/types/web_fetch_tool_result_error_code.py (SDK 2.15)
WEB_SEARCH_ERROR_CODES = frozenset(
    {
        "invalid_tool_input",
        "unavailable",
        "max_uses_exceeded",
        "too_many_requests",
        "query_too_long",
        "request_too_large",
    }
)  # anthropic/types/web_search_tool_result_error_code.py (SDK 2.15)


_DELTA_USAGE_KEYS = (
    ["output_tokens"],
    ["input_tokens", "output_tokens"],
    ["input_tokens", "cache_read_input_tokens", "output_tokens"],
)


def _fail(n: int, why: str) -> NoReturn:
    raise AssertionError(f"event {n}: {why}")


def _parse(raw: bytes) -> list[dict[str, Any]]:
    if not raw.endswith(b"\n\n"):
        raise AssertionError("stream does not end with a blank line")
    events = []
    for n, frame in enumerate(raw[:-2].split(b"\n\n")):
        lines = frame.split(b"\n")
        if (
            len(lines) != 2
            or not lines[0].startswith(b"event: ")
            or not lines[1].startswith(b"data: ")
        ):
            _fail(n, f"frame is not 'event: X\\ndata: JSON': {frame[:200]!r}")
        name = lines[0][7:].decode()
        try:
            data = json.loads(lines[1][6:])
        except ValueError as exc:
            _fail(n, f"data is not JSON ({exc})")
        dtype = data.get("type") if isinstance(data, dict) else None
        if dtype != name:
            _fail(n, f"event name {name!r} != data.type {dtype!r}")
        events.append(data)
    return events


def _check_shape(n: int, ev: dict[str, Any]) -> None:
    etype = ev["type"]
    if etype == "error":
        keys = [k for k in ev if k != "request_id"]
        if keys != ["type", "error"]:
            _fail(n, f"error keys {list(ev)}")
        err = ev["error"]
        if not (isinstance(err, dict) and isinstance(err.get("type"), str)
                and isinstance(err.get("message"), str)):  # fmt: skip
            _fail(n, f"error body {err!r}")
        return
    expected = _KEYS.get(etype)
    if expected is None:
        _fail(n, f"unknown event type {etype!r}")
    if list(ev) != expected:
        _fail(n, f"{etype} keys {list(ev)} != {expected}")
    if "index" in ev and (type(ev["index"]) is not int):
        _fail(n, "index is not an integer")


def _check_start(n: int, ev: dict[str, Any]) -> None:
    msg = ev["message"]
    if list(msg) != _MESSAGE_KEYS:
        _fail(n, f"message keys {list(msg)} != {_MESSAGE_KEYS}")
    if not (isinstance(msg["id"], str) and msg["id"].startswith("msg_")):
        _fail(n, f"message id {msg['id']!r}")
    if msg["type"] != "message" or msg["role"] != "assistant":
        _fail(n, "message type/role")
    if not isinstance(msg["model"], str) or not msg["model"]:
        _fail(n, "message model")
    if msg["content"] != [] or msg["stop_reason"] is not None or msg["stop_sequence"] is not None:
        _fail(n, "message_start must have content [] and null stop fields")
    usage = msg["usage"]
    if not (isinstance(usage, dict) and type(usage.get("input_tokens")) is int
            and type(usage.get("output_tokens")) is int):  # fmt: skip
        _fail(n, f"message_start usage {usage!r}")


def _check_shell(n: int, block: Any) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text":
        ok = block == {"type": "text", "text": ""} and list(block) == ["type", "text"]
    elif kind == "thinking":
        ok = block == {"type": "thinking", "thinking": ""} and list(block) == ["type", "thinking"]
    elif kind == "tool_use":
        ok = (list(block) == ["type", "id", "name", "input"] and block["input"] == {}
              and isinstance(block["id"], str) and block["id"] != ""
              and isinstance(block["name"], str) and block["name"] != "")  # fmt: skip
    elif kind == "server_tool_use":
        ok = (list(block) == ["type", "id", "name", "input"] and block["input"] == {}
              and isinstance(block["id"], str) and block["id"].startswith("srvtoolu_")
              and block["name"] in ("web_search", "web_fetch"))  # fmt: skip
    elif kind == "web_search_tool_result":
        ok = (list(block) == ["type", "tool_use_id", "content"]
              and _web_search_content_ok(block["content"]))  # fmt: skip
    elif kind == "web_fetch_tool_result":
        ok = (list(block) == ["type", "tool_use_id", "content"]
              and _web_fetch_content_ok(block["content"]))  # fmt: skip
    else:
        ok = False
    if not ok:
        _fail(n, f"content_block_start is not an empty shell: {block!r}")
    return kind


def _web_search_content_ok(content: Any) -> bool:
    if isinstance(content, dict):
        return (list(content) == ["type", "error_code"]
                and content["type"] == "web_search_tool_result_error"
                and content["error_code"] in WEB_SEARCH_ERROR_CODES)  # fmt: skip
    return isinstance(content, list) and all(
        isinstance(r, dict)
        and list(r) == _RESULT_KEYS
        and r["type"] == "web_search_result"
        and all(isinstance(r[k], str) and r[k] for k in ("url", "title", "encrypted_content"))
        and (r["page_age"] is None or isinstance(r["page_age"], str))
        for r in content
    )


def _web_fetch_content_ok(content: Any) -> bool:
    """A ``web_fetch_result`` {url, retrieved_at, content: document} or an error."""
    if not isinstance(content, dict):
        return False
    if content.get("type") == "web_fetch_tool_result_error":
        return (list(content) == ["type", "error_code"]
                and content["error_code"] in WEB_FETCH_ERROR_CODES)  # fmt: skip
    if list(content) != ["type", "url", "retrieved_at", "content"]:
        return False
    doc = content["content"]
    source = doc.get("source") if isinstance(doc, dict) else None
    return (
        content["type"] == "web_fetch_result"
        and isinstance(content["url"], str)
        and isinstance(content["retrieved_at"], str)
        and doc.get("type") == "document"
        and isinstance(source, dict)
        and list(source) == ["type", "media_type", "data"]
        and (source["type"], source["media_type"])
        in (("text", "text/plain"), ("base64", "application/pdf"))
        and isinstance(source["data"], str)
    )


def check_stream(raw: bytes) -> list[dict[str, Any]]:
    events = _parse(raw)
    real = [(n, ev) for n, ev in enumerate(events) if ev["type"] != "ping"]
    if not real or real[0][1]["type"] != "message_start":
        raise AssertionError("the first event (pings aside) is not message_start")
    if real[-1][1]["type"] != "message_stop":
        raise AssertionError("the last event is not message_stop")
    next_index = 0
    open_kind: str | None = None
    open_deltas: list[dict[str, Any]] = []
    tool_json: list[str] = []
    server_ids: set[str] = set()
    outcome: str | None = None  # "message_delta" or "error"
    for pos, (n, ev) in enumerate(real):
        _check_shape(n, ev)
        etype = ev["type"]
        if pos == 0:
            _check_start(n, ev)
            continue
        if etype == "message_start":
            _fail(n, "second message_start")
        if outcome is not None and etype != "message_stop":
            _fail(n, f"{etype} after {outcome}")
        if etype == "content_block_start":
            if open_kind is not None:
                _fail(n, "block started while another is open")
            if ev["index"] != next_index:
                _fail(n, f"block index {ev['index']} != {next_index}")
            open_kind = _check_shell(n, ev["content_block"])
            open_deltas = []
            block = ev["content_block"]
            if open_kind == "server_tool_use":
                server_ids.add(block["id"])
            if (
                open_kind in ("web_search_tool_result", "web_fetch_tool_result")
                and block["tool_use_id"] not in server_ids
            ):
                _fail(n, f"{open_kind} for {block['tool_use_id']!r}, no such call")
        elif etype == "content_block_delta":
            if open_kind is None or ev["index"] != next_index:
                _fail(n, f"delta for index {ev['index']} which is not the open block")
            delta = ev["delta"]
            fields = _DELTA_FOR[open_kind]
            dtype = delta.get("type") if isinstance(delta, dict) else None
            if dtype not in fields or list(delta) != ["type", fields[dtype]]:
                _fail(n, f"delta {delta!r} on a {open_kind} block")
            if dtype == "citations_delta":
                citation = delta["citation"]
                kind = citation.get("type") if isinstance(citation, dict) else None
                if (
                    kind not in _CITATION_KEYS
                    or set(citation) != _CITATION_KEYS[kind]
                    or not all(
                        (isinstance(citation[k], str) and citation[k])
                        or (
                            kind == "char_location"
                            and k != "cited_text"
                            and (type(citation[k]) is int or citation[k] is None)
                        )
                        for k in citation
                    )
                ):
                    _fail(n, f"citation {citation!r}")
            elif not isinstance(delta[fields[dtype]], str):
                _fail(n, "delta value is not a string")
            if open_deltas and open_deltas[-1]["type"] == "signature_delta":
                _fail(n, "delta after signature_delta")
            open_deltas.append(delta)
        elif etype == "content_block_stop":
            if open_kind is None or ev["index"] != next_index:
                _fail(n, f"stop for index {ev['index']} which is not the open block")
            if open_kind == "thinking":
                sigs = [d for d in open_deltas if d["type"] == "signature_delta"]
                if len(sigs) != 1 or not sigs[0]["signature"]:
                    _fail(n, "thinking block without exactly one non-empty signature_delta")
            if open_kind in ("tool_use", "server_tool_use"):
                tool_json.append("".join(d["partial_json"] for d in open_deltas))
            open_kind = None
            next_index += 1
        elif etype in ("message_delta", "error"):
            if open_kind is not None:
                _fail(n, f"{etype} while block {next_index} is open")
            if etype == "message_delta":
                _check_message_delta(n, ev)
            outcome = etype
        elif etype == "message_stop":
            if pos != len(real) - 1:
                _fail(n, "message_stop is not last")
            if outcome is None:
                _fail(n, "message_stop without message_delta or error")
    if outcome == "message_delta":
        for k, text in enumerate(tool_json):
            try:
                value = json.loads(text)
            except ValueError:
                value = None
            if not isinstance(value, dict):
                raise AssertionError(f"tool block {k}: partial_json joins to {text[:200]!r}")
    return events


def _check_message_delta(n: int, ev: dict[str, Any]) -> None:
    delta, usage = ev["delta"], ev["usage"]
    if not isinstance(delta, dict) or list(delta) != ["stop_reason", "stop_sequence"]:
        _fail(n, f"message_delta.delta {delta!r}")
    if delta["stop_reason"] not in _STOP_REASONS:
        _fail(n, f"stop_reason {delta['stop_reason']!r}")
    if (delta["stop_reason"] == "stop_sequence") != isinstance(delta["stop_sequence"], str):
        _fail(n, "stop_sequence must be set exactly when stop_reason is stop_sequence")
    # output_tokens always; the input side only as the upstream reported it, in the
    # buffered reply's order (gateway decision: "Usage" in shared/protocol.md)
    if not isinstance(usage, dict):
        _fail(n, f"message_delta.usage {usage!r}")
    usage = dict(usage)
    server = usage.pop("server_tool_use", None)
    if server is not None and not (
            isinstance(server, dict) and "web_search_requests" in server
            and "web_fetch_requests" in server
            and all(type(v) is int and v >= 0 for v in server.values())):  # fmt: skip
        _fail(n, f"message_delta.usage.server_tool_use {server!r}")
    if list(usage) not in _DELTA_USAGE_KEYS:
        _fail(n, f"message_delta.usage keys {list(usage)!r}")
    for key, value in usage.items():
        if type(value) is not int or value < 0:
            _fail(n, key)
