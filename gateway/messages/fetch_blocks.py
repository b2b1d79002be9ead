"""The ``web_fetch`` server tool's surface: its definition, its blocks, its tool messages.

The gateway runs the fetch itself (:mod:`gateway.tools.web_fetch`); this module is the pure
part that validation (``messages/request``), translation (``messages/to_chat``) and the
rounds loop share, beside :mod:`.search_blocks` for the same reason (``tools`` sits above
``messages``).

Protocol facts relied on (Anthropic's web fetch tool docs; SDK 2.15's
``WebFetchTool20250910Param`` / ``…20260209`` / ``…20260309`` / ``…20260318``,
``WebFetchToolResultBlock``, ``WebFetchBlock``, ``DocumentBlock``,
``WebFetchToolResultErrorCode``, ``WebFetchURLSourcesParam``):

- The tool is ``{"type": "web_fetch_<date>", "name": "web_fetch", ...}`` with the optional
  ``max_uses`` (>= 1), ``allowed_domains`` / ``blocked_domains`` (as web search's),
  ``citations`` (``{"enabled": bool}``), ``max_content_tokens`` (>= 1), ``url_sources``,
  ``cache_control``, ``defer_loading``, ``strict``, ``allowed_callers``; ``20260309`` adds
  ``use_cache``; ``20260318`` adds ``use_cache`` and ``response_inclusion``. Any other field
  is refused by name.
- A fetch is ``{"type": "server_tool_use", "id": "srvtoolu_…", "name": "web_fetch",
  "input": {"url": …}}`` then ``{"type": "web_fetch_tool_result", "tool_use_id": …,
  "content": …}``, the content a ``{"type": "web_fetch_result", "url", "retrieved_at",
  "content": <document>}`` or ``{"type": "web_fetch_tool_result_error", "error_code": …}``
  with a code of :data:`ERROR_CODES`. The document is ``{"type": "document", "source":
  {"type": "text", "media_type": "text/plain", "data": …}, "title", "citations":
  {"enabled": …}}``, or for a PDF ``"source": {"type": "base64", "media_type":
  "application/pdf", "data": …}``.

Upstream, a fetch is an assistant ``tool_calls`` entry (function ``web_fetch``, arguments
``{"url": …}``) answered by a ``tool`` message (:func:`document_text`, :func:`error_text`).
Unlike a search result nothing is sealed: the document the client sends back is what the
model is shown again, unchanged (a client may edit it; it is the client's own conversation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.errors import echo
from gateway.messages.request.content import (
    check_domain_filters,
    check_int,
    check_list,
    check_obj,
    fail,
)
from gateway.ops.metrics import WEB_FETCH_ERROR_CODES

__all__ = [
    "ERROR_CODES",
    "NAME",
    "OPENED",
    "TOOL_TYPES",
    "check_tool",
    "document_text",
    "error_text",
    "function",
    "replayed_text",
    "web_fetch_tool",
]

TOOL_TYPES = frozenset(
    {"web_fetch_20250910", "web_fetch_20260209", "web_fetch_20260309", "web_fetch_20260318"}
)
NAME = "web_fetch"
ERROR_CODES = WEB_FETCH_ERROR_CODES
# the tool message text kept on a result block made in this reply (a PDF's extracted text),
# never from a client: validation refuses unknown fields on these blocks
OPENED = "_opened"

_FIELDS = frozenset(
    {
        "type",
        "name",
        "max_uses",
        "allowed_domains",
        "blocked_domains",
        "citations",
        "max_content_tokens",
        "url_sources",
        "cache_control",
        "defer_loading",
        "strict",
        "allowed_callers",
    }
)
_FIELDS_BY_TYPE = {
    "web_fetch_20260309": _FIELDS | {"use_cache"},
    "web_fetch_20260318": _FIELDS | {"use_cache", "response_inclusion"},
}
_SOURCE_KEYS = ("user_input", "client_tool_results", "server_tool_results")
_FILTERS = ("all", "none", "only", "except")

_DESCRIPTION = (
    "Fetch a web page or PDF and read its text. Only URLs that appear in the conversation "
    "(written by the user, or returned by an earlier search or fetch) can be fetched; "
    "give the URL exactly as it appears."
)
_PARAMETERS = {
    "type": "object",
    "properties": {"url": {"type": "string", "description": "The URL to fetch."}},
    "required": ["url"],
}


def web_fetch_tool(tools: Sequence[Mapping[str, Any]] | None) -> Mapping[str, Any] | None:
    """The request's web fetch tool, if it offers one."""
    for tool in tools or ():
        if tool.get("type") in TOOL_TYPES:
            return tool
    return None


