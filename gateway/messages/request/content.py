"""Validation of message turns and content blocks (part of :mod:`.validate`).

Protocol facts relied on (the Messages API reference, https://docs.anthropic.com/en/api/messages,
and the Python SDK 2.14's request types, ``anthropic/types/message_create_params.py``):

- ``messages`` is a non-empty list of ``{role, content}`` turns; ``content`` is a string
  or a non-empty list of typed blocks. Roles are ``user``, ``assistant`` and ``system``.
- A ``system`` turn (sent by current SDKs and Claude Code) holds text only; so does the
  top-level ``system`` field (a string or a list of text blocks). A system turn may carry
  ``output_config`` (``effort`` only) and ``clear_at``; one whose ``output_config`` has a
  field set may have no content at all (a per-turn control entry, :mod:`.turn_control`).
  Empty content is refused everywhere else (``messages.N.content``).
- User blocks: ``text``, ``image``, ``document``, ``search_result``, ``tool_result``.
  Assistant blocks: ``text``, ``tool_use``, ``thinking`` (signature optional).
  ``redacted_thinking`` is encrypted Anthropic reasoning that no other model can read, and
  server-tool blocks were never produced by this gateway, so both are refused.
- ``tool_result`` names its call in ``tool_use_id`` (older clients: ``id``); its content is
  a string or a list of text / image / document / search_result / tool_reference blocks.
  The SDK names a reference's tool ``tool_name``; the short ``name`` is accepted too.
- Base64 images are jpeg, png, gif or webp; a URL image passes through. A base64 PDF
  document is accepted here and becomes text in :mod:`.documents` (the handler runs it);
  a URL document is refused (the gateway never fetches a URL on a client's behalf), and
  so is a file source (no Files API here).

The primitives here raise :class:`gateway.errors.InvalidRequest` whose path names the
field (``messages.2.content.0.source.data``). Paths are built per block as short
f-strings; nothing is copied.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from gateway.errors import InvalidRequest, echo
from gateway.messages.to_chat import turn_control
from gateway.ops.metrics import WEB_FETCH_ERROR_CODES, WEB_SEARCH_ERROR_CODES

__all__ = [
    "EFFORTS",
    "MAX_DOMAINS",
    "MAX_INT",
    "check_depth",
    "check_domain_filters",
    "check_int",
    "check_list",
    "check_messages",
    "check_obj",
    "check_str",
    "check_system",
    "fail",
    "is_int",
    "is_number",
]

EFFORTS = ("minimal", "low", "medium", "high", "xhigh", "max")
_IMAGE_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
MAX_DEPTH = 64
# The largest integer a bounded field takes (token counts, top_k, display sizes): the
# largest every upstream reads as an integer (llama.cpp's n_predict is an int32), far
# above any model's limit; a bigger one would be forwarded as digits no upstream parses.
MAX_INT = 2**31 - 1

_REFUSED_IN_ASSISTANT = {
    "redacted_thinking": "redacted_thinking blocks cannot be replayed to this model",
    "image": "image blocks are only allowed in user turns",
    "document": "document blocks are only allowed in user turns",
    "tool_result": "tool_result blocks are only allowed in user turns",
    "search_result": "search_result blocks are only allowed in user turns",
}


def fail(path: str, why: str, *, details: Mapping[str, Any] | None = None) -> InvalidRequest:
    return InvalidRequest(path, why, details=details)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(value: Any, path: str, *, minimum: int, maximum: int = MAX_INT) -> None:
    if not is_int(value):
        raise fail(path, "Input should be a valid integer")
    if value < minimum:
        raise fail(path, f"Input should be greater than or equal to {minimum}")
    if value > maximum:
        raise fail(path, f"Input should be less than or equal to {maximum}")


def check_str(obj: Mapping[str, Any], key: str, path: str, *, required: bool = True) -> None:
    value = obj.get(key)
    if value is None:
        if required:
            raise fail(f"{path}.{key}", "Field required")
        return
    if not isinstance(value, str):
        raise fail(f"{path}.{key}", "Input should be a valid string")


def check_obj(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise fail(path, "Input should be a valid dictionary")
    return value


def check_list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise fail(path, "Input should be a valid list")
    return value


def check_depth(value: Any, path: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH (the upstream body nests it further)."""
    # Level by level: one list per level, no per-node tuples (schemas run to ~65 KB).
    level = [value]
    depth = 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            raise fail(path, f"nesting deeper than {MAX_DEPTH} levels")
        below: list[Any] = []
        for item in level:
            for child in item.values() if isinstance(item, dict) else item:
                if isinstance(child, (dict, list)):
                    below.append(child)
        level = below


