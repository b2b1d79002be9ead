"""The one place JSON is encoded and decoded.

ujson with its flags pinned so that golden bytes are stable: non-ASCII is
written as UTF-8 (``ensure_ascii=False``), ``/`` is not escaped, and NaN or
Infinity are never written (``allow_nan=False``). :func:`loads_upstream`
decodes upstream payloads as they come (the hot path of a stream), unchecked:
ujson reads ``NaN``, ``Infinity`` and ``1e400`` as floats and lone ``\\ud800``
escapes as strings, which :func:`dumpb` then refuses (``OverflowError``,
``UnicodeEncodeError``). What writes an upstream's value again (an in-band error
body, a rewritten chunk) uses :func:`dumpb_upstream`: those become ``null`` and
U+FFFD, at no cost to the values that encode.

:func:`loads` decodes what a client sent, strictly and within bounds. What
ujson accepts and a client body may not hold:

* ``NaN`` and ``Infinity`` literals, and numbers that overflow to infinity
  (``1e400``): they are not JSON, and nothing can encode them again;
* lone UTF-16 surrogates, as ``\\ud800`` escapes or as their UTF-8 bytes
  (``ED A0 80``): they are not Unicode, so the body could not be encoded for
  the upstream (a pair, ``\\ud83d\\ude00``, is one character and fine);
* nesting deeper than :data:`MAX_NESTING` (ujson itself refuses past 1,024).

One walk over the decoded value finds them: level by level, no recursion, no
path built (about 50 ns a value: 0.08 ms for a Claude Code-shaped 100 KB
request, where the regex and stdlib re-parse it replaces took 1.2 ms, and
recursed). Only a body that fails goes through a second walk that names the
first offending path (:class:`JSONInputError`).

Decoding time is bounded by the body's size: integers past 64 bits are
converted by ``PyLong_FromString``, whose cost grows with the square of the
digits (a 32 MiB body of 4,299-digit integers took 0.7 s), so ujson runs under
the interpreter's lowest digit limit (640 digits, ``sys.int_info``): the worst
32 MiB body of integers now takes 0.2 s (639 digits each), a longer one is
refused at its first. The cyclic garbage collector is off for the call: a tree
of half a million lists decodes in 20 ms instead of 60 (each collection it
triggered walked the tree built so far). Both are interpreter-wide, set for the
ujson call only (ujson holds the GIL throughout) and restored when the last
decode running ends (one may run in a thread while another runs on the loop).

Decoding memory is bounded before decoding: a value built from a few bytes
(``[]`` is 3 bytes and 64 of Python objects) lets a 32 MiB body grow past
800 MB. :func:`too_many_values` counts, at C speed, the bytes that precede
every value but the first (``,`` ``:`` ``[`` ``{``): an upper bound of the
values ujson can build, strings included; where it is over the limit it counts
again without the bytes inside strings (a prompt of code or CSV holds many).
"""

from __future__ import annotations

import gc
import re
import sys
import threading
from collections.abc import Sequence
from typing import Any

import ujson

__all__ = [
    "MAX_NESTING",
    "MAX_VALUES",
    "JSONInputError",
    "dumpb",
    "dumpb_upstream",
    "dumps",
    "loads",
    "loads_upstream",
    "too_many_values",
]


# How deep a client body may nest (the top-level object is level 1). The Messages API
# nests tool inputs and schemas up to 64 levels of their own, about 6 levels down.
MAX_NESTING = 128
# How many values a client body may decode to: at most about 38 MB of Python objects (an
# empty list, the costliest value for its 3 bytes, is 56 bytes plus its 8-byte slot), where
# Claude Code's 100 KB requests hold about 2,000 values and OpenAI's embeddings take at most
# 300,000 token ids. A body of text or code holds a few values, whatever its size.
MAX_VALUES = 1 << 19
_INT_DIGITS = 640  # sys.int_info.str_digits_check_threshold: the lowest limit allowed
_SURROGATE = re.compile("[\ud800-\udfff]")
_PATH_SHOWN = 120  # characters of a path named in a message


