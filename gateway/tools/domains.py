"""The web search tool's ``allowed_domains`` / ``blocked_domains``, applied to result URLs.

As the API documents them: an entry is a domain without its scheme (``example.com``); it
covers its subdomains (``example.com`` matches ``docs.example.com``), while a subdomain entry
covers only itself and below (``docs.example.com`` does not match ``example.com`` or
``api.example.com``); an entry may carry a path (``example.com/blog``), which matches that
path and everything under it, and a ``*`` in the path matches any characters. Matching is
case-insensitive on the host; ``www.`` is not special. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["DomainFilter"]


@dataclass(frozen=True, slots=True)
class _Entry:
    host: str
    path: re.Pattern[str] | None  # None: any path

    def matches(self, host: str, path: str) -> bool:
        if host != self.host and not host.endswith("." + self.host):
            return False
        return self.path is None or self.path.match(path) is not None


def _entry(text: str) -> _Entry:
    host, slash, path = text.strip().partition("/")
    host = host.lower().rstrip(".")
    if host.startswith("*."):  # a leading wildcard says what subdomain matching already does
        host = host[2:]
    if not slash or not path.strip("/*"):
        return _Entry(host, None)
    pattern = "/" + ".*".join(re.escape(piece) for piece in path.split("*"))
    # "/blog" covers "/blog", "/blog/..." and "/blog?..." but not "/blogger"
    return _Entry(host, re.compile(pattern + r"(?:$|[/?#])" if not path.endswith("*")
                                   else pattern))


class DomainFilter:
    """Which result URLs a web search tool lets through."""

    __slots__ = ("_allowed", "_blocked")

    def __init__(self, allowed: Sequence[str] | None = None,
                 blocked: Sequence[str] | None = None) -> None:
        self._allowed = [_entry(d) for d in allowed] if allowed is not None else None
        self._blocked = [_entry(d) for d in blocked or ()]

    def __call__(self, url: str) -> bool:
        try:
            parts = urlsplit(url)
            host = (parts.hostname or "").rstrip(".")
        except ValueError:
            return False
        path = parts.path or "/"
        if any(e.matches(host, path) for e in self._blocked):
            return False
        return self._allowed is None or any(e.matches(host, path) for e in self._allowed)