def _block_type(block: Any, path: str) -> str:
    check_obj(block, path)
    kind = block.get("type")
    if kind is None:
        raise fail(f"{path}.type", "Field required")
    if not isinstance(kind, str):
        raise fail(f"{path}.type", "Input should be a valid string")
    return kind


# --- content blocks -----------------------------------------------------------------


def _text(block: Mapping[str, Any], path: str) -> None:
    check_str(block, "text", path)


def _image(block: Mapping[str, Any], path: str) -> None:
    source = check_obj(block.get("source"), f"{path}.source")
    path = f"{path}.source"
    kind = source.get("type")
    if kind == "base64":
        media = source.get("media_type")
        if not isinstance(media, str) or media not in _IMAGE_MEDIA_TYPES:
            raise fail(
                f"{path}.media_type",
                "Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp'",
            )
        data = source.get("data")
        if not isinstance(data, str) or not data:
            raise fail(f"{path}.data", "image source needs base64 data")
    elif kind == "url":
        url = source.get("url")
        if not isinstance(url, str) or not url:
            raise fail(f"{path}.url", "image source needs a url")
    elif kind == "file":
        raise fail(f"{path}.type", "file image sources are not supported by this model")
    elif kind is None:
        raise fail(f"{path}.type", "Field required")
    else:
        raise fail(f"{path}.type", "Input should be 'base64' or 'url'")


def _document(block: Mapping[str, Any], path: str) -> None:
    check_str(block, "title", path, required=False)
    check_str(block, "context", path, required=False)
    source = check_obj(block.get("source"), f"{path}.source")
    path = f"{path}.source"
    kind = source.get("type")
    if kind == "text":
        check_str(source, "data", path)
    elif kind == "content":
        content = source.get("content")
        if isinstance(content, str):
            return
        for j, item in enumerate(check_list(content, f"{path}.content")):
            item_path = f"{path}.content.{j}"
            item_kind = _block_type(item, item_path)
            if item_kind == "text":
                _text(item, item_path)
            elif item_kind == "image":
                _image(item, item_path)
            else:
                raise fail(f"{item_path}.type", "document content holds only text and images")
    elif kind == "base64":
        if source.get("media_type") != "application/pdf":
            raise fail(f"{path}.media_type", "Input should be 'application/pdf'")
        data = source.get("data")
        if not isinstance(data, str) or not data:
            raise fail(f"{path}.data", "PDF source needs base64 data")
    elif kind == "url":
        raise fail(
            f"{path}.type",
            "URL documents are not supported: the gateway never "
            "fetches a URL on a client's behalf; send the PDF as "
            "base64 data",
        )
    elif kind == "file":
        raise fail(
            f"{path}.type",
            "file document sources are not supported (this gateway "
            "has no Files API); send the document as base64 or text",
        )
    elif kind is None:
        raise fail(f"{path}.type", "Field required")
    else:
        raise fail(f"{path}.type", "Input should be 'base64', 'text' or 'content'")


def _search_result(block: Mapping[str, Any], path: str) -> None:
    check_str(block, "source", path)
    check_str(block, "title", path)
    for j, item in enumerate(check_list(block.get("content"), f"{path}.content")):
        item_path = f"{path}.content.{j}"
        if _block_type(item, item_path) != "text":
            raise fail(f"{item_path}.type", "search_result content holds only text blocks")
        _text(item, item_path)


def _tool_reference(block: Mapping[str, Any], path: str) -> None:
    # The SDK spells it tool_name; the short form `name` is accepted too.
    name = block.get("tool_name", block.get("name"))
    if name is None:
        raise fail(f"{path}.tool_name", "Field required")
    if not isinstance(name, str) or not name:
        raise fail(f"{path}.tool_name", "Input should be a non-empty string")


_TOOL_RESULT_CONTENT: Mapping[str, Callable[[Mapping[str, Any], str], None]] = {
    "text": _text,
    "image": _image,
    "document": _document,
    "search_result": _search_result,
    "tool_reference": _tool_reference,
}


