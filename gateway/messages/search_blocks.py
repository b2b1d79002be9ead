"""The ``web_search`` server tool's surface: its definition, its blocks, its sealed results.

The gateway runs the search itself (:mod:`gateway.tools.web_search`, the feature's one
package); this module is the pure part that validation, translation and the loop share. It
stays in ``messages`` because the layers there read it (``messages/request`` validates the
tool, ``messages/to_chat`` replays its blocks into chat turns, ``messages/call`` opens
replayed results, ``http/batches`` refuses it), and ``tools`` sits above ``messages``: an
import from here into ``tools`` would run upward.

Protocol facts relied on (Anthropic's web search tool docs; SDK 2.15's
``WebSearchTool20250305Param`` / ``…20260209`` / ``…20260318``, ``ServerToolUseBlock``,
``WebSearchToolResultBlock``, ``WebSearchResultBlock``, ``WebSearchToolResultErrorCode``):

- The tool is ``{"type": "web_search_<date>", "name": "web_search", ...}`` with the optional
  ``max_uses`` (>= 1), ``allowed_domains`` / ``blocked_domains`` (lists of strings, not both),
  ``user_location`` (``{"type": "approximate", city?, region?, country?, timezone?}``),
  ``cache_control``, ``defer_loading``, ``strict``, ``allowed_callers``; ``20260318`` adds
  ``response_inclusion`` (``"full"`` / ``"excluded"``). Any other field is refused by name.
- The reply carries, per search, ``{"type": "server_tool_use", "id": "srvtoolu_…",
  "name": "web_search", "input": {"query": …}}`` then ``{"type": "web_search_tool_result",
  "tool_use_id": …, "content": [...]}`` whose content is a list of ``{"type":
  "web_search_result", "url", "title", "encrypted_content", "page_age"}`` or one error
  object ``{"type": "web_search_tool_result_error", "error_code": …}`` with a code of
  :data:`ERROR_CODES`.
- ``encrypted_content`` is opaque to clients and sent back unchanged in later turns. Here it
  holds what the model saw of that result (url, title, page age, snippet), sealed with the
  gateway's signing key (AES-256-GCM under an HKDF-derived key of its own, the nonce a keyed
  hash of the plaintext: the same result always seals the same), so a replayed search gives
  the upstream the same tool message again. A result this gateway cannot open (another key,
  altered, Anthropic's own) is shown by its title and URL, never refused.

Upstream, a search is an assistant ``tool_calls`` entry (function ``web_search``, arguments
``{"query": …}``, id the ``srvtoolu_`` id) answered by a ``tool`` message whose text lists
each result (:func:`results_text`) or says the search failed (:func:`error_text`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gateway.errors import echo
from gateway.messages.from_chat.signatures import derived_keys
from gateway.messages.request.content import (
    check_domain_filters,
    check_int,
    check_obj,
    fail,
)
from gateway.ops.metrics import WEB_SEARCH_ERROR_CODES
from gateway.text import jsonutil

__all__ = [
    "ERROR_CODES",
    "TOOL_TYPES",
    "check_tool",
    "error_text",
    "function",
    "open_history",
    "open_result",
    "replayed_text",
    "result_lines",
    "results_text",
    "seal_result",
    "web_search_tool",
]

TOOL_TYPES = frozenset({"web_search_20250305", "web_search_20260209", "web_search_20260318"})
NAME = "web_search"
ERROR_CODES = WEB_SEARCH_ERROR_CODES
# opened text kept on a replayed result block for the translation (never from a client:
# validation refuses unknown fields on these blocks)
OPENED = "_opened"

_FIELDS = frozenset(
    {
        "type",
        "name",
        "max_uses",
        "allowed_domains",
        "blocked_domains",
        "user_location",
        "cache_control",
        "defer_loading",
        "strict",
        "allowed_callers",
    }
)
_FIELDS_BY_TYPE = {"web_search_20260318": _FIELDS | {"response_inclusion"}}
_LOCATION_FIELDS = frozenset({"type", "city", "region", "country", "timezone"})

_DESCRIPTION = (
    "Search the web. Returns a list of results, each with its title, URL and a snippet of "
    "the page. Use it for current events and for facts you do not know; write the query "
    "as you would type it into a search engine."
)
_PARAMETERS = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "The search query."}},
    "required": ["query"],
}


def web_search_tool(tools: Sequence[Mapping[str, Any]] | None) -> Mapping[str, Any] | None:
    """The request's web search tool, if it offers one."""
    for tool in tools or ():
        if tool.get("type") in TOOL_TYPES:
            return tool
    return None


