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
* Upstream error text may also quote what the gateway never sends upstream but a prompt or a
  log may carry (a client's key, the signing key, the batch database's URL) and the other
  upstreams' host names: the app's redactor holds those too (``text_only`` and ``hosts``),
  for error text only. Relayed bytes lose the upstream keys alone (the hot path: a model's
  own answer may name a host, and one search per block stays short).

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

__all__ = ["NO_SECRETS", "REDACTED", "Redactor", "Secrets", "key_forms", "redactor", "secrets_of"]

REDACTED = "[redacted]"
_HEX_ESCAPE = re.compile(r"%[0-9A-F]{2}")


class Keyed(Protocol):
    """What :func:`secrets_of` reads of an upstream's config (``UpstreamConfig``)."""

    @property
    def api_key(self) -> str | None: ...


def secrets_of(cfg: Keyed) -> tuple[str, ...]:
    """Every form of ``cfg``'s key an upstream could quote back; () without a key."""
    return key_forms(cfg.api_key) if cfg.api_key else ()


def key_forms(key: str) -> tuple[str, ...]:
    """Every form of ``key`` a text could quote: bare, as a ``Bearer`` header value,
    percent-encoded (either hex case), JSON-escaped."""
    if not key:
        return ()
    encoded = quote(key, safe="")
    escaped = json.dumps(key)[1:-1]
    forms = (
        f"Bearer {key}",
        key,
        encoded,
        _HEX_ESCAPE.sub(lambda m: m[0].lower(), encoded),
        quote(key),
        escaped,
        escaped.replace("/", "\\/"),
    )
    return tuple(dict.fromkeys(forms))  # in order, each once


def _alternation(forms: Iterable[str], flags: int = 0) -> re.Pattern[str] | None:
    """One pattern of ``forms``, longest first (a key holding another is never cut in two)."""
    ordered = sorted({f for f in forms if f}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, ordered)), flags) if ordered else None


class Redactor:
    """``redactor(text)``: ``text`` with every secret replaced by ``[redacted]``, in one pass.

    ``secrets`` go from text and from relayed bytes (:meth:`redact_bytes`); ``text_only``
    from text alone; ``hosts`` (host names, ``host:port``, base URLs, any letter case) are
    what :func:`gateway.text.scrub.clean` removes from upstream error text besides the
    answering upstream's (:attr:`hosts_pattern`)."""

    __slots__ = ("_bytes_pattern", "_count", "_pattern", "hosts_pattern")

    def __init__(
        self, secrets: Iterable[str], *, text_only: Iterable[str] = (), hosts: Iterable[str] = ()
    ) -> None:
        relayed = {s for s in secrets if s}
        forms = relayed | {s for s in text_only if s}
        self._count = len(forms)
        self._pattern = _alternation(forms)
        ordered = sorted(relayed, key=len, reverse=True)
        self._bytes_pattern = (
            re.compile(b"|".join(re.escape(f.encode()) for f in ordered)) if ordered else None
        )
        self.hosts_pattern = _alternation(hosts, re.IGNORECASE)

    @classmethod
    def of(cls, upstreams: Iterable[Keyed]) -> Redactor:
        """The redactor of every configured upstream's secrets."""
        return cls(s for cfg in upstreams for s in secrets_of(cfg))

    def adopt(self, other: Redactor) -> None:
        """Redact what ``other`` does from now on (the config re-read on SIGHUP brought new
        keys): every holder of this redactor sees the change at once."""
        self._count = other._count
        self._pattern = other._pattern
        self._bytes_pattern = other._bytes_pattern
        self.hosts_pattern = other.hosts_pattern

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
        return self._pattern is not None or self.hosts_pattern is not None

    def __repr__(self) -> str:  # never the secrets themselves
        return f"<Redactor of {self._count} secret forms>"


NO_SECRETS = Redactor(())

# what callers hand the scrubber: the app's compiled redactor, or strings (a client's own)
Secrets = Redactor | Iterable[str]


def redactor(secrets: Secrets) -> Redactor:
    """``secrets`` as a redactor (strings are compiled: an error path's cost, not a chunk's)."""
    return secrets if isinstance(secrets, Redactor) else Redactor(secrets)
