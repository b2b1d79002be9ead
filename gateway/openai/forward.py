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
* where the body has a top-level ``stream`` and the route reads it (not embeddings), the bytes
  ``"stream"`` occur at most once: the gateway reads it to choose how to relay the reply,
  and decoders disagree on a duplicate key (ujson keeps the last, others the first, some
  refuse it), so an upstream must see the one value the gateway read (a body without it has
  no such key, however spelled: the decode would have found it). Other duplicate keys reach
  the upstream as the client wrote them, where the body encoded again had each key once;
* its value is a string written without escapes, equal (as UTF-8) to the alias decoded.

The scan reads the whole body once for ``"model"``, once more for ``"stream"`` where it is
read, and once more for ``\\u00`` where the body holds a backslash (found first by
``memchr``, 40 times faster than a search for several bytes); each pass costs about a third of
encoding the decoded body again on a 200 KB chat (ujson writes a long plain string at near
``memcpy`` speed), so on text the splice costs about what the encode did, and less on a body
of many small values (token ids, tool schemas); then one copy of the body.
"""

from __future__ import annotations

import functools
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


def model_span(raw: bytes, alias: str, *, stream: bool = True) -> tuple[int, int] | None:
    """Where the top-level ``model``'s value (``alias``, as decoded) is in ``raw``, its
    quotes included, or None where the bytes do not say for certain (see the module
    docstring). ``raw`` must be a body that decoded to an object whose ``model`` is
    ``alias``; ``stream``: whether it has a top-level ``stream`` the gateway reads."""
    key = raw.find(_MODEL)
    if key < 0 or raw.find(_MODEL, key + len(_MODEL)) >= 0:
        return None
    if stream and raw.count(_STREAM) > 1:
        return None
    if (
        raw.find(b"\\") >= 0
        and raw.find(b"\\u00") >= 0  # memchr first: most bodies have no escape
        and _ESCAPED_LETTER.search(raw) is not None
    ):
        return None
    start = key + len(_MODEL)
    if raw[start : start + 2] == b':"':  # compact, as most clients write it: no regex
        end = raw.find(b'"', start + 2)
        if raw.find(b"\\", start + 2, end) >= 0 or raw[start + 2 : end] != alias.encode():
            return None
        return start + 1, end + 1
    value = _PLAIN_VALUE.match(raw, start)
    if value is None or value[1] != alias.encode():
        return None
    return value.start(1) - 1, value.end(1) + 1


def splice(raw: bytes, span: tuple[int, int], upstream_model: str) -> bytes:
    """``raw`` with the bytes of ``span`` replaced by ``upstream_model`` as a JSON string
    (one copy of the body)."""
    return b"".join((raw[: span[0]], _encoded(upstream_model), memoryview(raw)[span[1] :]))


# the routes' upstream model names, each encoded once (bounded: a pattern route may name many)
_encoded = functools.lru_cache(maxsize=256)(jsonutil.dumpb_str)
