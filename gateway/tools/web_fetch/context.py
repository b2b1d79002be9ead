"""The URLs a web fetch may fetch: those the conversation holds, as the API rules.

The API fetches only a URL that appeared before: one the user wrote (user text, a text
document, a document's or image's ``url`` source, a ``search_result`` block's ``source``),
one a client tool's result holds, or one an earlier web search or web fetch returned
(a search result's ``url``, a fetched page's URL and the URLs its text holds), each source
as the tool's ``url_sources`` allows (omitted: every source). Anything else is
``url_not_in_prior_context`` and never fetched: the model cannot make up an address (an
internal host, a URL carrying a secret it read) and have the gateway request it.

URLs are compared in one normal form (:func:`url_key`): the scheme and host as a browser
reads them (:func:`gateway.tools.web_search.hosts.host_and_path`: case, IDNA, IPv4 spelled
in hex or octal, a trailing dot), the port with the scheme's default made explicit, the path
with its dot segments and escaped unreserved characters resolved, the query verbatim, the
fragment dropped. A URL written in text is found by :data:`_IN_TEXT` and loses the
punctuation a sentence puts after it. Pure; bounded: at most :data:`MAX_URLS` URLs are kept,
of URLs at most :data:`MAX_URL_CHARS` long.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from gateway.tools.web_search.hosts import host_and_path

__all__ = ["MAX_URLS", "UrlContext", "url_key", "urls_in_text"]

MAX_URLS = 20_000
MAX_URL_CHARS = 8192
_IN_TEXT = re.compile(r"https?://[^\s<>\"'`{}|\\^\[\]]+", re.IGNORECASE)
_TRAILING = ".,;:!?)]}>'\"*_"
_SCHEME_PORT = {"http": 80, "https": 443}
_STRIPPED = "".join(map(chr, range(0x21)))


def url_key(url: str) -> tuple[str, str, int, str, str] | None:
    """``url`` in the one form URLs are compared in (see the module docstring), or None
    when it is not an ``http(s)`` URL a browser would parse."""
    if len(url) > MAX_URL_CHARS:
        return None
    parsed = host_and_path(url)
    if parsed is None:
        return None
    host, path = parsed
    url = url.strip(_STRIPPED).translate(str.maketrans("", "", "\t\n\r"))
    scheme, _, rest = url.partition(":")
    scheme = scheme.lower()
    rest = rest.lstrip("/\\")
    end = len(rest)
    for stop in "/\\?#":
        at = rest.find(stop, 0, end)
        if at >= 0:
            end = at
    hostport = rest[:end][rest[:end].rfind("@") + 1 :]
    close = hostport.rfind("]") if hostport.startswith("[") else -1
    colon = hostport.find(":", close + 1)
    port = _SCHEME_PORT[scheme]
    if colon >= 0 and hostport[colon + 1 :]:
        port = int(hostport[colon + 1 :])  # digits, at most 65535: host_and_path checked it
    query = ""
    fragment = rest.find("#", end)
    tail = rest[end:] if fragment < 0 else rest[end:fragment]
    mark = tail.find("?")
    if mark >= 0:
        query = tail[mark:]
    return scheme, host, port, path or "/", query


def urls_in_text(text: str) -> Iterator[str]:
    """The ``http(s)`` URLs written in ``text``, without a sentence's punctuation after
    them (a ``)`` is kept when the URL holds its ``(``)."""
    for found in _IN_TEXT.finditer(text):
        url = found.group(0)
        while url and url[-1] in _TRAILING:
            if url[-1] == ")" and url.count("(") >= url.count(")"):
                break
            url = url[:-1]
        yield url


def _filter(spec: Mapping[str, Any] | None) -> tuple[str, frozenset[str]]:
    """(``all``/``none``/``only``/``except``, the tool names) of one ``url_sources`` key."""
    if spec is None:
        return "all", frozenset()
    return spec["type"], frozenset(ref["name"] for ref in spec.get("tools") or ())


def _admits(spec: tuple[str, frozenset[str]], name: str) -> bool:
    kind, names = spec
    if kind == "all":
        return True
    if kind == "none":
        return False
    return (name in names) == (kind == "only")


class UrlContext:
    """The URLs one request may fetch: those of its conversation, and those its own
    searches and fetches return as the reply goes on (:meth:`add_result`)."""

    __slots__ = ("_client", "_keys", "_server", "_user")

    def __init__(self, url_sources: Mapping[str, Any] | None = None) -> None:
        sources = url_sources or {}
        self._user = (sources.get("user_input") or {"type": "all"})["type"] == "all"
        self._client = _filter(sources.get("client_tool_results"))
        self._server = _filter(sources.get("server_tool_results"))
        self._keys: set[tuple[str, str, int, str, str]] = set()

    def __contains__(self, url: str) -> bool:
        key = url_key(url)
        return key is not None and key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, urls: Iterable[Any]) -> None:
        for url in urls:
            if len(self._keys) >= MAX_URLS:
                return
            if isinstance(url, str):
                key = url_key(url)
                if key is not None:
                    self._keys.add(key)

    def add_request(self, req: Mapping[str, Any]) -> None:
        """The URLs a validated request's conversation holds, as ``url_sources`` allows."""
        calls: dict[str, str] = {}  # tool_use id -> the client tool's name
        for turn in req.get("messages") or ():
            content = turn.get("content")
            role = turn.get("role")
            if isinstance(content, str):
                if role == "user" and self._user:
                    self.add(urls_in_text(content))
                continue
            for block in content or ():
                kind = block.get("type")
                if role == "assistant":
                    if kind == "tool_use":
                        calls[block["id"]] = block["name"]
                    elif kind in ("web_search_tool_result", "web_fetch_tool_result"):
                        self.add_result(block)
                elif role == "user":
                    if kind == "tool_result":
                        name = calls.get(block.get("tool_use_id", ""), "")
                        if _admits(self._client, name):
                            self.add(_block_urls(block))
                    elif self._user:
                        self.add(_block_urls(block))

    def add_result(self, block: Mapping[str, Any]) -> None:
        """A web search's or web fetch's result block (replayed, or of this reply)."""
        kind = block.get("type")
        name = "web_search" if kind == "web_search_tool_result" else "web_fetch"
        if not _admits(self._server, name):
            return
        content = block.get("content")
        if kind == "web_search_tool_result":
            if isinstance(content, list):
                self.add(item.get("url") for item in content if isinstance(item, Mapping))
            return
        if not isinstance(content, Mapping) or content.get("type") != "web_fetch_result":
            return
        self.add([content.get("url")])
        source = (content.get("content") or {}).get("source") or {}
        if source.get("type") == "text" and isinstance(source.get("data"), str):
            self.add(urls_in_text(source["data"]))


def _block_urls(block: Mapping[str, Any]) -> Iterator[str]:
    """The URLs a user block (or a tool result's content) holds."""
    kind = block.get("type")
    if kind == "text":
        yield from urls_in_text(block.get("text") or "")
    elif kind in ("document", "image"):
        source = block.get("source") or {}
        if source.get("type") == "url":
            yield source.get("url") or ""
        elif source.get("type") == "text":
            yield from urls_in_text(source.get("data") or "")
        elif source.get("type") == "content":
            for inner in source.get("content") or ():
                if isinstance(inner, Mapping):
                    yield from _block_urls(inner)
    elif kind == "search_result":
        yield from urls_in_text(block.get("source") or "")
        for inner in block.get("content") or ():
            if isinstance(inner, Mapping):
                yield from _block_urls(inner)
    elif kind == "tool_result":
        inner = block.get("content")
        if isinstance(inner, str):
            yield from urls_in_text(inner)
        else:
            for item in inner or ():
                if isinstance(item, Mapping):
                    yield from _block_urls(item)
