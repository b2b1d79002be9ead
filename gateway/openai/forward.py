"""A pass-through body as it goes upstream: the client's bytes with the value of the top-level
``model`` replaced by the route's ``upstream_model``, instead of the decoded body encoded again.

The body is still decoded, strictly, first (:mod:`gateway.http.body`): that decode is what
refuses a body that is not JSON or holds what no request may (a lone surrogate, a NaN, an
overflowing number, nesting past 128 levels, too many values), naming the path, and JSON can
only be validated by reading all of it. What is saved is the second pass: encoding the decoded
body again (as costly as the decode itself, and a second copy of a large body built from
Python objects). The bytes that go upstream are the client's, whitespace and number spelling
included, which is what an upstream sent them directly would read.

The value is spliced only where a scan of the bytes is certain which bytes hold the top-level
``model``'s value; anywhere else the decoded body is encoded again as before:

* the bytes ``"model"`` occur exactly once, and no ``\\u00XX`` escape of an ASCII letter
  occurs: JSON writes a letter either as itself or as such an escape, so the top-level key
  the decode found is written as those bytes, and no other key, nested object or string holds
  them (a duplicate ``model`` key, which the decode resolved to its last value, falls back);
* the bytes ``"stream"`` occur at most once: the gateway reads ``stream`` to choose how to
  relay the reply, and decoders disagree on a duplicate key (ujson keeps the last, others the
  first, some refuse it), so an upstream must see the one value the gateway read; a body the
  gateway re-encodes has each key once. Other duplicate keys reach the upstream as the client
  wrote them;
* its value is a string written without escapes, equal (as UTF-8) to the alias decoded.

Each test is a ``bytes.count``/``find`` or an anchored match (at C speed); a ``\\u00``
escape, rare in a client's body (non-ASCII text escaped is ``\\u00e9`` or past it), costs one
regex search.
"""

from __future__ import annotations

import re

from gateway.text import jsonutil

__all__ = ["model_span", "splice"]

_MODEL = b'"model"'
_STREAM = b'"stream"'
# An escape of an ASCII letter (U+0040-U+007F): how a key could spell model or stream in
# bytes other than their own. \u00 escapes of non-ASCII text (U+0080-U+00FF) are not it.
_ESCAPED_LETTER = re.compile(rb"\\u00[4-7][0-9a-fA-F]")
# After the key: the colon, and a string value without escapes (JSON whitespace either side).
_PLAIN_VALUE = re.compile(rb'[ \t\n\r]*:[ \t\n\r]*"([^"\\]*)"')


def model_span(raw: bytes, alias: str) -> tuple[int, int] | None:
    """Where the top-level ``model``'s value (``alias``, as decoded) is in ``raw``, its
    quotes included, or None where the bytes do not say for certain (see the module
    docstring). ``raw`` must be a body that decoded to an object whose ``model`` is
    ``alias``."""
    if raw.count(_MODEL) != 1 or raw.count(_STREAM) > 1:
        return None
    if b"\\u00" in raw and _ESCAPED_LETTER.search(raw) is not None:
        return None
    value = _PLAIN_VALUE.match(raw, raw.find(_MODEL) + len(_MODEL))
    if value is None or value[1] != alias.encode():
        return None
    return value.start(1) - 1, value.end(1) + 1


def splice(raw: bytes, span: tuple[int, int], upstream_model: str) -> bytes:
    """``raw`` with the bytes of ``span`` replaced by ``upstream_model`` as a JSON string
    (one copy of the body)."""
    view = memoryview(raw)
    return b"".join((view[:span[0]], jsonutil.dumpb_str(upstream_model), view[span[1]:]))

