"""The web search tool's ``allowed_domains`` / ``blocked_domains``, applied to result URLs.

As the API documents them: an entry is a domain without its scheme (``example.com``); it
covers its subdomains (``example.com`` matches ``docs.example.com``), while a subdomain entry
covers only itself and below (``docs.example.com`` does not match ``example.com`` or
``api.example.com``); an entry may carry a path (``example.com/blog``), which matches that
path and everything under it, and a ``*`` in the path matches any characters. ``www.`` is
not special.

A result's host and path are the ones a browser would go to (:mod:`.hosts`: a backslash
ends the host, full-width dots are dots, U-labels and A-labels are one host, upper case and
a trailing dot do not matter), and an entry's host is put in the same one form; a result
whose URL a browser would not parse is dropped while any filter is set. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.tools.web_search.hosts import canonical_host, host_and_path, normal_path

__all__ = ["DomainFilter"]


class _Path:
    """A path pattern, ``*`` matching any characters, matched in linear time: its pieces
    between ``*`` are found leftmost in turn (a regular expression of ``.*`` would
    backtrack: a few ``*`` against a long URL path took seconds on the event loop)."""

    __slots__ = ("_first", "_last", "_middle")

    def __init__(self, pattern: str) -> None:
        pieces = pattern.split("*")
        # the pieces before the last, found in turn (none without "*": the last is all)
        self._first, self._middle = (pieces[0], pieces[1:-1]) if len(pieces) > 1 else ("", [])
        last = pieces[-1]
        # ending in "*": anything after; else the last piece ends the path or a segment
        self._last = (
            None if len(pieces) > 1 and not last else re.compile(re.escape(last) + r"(?:$|[/?#])")
        )

    def match(self, path: str) -> bool:
        if not path.startswith(self._first):
            return False
        at = len(self._first)
        for piece in self._middle:
            found = path.find(piece, at)
            if found < 0:
                return False
            at = found + len(piece)
        if self._last is None:
            return True
        if at == 0:  # no "*": the pattern from the path's start
            return self._last.match(path) is not None
        return self._last.search(path, at) is not None


@dataclass(frozen=True, slots=True)
class _Entry:
    host: str | None  # None: a host no URL has (one a browser would not parse)
    path: _Path | None  # None: any path

    def matches(self, host: str, path: str) -> bool:
        if self.host is None:
            return False
        if host != self.host and (not host.endswith("." + self.host) or _is_address(host)):
            return False
        return self.path is None or self.path.match(path)


def _is_address(host: str) -> bool:
    """An IP address has no subdomains (a canonical domain never ends in a number)."""
    return host.startswith("[") or host[-1].isdigit()


def _entry(text: str) -> _Entry:
    name, slash, path = text.strip().partition("/")
    if name.startswith("*."):  # a leading wildcard says what subdomain matching already does
        name = name[2:]
    host = canonical_host(name)
    if not slash or not path.strip("/*"):
        return _Entry(host, None)
    # "/blog" covers "/blog", "/blog/..." and "/blog?..." but not "/blogger"
    return _Entry(host, _Path(normal_path("/" + path)))


class DomainFilter:
    """Which result URLs a web search tool lets through."""

    __slots__ = ("_allowed", "_blocked")

    def __init__(
        self, allowed: Sequence[str] | None = None, blocked: Sequence[str] | None = None
    ) -> None:
        self._allowed = [_entry(d) for d in allowed] if allowed is not None else None
        self._blocked = [_entry(d) for d in blocked or ()]

    def __call__(self, url: str) -> bool:
        if self._allowed is None and not self._blocked:
            return True
        parsed = host_and_path(url)
        if parsed is None:
            return False
        host, path = parsed
        if any(e.matches(host, path) for e in self._blocked):
            return False
        return self._allowed is None or any(e.matches(host, path) for e in self._allowed)