class JSONInputError(ValueError):
    """A client body that is JSON, but holds what no request may (see the module doc)."""

    def __init__(self, path: str, why: str) -> None:
        self.path = path
        self.why = why
        super().__init__(f"{path}: {why}" if path else why)


# ujson.dumps's flags by position (ensure_ascii, encode_html_chars, escape_forward_slashes,
# sort_keys, indent, allow_nan): its keyword parse makes a str per keyword name, about 5 K
# instructions a call, a third of a small body's encoding. The flags are the module doc's:
# ensure_ascii=False, escape_forward_slashes=False, allow_nan=False (the rest their
# defaults); tests/unit/text/test_jsonutil.py holds them to the keywords' bytes.
_FLAGS = (False, False, False, False, 0, False)


def dumps(obj: Any) -> str:
    return ujson.dumps(obj, *_FLAGS)


def dumpb(obj: Any) -> bytes:
    return ujson.dumps(obj, *_FLAGS).encode()


def dumpb_upstream(obj: Any) -> bytes:
    """:func:`dumpb` for a value decoded from an upstream (:func:`loads_upstream`): a
    number JSON cannot hold (NaN, an infinity) written as null, a lone surrogate as U+FFFD
    (see the module doc). Only a value that fails to encode is walked."""
    try:
        return dumpb(obj)
    except (OverflowError, UnicodeEncodeError):
        return dumpb(_encodable(obj))


def _encodable(value: Any) -> Any:
    """A copy of ``value`` that :func:`dumpb` writes; level by level, no recursion (a
    decoded value nests up to ujson's 1,024 levels)."""
    root: list[Any] = [None]
    todo: list[tuple[Any, Any, Any]] = [(value, root, 0)]  # (value, its holder, its key)
    while todo:
        node, holder, key = todo.pop()
        kind = type(node)
        if kind is dict:
            copy: Any = {}
            for k, v in node.items():
                k = _SURROGATE.sub("\ufffd", k) if type(k) is str else k
                copy[k] = None  # the keys in their order; the values filled in below
                todo.append((v, copy, k))
        elif kind is list:
            copy = [None] * len(node)
            todo.extend((v, copy, i) for i, v in enumerate(node))
        elif kind is float:
            copy = node if node - node == 0.0 else None  # inf - inf and nan - nan are nan
        elif kind is str:
            copy = _SURROGATE.sub("\ufffd", node)
        else:
            copy = node
        holder[key] = copy
    return root[0]


# A string with nothing JSON escapes (quote, backslash, control characters): with
# ensure_ascii=False and escape_forward_slashes=False, ujson writes it as is, in quotes.
_PLAIN_STRING = re.compile(r'[^"\\\x00-\x1f]*+').fullmatch


def dumpb_str(text: str) -> bytes:
    """``dumpb(text)`` for a str, the same bytes, without ujson for text that needs no
    escape (a stream's deltas, one per chunk). A lone surrogate raises UnicodeEncodeError
    as :func:`dumpb` does."""
    if _PLAIN_STRING(text) is not None:
        return b'"%s"' % text.encode()
    return dumpb(text)


# The digit limit and the collector are set while any decode runs and restored when the
# last one ends: a decode may run in a thread (tools/web_search/searxng.py decodes a big search
# answer in one) while another runs on the loop, and saving and restoring per call would
# leave the interpreter at the lowered limit when the calls interleave.
_SETTINGS = threading.Lock()
_decoding = 0  # decodes running now
_restore = (0, False)  # (the digit limit, the collector on?) before the first of them


def _settle() -> None:
    global _decoding, _restore
    with _SETTINGS:
        if not _decoding:
            _restore = (sys.get_int_max_str_digits(), gc.isenabled())
            sys.set_int_max_str_digits(_INT_DIGITS)
            gc.disable()  # a decoded tree holds no cycle: collections while it grows are wasted
        _decoding += 1


