"""Upstream secrets: every form of them, and the one-pass redactor built once at app start.

Facts relied on:

* The gateway sends an upstream its key as ``Authorization: Bearer <key>``. An upstream, or a
  proxy in front of it, may quote what it was sent in an error: the header value, the bare key,
  or a URL holding it percent-encoded (``?key=...``, either hex case); text that reaches us as
  JSON we failed to parse holds it JSON-escaped (``\\"`` and ``\\\\``, ``/`` maybe as ``\\/``).
* A key is one run of printable ASCII without spaces (config refuses anything else), so a
  match is exact: no case folding, no word boundaries. A key is redacted wherever it occurs,
  even inside a longer word; a key as short as an ordinary word (vLLM's ``EMPTY``) costs error
  texts that word, never the key.
* Several upstreams may sit behind one proxy, so one upstream's error can quote another's key:
  the redactor holds every configured upstream's secrets, not only the one answering.

:func:`secrets_of` is pure and per upstream (the upstream client may expose it as its
``secrets``); :class:`Redactor` compiles them all into one alternation, longest first, so
``Bearer <key>`` goes as one piece and a key that holds another key is never cut in two.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Protocol
from urllib.parse import quote

__all__ = ["NO_SECRETS", "REDACTED", "Redactor", "Secrets", "redactor", "secrets_of"]

REDACTED = "[redacted]"
_HEX_ESCAPE = re.compile(r"%[0-9A-F]{2}")


class Keyed(Protocol):
    """What :func:`secrets_of` reads of an upstream's config (``UpstreamConfig``)."""

    @property
    def api_key(self) -> str | None: ...


def secrets_of(cfg: Keyed) -> tuple[str, ...]:
    """Every form of ``cfg``'s key an upstream could quote back; () without a key."""
    key = cfg.api_key
    if not key:
        return ()
    encoded = quote(key, safe="")
    escaped = json.dumps(key)[1:-1]
    forms = (f"Bearer {key}", key, encoded, _HEX_ESCAPE.sub(lambda m: m[0].lower(), encoded),
             quote(key), escaped, escaped.replace("/", "\\/"))
    return tuple(dict.fromkeys(forms))  # in order, each once


class Redactor:
    """``redactor(text)``: ``text`` with every secret replaced by ``[redacted]``, in one pass."""

    __slots__ = ("_bytes_pattern", "_count", "_pattern")

    def __init__(self, secrets: Iterable[str]) -> None:
        forms = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._count = len(forms)
        self._pattern = re.compile("|".join(map(re.escape, forms))) if forms else None
        self._bytes_pattern = (re.compile(b"|".join(re.escape(f.encode()) for f in forms))
                               if forms else None)

    @classmethod
    def of(cls, upstreams: Iterable[Keyed]) -> Redactor:
        """The redactor of every configured upstream's secrets."""
        return cls(s for cfg in upstreams for s in secrets_of(cfg))

    def __call__(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(REDACTED, text)

    def redact_bytes(self, data: bytes) -> bytes:
        """``data`` (relayed bytes, UTF-8) with every secret replaced; ``data`` itself when
        it holds none (one search per relayed block, no copy)."""
        pattern = self._bytes_pattern
        if pattern is None or pattern.search(data) is None:
            return data
        return pattern.sub(REDACTED.encode(), data)

    def __bool__(self) -> bool:
        return self._pattern is not None

    def __repr__(self) -> str:  # never the secrets themselves
        return f"<Redactor of {self._count} secret forms>"


NO_SECRETS = Redactor(())

# what callers hand the scrubber: the app's compiled redactor, or strings (a client's own)
Secrets = Redactor | Iterable[str]


def redactor(secrets: Secrets) -> Redactor:
    """``secrets`` as a redactor (strings are compiled: an error path's cost, not a chunk's)."""
    return secrets if isinstance(secrets, Redactor) else Redactor(secrets)