def function(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI ``function`` the model is offered for a (validated) web fetch tool."""
    return {"name": tool["name"], "description": _DESCRIPTION, "parameters": _PARAMETERS}


# --- validation ---------------------------------------------------------------------


def check_tool(tool: Mapping[str, Any], path: str) -> str:
    """Validate a web fetch tool definition at ``path``; return its name. (``url_sources``
    naming tools is checked against the request's tools by :func:`check_url_sources`.)"""
    allowed = _FIELDS_BY_TYPE.get(tool["type"], _FIELDS)
    for key in tool:
        if key not in allowed:
            raise fail(f"{path}.{echo(key)}", "Extra inputs are not permitted")
    name = tool.get("name")
    if name is None:
        raise fail(f"{path}.name", "Field required")
    if name != NAME:
        raise fail(f"{path}.name", f"Input should be '{NAME}'")
    for key in ("max_uses", "max_content_tokens"):
        if tool.get(key) is not None:
            check_int(tool[key], f"{path}.{key}", minimum=1)
    check_domain_filters(tool, path)
    citations = tool.get("citations")
    if citations is not None:
        check_obj(citations, f"{path}.citations")
        for key in citations:
            if key != "enabled":
                raise fail(f"{path}.citations.{echo(key)}", "Extra inputs are not permitted")
        if "enabled" in citations and not isinstance(citations["enabled"], bool):
            raise fail(f"{path}.citations.enabled", "Input should be a valid boolean")
    for key in ("use_cache", "strict"):
        if key in tool and not isinstance(tool[key], bool):
            raise fail(f"{path}.{key}", "Input should be a valid boolean")
    inclusion = tool.get("response_inclusion")
    if inclusion is not None and inclusion not in ("full", "excluded"):
        raise fail(f"{path}.response_inclusion", "Input should be 'full' or 'excluded'")
    _check_url_sources(tool.get("url_sources"), f"{path}.url_sources")
    return NAME


def _check_url_sources(sources: Any, path: str) -> None:
    if sources is None:
        return
    check_obj(sources, path)
    for key in sources:
        if key not in _SOURCE_KEYS:
            raise fail(f"{path}.{echo(key)}", "Extra inputs are not permitted")
    for key in _SOURCE_KEYS:
        if key not in sources:
            continue
        where = f"{path}.{key}"
        value = sources[key]
        check_obj(value, where)
        kind = value.get("type")
        kinds = ("all", "none") if key == "user_input" else _FILTERS
        if kind not in kinds:
            raise fail(f"{where}.type", "Input should be " + " or ".join(f"'{k}'" for k in kinds))
        fields = {"type", "tools"} if kind in ("only", "except") else {"type"}
        for field in value:
            if field not in fields:
                raise fail(f"{where}.{echo(field)}", "Extra inputs are not permitted")
        if kind in ("only", "except"):
            if "tools" not in value:
                raise fail(f"{where}.tools", "Field required")
            for j, ref in enumerate(check_list(value["tools"], f"{where}.tools")):
                check_obj(ref, f"{where}.tools.{j}")
                for field in ref:
                    if field not in ("type", "name"):
                        raise fail(
                            f"{where}.tools.{j}.{echo(field)}", "Extra inputs are not permitted"
                        )
                if ref.get("type") != "tool_reference":
                    raise fail(f"{where}.tools.{j}.type", "Input should be 'tool_reference'")
                if not isinstance(ref.get("name"), str) or not ref["name"]:
                    raise fail(f"{where}.tools.{j}.name", "Input should be a non-empty string")


def check_url_sources(tool: Mapping[str, Any], path: str, names: set[str]) -> None:
    """A tool named by ``url_sources`` must be one of the request's tools (``names``)."""
    sources = tool.get("url_sources") or {}
    for key in ("client_tool_results", "server_tool_results"):
        value = sources.get(key)
        if not value:
            continue
        for j, ref in enumerate(value.get("tools") or ()):
            if ref["name"] not in names:
                raise fail(
                    f"{path}.url_sources.{key}.tools.{j}.name",
                    f"'{echo(ref['name'])}' is not a tool of this request",
                )


# --- what the model sees ------------------------------------------------------------


def document_text(url: str, title: str | None, text: str) -> str:
    """The tool message for a fetched document: its URL, title and text."""
    head = [f"URL: {url}"]
    if title:
        head.append(f"Title: {title}")
    return "\n".join(head) + "\n\n" + text


def error_text(code: str) -> str:
    """The tool message for a failed fetch."""
    why = {
        "max_uses_exceeded": "the maximum number of fetches for this request was reached",
        "url_not_in_prior_context": "only URLs that appear in the conversation can be fetched",
        "url_not_allowed": "this URL's domain or address may not be fetched",
        "url_not_accessible": "the page could not be fetched",
        "url_too_long": "the URL is too long",
        "invalid_tool_input": "the URL is not a valid http(s) URL",
        "unsupported_content_type": "the page's content type cannot be read",
        "content_too_large": "the page is too large",
        "too_many_requests": "too many fetches are in progress",
    }.get(code, "the fetch service is unavailable")
    return f"The web fetch failed ({code}): {why}."


_PDF_PLACEHOLDER = "[a PDF document; its text could not be extracted]"


def replayed_text(block: Mapping[str, Any]) -> str:
    """The tool message a ``web_fetch_tool_result`` block stands for: the text document as
    the block holds it (unchanged from when it was fetched), a PDF's text as extracted."""
    opened = block.get(OPENED)
    if isinstance(opened, str):
        return opened
    content = block.get("content") or {}
    if content.get("type") != "web_fetch_result":
        return error_text(str(content.get("error_code") or "unavailable"))
    doc = content.get("content") or {}
    source = doc.get("source") or {}
    text = source.get("data") if source.get("type") == "text" else _PDF_PLACEHOLDER
    return document_text(str(content.get("url") or ""), doc.get("title"), text or "")