def _unsettle() -> None:
    global _decoding
    with _SETTINGS:
        _decoding -= 1
        if not _decoding:
            sys.set_int_max_str_digits(_restore[0])
            if _restore[1]:
                gc.enable()


def loads(data: bytes | bytearray | str) -> Any:
    """Decode strict JSON; raises ValueError on anything that is not, JSONInputError (a
    ValueError) naming the path for what no request may hold."""
    if type(data) is bytearray:  # ujson before 5.8 takes str and bytes only
        data = bytes(data)
    if len(data) <= _INT_DIGITS:
        # no number in it can pass the digit limit, and a decode this small allocates too
        # little for a collection to matter: no settings to change (most requests' bodies)
        try:
            value = ujson.loads(data)
        except (ValueError, OverflowError) as exc:
            raise _decode_error(exc) from None
    else:
        _settle()
        try:
            value = ujson.loads(data)
        except (ValueError, OverflowError) as exc:  # ujson.JSONDecodeError is a ValueError
            raise _decode_error(exc) from None
        finally:
            _unsettle()
    if _suspect(value):
        raise _first_problem(value)
    return value


def _decode_error(exc: BaseException) -> ValueError:
    text = str(exc)
    if "depth limit" in text:
        return JSONInputError("", f"nesting deeper than {MAX_NESTING} levels")
    if "digits" in text:
        return JSONInputError("", f"a number has more than {_INT_DIGITS} digits")
    return ValueError(text)


def loads_upstream(data: bytes | str) -> Any:
    """Decode an upstream payload (hot path: one per stream chunk).

    No checks: the gateway only copies strings and integers out of upstream JSON,
    and anything it re-encodes goes through ``allow_nan=False``.
    """
    try:
        return ujson.loads(data)
    except (ValueError, OverflowError) as exc:
        raise ValueError(str(exc)) from None


# --- the walk ------------------------------------------------------------------------


def _suspect(value: Any) -> bool:
    """Whether ``value`` holds a non-finite number, a lone surrogate or nests too deep.

    Level by level: one list per level, no per-value tuples or paths (the hot path).
    ``str.isascii`` reads a flag, so only non-ASCII strings are searched.
    """
    kind = type(value)
    if kind is str:
        return not value.isascii() and _SURROGATE.search(value) is not None
    if kind is float:
        return value - value != 0.0  # inf - inf and nan - nan are nan
    if kind is not dict and kind is not list:
        return False
    level = [value]
    depth = 0
    search = _SURROGATE.search
    while level:
        depth += 1
        if depth > MAX_NESTING:
            return True
        below: list[Any] = []
        push = below.append
        for node in level:
            if type(node) is dict:
                for key in node:
                    if not key.isascii() and search(key):
                        return True
                items = node.values()
            else:
                items = node
            for item in items:
                kind = type(item)
                if kind is str:
                    if not item.isascii() and search(item):
                        return True
                elif kind is dict or kind is list:
                    push(item)
                elif kind is float and item - item != 0.0:
                    return True
        level = below
    return False


def _first_problem(value: Any) -> JSONInputError:
    """The error naming an offending path, the shallowest first (the slow path).

    Level by level as :func:`_suspect`, each container remembering its parent and its key
    (three list appends), so that half a million values cost no path each.
    """
    problem = _leaf_problem(value)
    if problem is not None or not isinstance(value, (dict, list)):
        return _problem([], problem or "request body is not valid JSON")
    seen: list[Any] = [value]
    owner = [-1]  # index in seen of each container's parent
    names: list[Any] = [""]  # each container's key or index in its parent
    level = [0]
    depth = 1
    while level:
        below: list[int] = []
        for index in level:
            node = seen[index]
            if type(node) is dict:
                for key in node:
                    match = _SURROGATE.search(key)
                    if match:
                        return _problem(
                            _path(index, owner, names),
                            "a key " + _lone(match[0]).removeprefix("string "),
                        )
                children: Any = node.items()
            else:
                children = enumerate(node)
            for key, item in children:
                kind = type(item)
                if kind is str or kind is float:
                    problem = _leaf_problem(item)
                    if problem is not None:
                        return _problem([*_path(index, owner, names), str(key)], problem)
                elif kind is dict or kind is list:
                    if depth == MAX_NESTING:  # the path to where it starts is enough
                        path = [*_path(index, owner, names), str(key)]
                        return _problem(
                            path[:8], f"nesting deeper than {MAX_NESTING} levels", cut=len(path) > 8
                        )
                    seen.append(item)
                    owner.append(index)
                    names.append(key)
                    below.append(len(seen) - 1)
        level = below
        depth += 1
    return _problem([], "request body is not valid JSON")  # not reached