def _tool_result(block: Mapping[str, Any], path: str) -> None:
    if block.get("tool_use_id") is None and block.get("id") is None:
        raise fail(f"{path}.tool_use_id", "Field required")
    key = "tool_use_id" if block.get("tool_use_id") is not None else "id"
    if not isinstance(block[key], str) or not block[key]:
        raise fail(f"{path}.{key}", "Input should be a non-empty string")
    if block.get("is_error") is not None and not isinstance(block["is_error"], bool):
        raise fail(f"{path}.is_error", "Input should be a valid boolean")
    content = block.get("content")
    if content is None or isinstance(content, str):
        return
    for j, item in enumerate(check_list(content, f"{path}.content")):
        item_path = f"{path}.content.{j}"
        check = _TOOL_RESULT_CONTENT.get(_block_type(item, item_path))
        if check is None:
            raise fail(
                f"{item_path}.type",
                f"'{echo(item['type'])}' blocks are not allowed in "
                "tool_result content (text, image, document, search_result, "
                "tool_reference)",
            )
        check(item, item_path)


def _tool_use(block: Mapping[str, Any], path: str) -> None:
    for key in ("id", "name"):
        value = block.get(key)
        if value is None:
            raise fail(f"{path}.{key}", "Field required")
        if not isinstance(value, str) or not value:
            raise fail(f"{path}.{key}", "Input should be a non-empty string")
    if "input" not in block:
        raise fail(f"{path}.input", "Field required")
    check_obj(block["input"], f"{path}.input")
    check_depth(block["input"], f"{path}.input")


def _server_tool_use(block: Mapping[str, Any], path: str) -> None:
    """A replayed ``server_tool_use`` block: only web search and web fetch run here."""
    _tool_use(block, path)
    if block["name"] not in ("web_search", "web_fetch"):
        raise fail(
            f"{path}.name",
            f"'{echo(block['name'])}' is an Anthropic server tool "
            "this gateway does not run; only web_search and web_fetch blocks can be replayed",
        )
    if not _SERVER_ID.fullmatch(block["id"]):
        raise fail(f"{path}.id", f"String should match pattern '{_SERVER_ID.pattern}'")


_SERVER_ID = re.compile(r"^srvtoolu_[a-zA-Z0-9_]+$")
_RESULT_BLOCK_FIELDS = frozenset({"type", "tool_use_id", "content", "cache_control", "caller"})


def _web_search_tool_result(block: Mapping[str, Any], path: str) -> None:
    """A replayed ``web_search_tool_result`` block."""
    for key in block:
        if key not in _RESULT_BLOCK_FIELDS:
            raise fail(f"{path}.{echo(key)}", "Extra inputs are not permitted")
    if not isinstance(block.get("tool_use_id"), str):
        raise fail(f"{path}.tool_use_id", "Field required")
    content = block.get("content")
    if isinstance(content, Mapping):
        if content.get("type") != "web_search_tool_result_error":
            raise fail(f"{path}.content.type", "Input should be 'web_search_tool_result_error'")
        _check_code(content.get("error_code"), WEB_SEARCH_ERROR_CODES, f"{path}.content")
        return
    for j, item in enumerate(check_list(content, f"{path}.content")):
        where = f"{path}.content.{j}"
        check_obj(item, where)
        if item.get("type") != "web_search_result":
            raise fail(f"{where}.type", "Input should be 'web_search_result'")
        for key in ("url", "title", "encrypted_content"):
            if not isinstance(item.get(key), str):
                raise fail(f"{where}.{key}", "Field required")
        if item.get("page_age") is not None and not isinstance(item["page_age"], str):
            raise fail(f"{where}.page_age", "Input should be a valid string")