def function(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI ``function`` the model is offered for a (validated) web search tool."""
    return {"name": tool["name"], "description": _DESCRIPTION, "parameters": _PARAMETERS}


# --- validation ---------------------------------------------------------------------


def check_tool(tool: Mapping[str, Any], path: str) -> str:
    """Validate a web search tool definition at ``path``; return its name."""
    allowed = _FIELDS_BY_TYPE.get(tool["type"], _FIELDS)
    for key in tool:
        if key not in allowed:
            raise fail(f"{path}.{echo(key)}", "Extra inputs are not permitted")
    name = tool.get("name")
    if name is None:
        raise fail(f"{path}.name", "Field required")
    if name != NAME:
        raise fail(f"{path}.name", f"Input should be '{NAME}'")
    if tool.get("max_uses") is not None:
        check_int(tool["max_uses"], f"{path}.max_uses", minimum=1)
    check_domain_filters(tool, path)
    _check_location(tool.get("user_location"), f"{path}.user_location")
    inclusion = tool.get("response_inclusion")
    if inclusion is not None and inclusion not in ("full", "excluded"):
        raise fail(f"{path}.response_inclusion", "Input should be 'full' or 'excluded'")
    return NAME


def _check_location(location: Any, path: str) -> None:
    if location is None:
        return
    check_obj(location, path)
    for key in location:
        if key not in _LOCATION_FIELDS:
            raise fail(f"{path}.{echo(key)}", "Extra inputs are not permitted")
    if location.get("type") != "approximate":
        raise fail(f"{path}.type", "Input should be 'approximate'")
    for key in ("city", "region", "country", "timezone"):
        value = location.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > 255):
            raise fail(f"{path}.{key}", "Input should be a valid string")


# --- what the model sees ------------------------------------------------------------


def result_lines(result: Mapping[str, Any]) -> str:
    """One result as the model reads it: title, URL (verbatim), age, snippet."""
    lines = [f"Title: {result.get('title') or ''}", f"URL: {result.get('url') or ''}"]
    if result.get("page_age"):
        lines.append(f"Published: {result['page_age']}")
    if result.get("snippet"):
        lines.append(f"Snippet: {result['snippet']}")
    return "\n".join(lines)


def results_text(results: Sequence[Mapping[str, Any]]) -> str:
    """The tool message for a search's results (each as :func:`result_lines`)."""
    if not results:
        return "The search returned no results."
    return "\n\n".join(f"[{n}]\n{result_lines(r)}" for n, r in enumerate(results, 1))


def error_text(code: str) -> str:
    """The tool message for a failed search."""
    why = {
        "max_uses_exceeded": "the maximum number of searches for this request was reached",
        "query_too_long": "the query was too long",
        "invalid_tool_input": "the query was not valid",
        "too_many_requests": "the search engine is rate limiting requests",
        "request_too_large": "the request was too large",
    }.get(code, "the search engine is unavailable")
    return f"The web search failed ({code}): {why}. Answer without it, or try another query."


# --- sealing ------------------------------------------------------------------------

_VERSION = b"\x01"
_NONCE = 12
_AAD = b"llm-gateway web search result v1"
_MAX_SEALED_CHARS = 64 * 1024  # far above a capped snippet; bounds what is opened


def _keys(key: bytes) -> tuple[AESGCM, Any]:
    return derived_keys(key, _AAD)


def seal_result(key: bytes, result: Mapping[str, Any]) -> str:
    """``encrypted_content`` for one result: its url, title, page_age and snippet."""
    cipher, mac = _keys(key)
    plain = jsonutil.dumpb({k: result.get(k) for k in ("url", "title", "page_age", "snippet")})
    nonce_mac = mac.copy()
    nonce_mac.update(plain)
    nonce = nonce_mac.digest()[:_NONCE]
    return base64.urlsafe_b64encode(_VERSION + nonce + cipher.encrypt(nonce, plain, _AAD)).decode(
        "ascii"
    )


def open_result(keys: Sequence[bytes], sealed: str) -> dict[str, Any] | None:
    """The result sealed in ``encrypted_content``, or None when no key opens it."""
    if not sealed or len(sealed) > _MAX_SEALED_CHARS:
        return None
    try:
        raw = base64.urlsafe_b64decode(sealed.encode("ascii"))
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return None
    if len(raw) < 1 + _NONCE + 16 or raw[:1] != _VERSION:
        return None
    nonce, body = raw[1 : 1 + _NONCE], raw[1 + _NONCE :]
    for key in keys:
        try:
            plain = _keys(key)[0].decrypt(nonce, body, _AAD)
        except InvalidTag:
            continue
        try:
            result = jsonutil.loads(plain)
        except ValueError:
            return None
        return result if isinstance(result, dict) else None
    return None


def replayed_text(block: Mapping[str, Any], keys: Sequence[bytes]) -> str:
    """The tool message a replayed ``web_search_tool_result`` block stands for."""
    content = block.get("content")
    if isinstance(content, Mapping):
        return error_text(str(content.get("error_code") or "unavailable"))
    results = []
    for item in content or ():
        opened = open_result(keys, item.get("encrypted_content", ""))
        if opened is None or opened.get("url") != item.get("url"):
            # not sealed here (or not for this URL): what the block itself says
            opened = {
                "url": item.get("url"),
                "title": item.get("title"),
                "page_age": item.get("page_age"),
            }
        results.append(opened)
    return results_text(results)


def open_history(req: Mapping[str, Any], keys: Sequence[bytes]) -> None:
    """Open each replayed ``web_search_tool_result`` block of a validated request: its tool
    message text is kept on the block (``OPENED``) for :mod:`.to_chat`."""
    for turn in req.get("messages") or ():  # a loop, not a generator: most find none
        content = turn.get("content")
        if turn.get("role") != "assistant" or isinstance(content, str):
            continue
        for block in content or ():
            if block.get("type") == "web_search_tool_result" and OPENED not in block:
                block[OPENED] = replayed_text(block, keys)