def _path(index: int, owner: list[int], names: list[Any]) -> list[str]:
    parts: list[str] = []
    while index > 0:
        parts.append(str(names[index]))
        index = owner[index]
    return parts[::-1]


def _leaf_problem(value: Any) -> str | None:
    kind = type(value)
    if kind is str:
        if value.isascii():
            return None
        match = _SURROGATE.search(value)
        return _lone(match[0]) if match else None
    if kind is float and value - value != 0.0:
        return "NaN is not a JSON number" if value != value else "number out of range"
    return None


def _lone(char: str) -> str:
    return (
        f"string is not valid Unicode: it holds a lone surrogate (U+{ord(char):04X}, "
        "half of a UTF-16 pair)"
    )


def _problem(parts: Sequence[str], why: str, *, cut: bool = False) -> JSONInputError:
    path = ".".join(parts)
    if not path.isascii():  # a key is client text: no surrogate may reach a message
        path = path.encode("utf-8", "backslashreplace").decode("utf-8")
    if cut or len(path) > _PATH_SHOWN:
        path = path[:_PATH_SHOWN] + "..."
    return JSONInputError(path, why)


# --- the value bound -----------------------------------------------------------------


_SEPARATORS = (b",", b":", b"[", b"{")  # the byte before every value but the first


def _separators(raw: bytes | bytearray) -> int:
    return sum(map(raw.count, _SEPARATORS))


def too_many_values(raw: bytes | bytearray, limit: int = MAX_VALUES) -> bool:
    """Whether ``raw`` could decode to more than ``limit`` values (decided before decoding).

    Every value but the top-level one follows a ``,``, ``:``, ``[`` or ``{`` of its own, up
    to where ujson stops (at the first error), so their count plus one bounds the values
    ujson builds, for any bytes. A body shorter than ``limit`` bytes is not counted (a value
    takes a byte); a longer one costs four ``bytes.count`` (about 10 ms each for 32 MiB).
    Over the limit, the separators inside strings are taken off: with escaped backslashes
    and quotes removed, every quote opens or closes a string, at the boundaries ujson finds
    (up to its first error). A body holding more strings than the limit is over it anyway.
    """
    if len(raw) < limit:
        return False
    count = _separators(raw)
    if count < limit:
        return False
    if b"\\" in raw:  # one memchr; the two copies only when some string holds an escape
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    quotes = raw.count(b'"')
    if quotes // 2 >= limit:
        return True
    return count - _separators_in_strings(raw, quotes) + 1 > limit


_FEW_QUOTES = 4096  # below it, strings are measured in place; above, split out (a copy)


def _separators_in_strings(raw: bytes | bytearray, quotes: int) -> int:
    if quotes > _FEW_QUOTES:
        return _separators(b"".join(raw.split(b'"')[1::2]))
    inside = 0
    start = raw.find(b'"')
    while start >= 0:  # at most quotes / 2 + 1 rounds
        end = raw.find(b'"', start + 1)
        stop = len(raw) if end < 0 else end  # an unterminated string runs to the end
        inside += sum(raw.count(separator, start, stop) for separator in _SEPARATORS)
        start = -1 if end < 0 else raw.find(b'"', end + 1)
    return inside