def _web_fetch_tool_result(block: Mapping[str, Any], path: str) -> None:
    """A replayed ``web_fetch_tool_result`` block (its ``type`` and place checked by the
    caller)."""
    for key in block:
        if key not in ("type", "tool_use_id", "content", "cache_control", "caller"):
            raise fail(f"{path}.{echo(key)}", "Extra inputs are not permitted")
    if not isinstance(block.get("tool_use_id"), str):
        raise fail(f"{path}.tool_use_id", "Field required")
    where = f"{path}.content"
    content = check_obj(block.get("content"), where)
    kind = content.get("type")
    if kind == "web_fetch_tool_result_error":
        for key in content:
            if key not in ("type", "error_code"):
                raise fail(f"{where}.{echo(key)}", "Extra inputs are not permitted")
        _check_code(content.get("error_code"), WEB_FETCH_ERROR_CODES, where)
        return
    if kind != "web_fetch_result":
        raise fail(
            f"{where}.type", "Input should be 'web_fetch_result' or 'web_fetch_tool_result_error'"
        )
    for key in content:
        if key not in ("type", "url", "retrieved_at", "content"):
            raise fail(f"{where}.{echo(key)}", "Extra inputs are not permitted")
    if not isinstance(content.get("url"), str):
        raise fail(f"{where}.url", "Field required")
    if content.get("retrieved_at") is not None and not isinstance(content["retrieved_at"], str):
        raise fail(f"{where}.retrieved_at", "Input should be a valid string")
    _check_document(content.get("content"), f"{where}.content")


def _check_document(doc: Any, path: str) -> None:
    if doc is None:
        raise fail(path, "Field required")
    doc = check_obj(doc, path)
    for key in doc:
        if key not in ("type", "source", "title", "citations", "context", "cache_control"):
            raise fail(f"{path}.{echo(key)}", "Extra inputs are not permitted")
    if doc.get("type") != "document":
        raise fail(f"{path}.type", "Input should be 'document'")
    for key in ("title", "context"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise fail(f"{path}.{key}", "Input should be a valid string")
    citations = doc.get("citations")
    if citations is not None:
        check_obj(citations, f"{path}.citations")
        if not isinstance(citations.get("enabled", False), bool):
            raise fail(f"{path}.citations.enabled", "Input should be a valid boolean")
    source = check_obj(doc.get("source"), f"{path}.source")
    kind = source.get("type")
    if kind == "text":
        expected = "text/plain"
    elif kind == "base64":
        expected = "application/pdf"
    else:
        raise fail(f"{path}.source.type", "Input should be 'text' or 'base64'")
    for key in source:
        if key not in ("type", "media_type", "data"):
            raise fail(f"{path}.source.{echo(key)}", "Extra inputs are not permitted")
    if source.get("media_type") != expected:
        raise fail(f"{path}.source.media_type", f"Input should be '{expected}'")
    if not isinstance(source.get("data"), str):
        raise fail(f"{path}.source.data", "Field required")


def _thinking(block: Mapping[str, Any], path: str) -> None:
    check_str(block, "thinking", path)
    check_str(block, "signature", path, required=False)


_USER_BLOCKS: Mapping[str, Callable[[Mapping[str, Any], str], None]] = {
    "text": _text,
    "image": _image,
    "document": _document,
    "search_result": _search_result,
    "tool_result": _tool_result,
}
_ASSISTANT_BLOCKS: Mapping[str, Callable[[Mapping[str, Any], str], None]] = {
    "text": _text,
    "tool_use": _tool_use,
    "thinking": _thinking,
    # a web search's blocks, replayed (gateway/messages/search_blocks.py)
    "server_tool_use": _server_tool_use,
    "web_search_tool_result": _web_search_tool_result,
    # a web fetch's result, replayed (gateway/messages/fetch_blocks.py)
    "web_fetch_tool_result": _web_fetch_tool_result,
}
_SYSTEM_BLOCKS: Mapping[str, Callable[[Mapping[str, Any], str], None]] = {"text": _text}


def _refusal(role: str, kind: str) -> str:
    if role == "assistant" and kind in _REFUSED_IN_ASSISTANT:
        return _REFUSED_IN_ASSISTANT[kind]
    if role == "system":
        return "system turns hold only text blocks"
    return f"'{echo(kind)}' blocks are not supported in {role} turns"


def check_messages(messages: Any) -> None:
    # server_tool_use ids of this run of assistant turns, unanswered -> their result's type
    searches: dict[str, str] = {}
    for i, msg in enumerate(check_list(messages, "messages")):
        if type(msg) is not dict:
            check_obj(msg, f"messages.{i}")
        role = msg.get("role")
        if role != "assistant" and searches:
            searches.clear()
        if role == "user":
            allowed = _USER_BLOCKS
        elif role == "assistant":
            allowed = _ASSISTANT_BLOCKS
        elif role == "system":
            allowed = _SYSTEM_BLOCKS
        elif role is None:
            raise fail(f"messages.{i}.role", "Field required")
        else:
            raise fail(f"messages.{i}.role", "Input should be 'user', 'assistant' or 'system'")
        if role == "system":
            _turn_controls(msg, f"messages.{i}")
        elif "clear_at" in msg and msg["clear_at"] is not None:
            raise fail(f"messages.{i}.clear_at", "only permitted on role 'system' messages")
        content = msg.get("content")
        if isinstance(content, str):
            continue  # the usual text turn: no path made
        path = f"messages.{i}"
        if content is None:
            if turn_control.is_control_entry(msg):
                continue
            raise fail(f"{path}.content", "Field required")
        if not check_list(content, f"{path}.content"):
            if turn_control.is_control_entry(msg):
                continue  # a per-turn control entry: output_config and nothing to show
            raise fail(f"{path}.content", "List should have at least 1 item")
        for j, block in enumerate(content):
            block_path = f"{path}.content.{j}"
            kind = _block_type(block, block_path)
            check = allowed.get(kind)
            if check is None:
                raise fail(f"{block_path}.type", _refusal(role, kind))
            check(block, block_path)
            if kind == "server_tool_use":
                searches[block["id"]] = block["name"] + "_tool_result"
            elif kind in ("web_search_tool_result", "web_fetch_tool_result"):
                if searches.get(block["tool_use_id"]) != kind:
                    raise fail(
                        f"{block_path}.tool_use_id",
                        f"a {kind} must follow the server_tool_use block it answers, once",
                    )
                del searches[block["tool_use_id"]]
    if not messages:
        raise fail("messages", "List should have at least 1 item")


def _turn_controls(msg: Mapping[str, Any], path: str) -> None:
    """A system turn's per-turn ``output_config`` (``effort``; ``format`` is top-level only)
    and ``clear_at`` (:mod:`.turn_control`)."""
    clear_at = msg.get("clear_at")
    if clear_at is not None and clear_at not in turn_control.CLEAR_AT:
        raise fail(f"{path}.clear_at", "Input should be 'next_user_message' or 'never'")
    config = msg.get("output_config")
    if config is None:
        return
    check_obj(config, f"{path}.output_config")
    effort = config.get("effort")
    if effort is not None and effort not in EFFORTS:
        raise fail(
            f"{path}.output_config.effort", "Input should be " + ", ".join(map(repr, EFFORTS))
        )
    if config.get("format") is not None:
        raise fail(
            f"{path}.output_config.format",
            "output_config.format is only allowed at the top level of the request",
        )


def check_system(system: Any) -> None:
    if system is None or isinstance(system, str):
        return
    for j, block in enumerate(check_list(system, "system")):
        path = f"system.{j}"
        if _block_type(block, path) != "text":
            raise fail(f"{path}.type", "system holds only text blocks")
        _text(block, path)


def _check_code(code: Any, codes: tuple[str, ...], path: str) -> None:
    """A replayed server tool error's ``error_code``: one the SDK types list."""
    if code not in codes:
        raise fail(
            f"{path}.error_code",
            "Input should be one of " + ", ".join(f"'{c}'" for c in sorted(codes)),
        )


MAX_DOMAINS = 100  # entries per filter list (far above any real one; bounds the matching work)


def check_domain_filters(tool: Mapping[str, Any], path: str) -> None:
    """A server tool's ``allowed_domains`` / ``blocked_domains`` (web search and web fetch
    take the same lists): at most :data:`MAX_DOMAINS` domain names each, and not both."""
    for key in ("allowed_domains", "blocked_domains"):
        domains = tool.get(key)
        if domains is None:
            continue
        items = check_list(domains, f"{path}.{key}")
        if len(items) > MAX_DOMAINS:
            raise fail(f"{path}.{key}", f"List should have at most {MAX_DOMAINS} items")
        for j, domain in enumerate(items):
            if not isinstance(domain, str) or not domain or len(domain) > 253 + 1024:
                raise fail(f"{path}.{key}.{j}", "Input should be a domain name")
            if "://" in domain:
                raise fail(
                    f"{path}.{key}.{j}",
                    "a domain is written without its scheme (example.com, not https://example.com)",
                )
    if tool.get("allowed_domains") is not None and tool.get("blocked_domains") is not None:
        raise fail(
            f"{path}.blocked_domains", "use either allowed_domains or blocked_domains, not both"
        )
