"""The items of a JSON object's one array member, read one at a time from the raw bytes.

A Message Batches create is ``{"requests": [item, ...]}`` of up to 256 MiB; decoded at once,
100,000 requests became several hundred MB of Python objects, on top of the bytes, the
copies sent to and back from the decoding child and the re-encoded requests.
:class:`ArrayItems` hands out each item's JSON text instead, which the caller decodes alone
(strictly: :func:`gateway.text.jsonutil.loads`) and drops before the next.

It reads only the plain shape: ``{``, the one key (written as is), ``:``, ``[``, items
separated by ``,``, ``]``, ``}``, JSON whitespace between them, nothing after. Any other body
(another key, a repeated or escaped key, an empty array, bytes after the end, an item that
does not parse, bytes that are not UTF-8) raises :class:`NotPlain`, and the caller decodes
the body whole as before, which answers it exactly as it always did; so do a body whose
separators pass ``max_values`` (the values the whole decode would refuse past) and an
item larger than the window with more than ``max_item_values`` (scanned, it would build
them all at once).

Where an item ends is found by the standard library's JSON scanner (C; a Python scan of the
bytes was 100 ns a byte here), over a window of the body decoded to text: at most
:data:`WINDOW` bytes of it beyond the item being read (a str of non-ASCII text can take 4
bytes a character: the whole body as one str could be four times its size). The window
grows only for an item larger than it. Cost: each item scanned twice (here and by its
decode), O(body) in all; :meth:`ArrayItems.next` is called per item, so the caller gives
the event loop turns between slices.
"""

from __future__ import annotations

import codecs
import json
import re

__all__ = ["WINDOW", "ArrayItems", "NotPlain"]

WINDOW = 1 << 20  # bytes of the body decoded to text ahead of the item being read
_WS = "[ \t\n\r]*"
_NEXT = re.compile(_WS + "([,\\]])" + _WS)
_END = re.compile(_WS + "\\}" + _WS + "\\Z")
_SCAN = json.JSONDecoder().raw_decode
_HEAD_CHARS = 4096  # the opening up to the first item, at most (whitespace is all it adds)


class NotPlain(Exception):
    """The body is not the plain shape :class:`ArrayItems` reads: decode it whole."""


class ArrayItems:
    """The items of ``raw``'s array under ``key``, as JSON text, by :meth:`next`."""

    __slots__ = (
        "_at",
        "_decoder",
        "_max_item_values",
        "_max_values",
        "_raw",
        "_read",
        "_text",
        "_values",
        "done",
    )

    def __init__(
        self, raw: bytes | bytearray, key: str, *, max_values: int, max_item_values: int
    ) -> None:
        self._raw = raw
        self._max_values = max_values
        self._max_item_values = max_item_values
        self._values = 0  # separators seen: a bound on the values of what was read
        self._read = 0  # bytes of raw decoded into the window so far
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self._text = ""
        self._at = 0  # where the next item starts in the window
        self.done = False
        opening = re.compile(
            _WS + "\\{" + _WS + re.escape(json.dumps(key)) + _WS + ":" + _WS + "\\[" + _WS
        )
        while (head := opening.match(self._text)) is None or head.end() == len(self._text):
            if self._read == len(raw) or len(self._text) > _HEAD_CHARS:
                raise NotPlain
            self._more(WINDOW)
        if self._text[head.end()] != "{":
            raise NotPlain
        self._at = head.end()

    def next(self) -> str:
        """The next item's JSON text (an object); :attr:`done` once the body's end is read."""
        if self.done:
            raise NotPlain
        want = WINDOW
        while True:
            try:
                _, end = _SCAN(self._text, self._at)
            except (ValueError, RecursionError):
                end = -1
            sep = _NEXT.match(self._text, end) if end >= 0 else None
            if sep is not None and (sep.end() < len(self._text) or self._read == len(self._raw)):
                break
            if self._read == len(self._raw):  # the whole body is in the window: no item
                raise NotPlain
            if _separators(self._text, self._at) > self._max_item_values:
                raise NotPlain  # not scanned: its objects are bounded by the whole decode's
            self._more(want)  # the item (or what follows it) runs past the window
            want *= 2
        item = self._text[self._at : end]
        if item[:1] != "{":
            raise NotPlain
        self._at = sep.end()
        if sep.group(1) == "]":
            self._more(len(self._raw))
            if _END.match(self._text, self._at) is None:
                raise NotPlain
            self.done = True
        return item

    def _more(self, size: int) -> None:
        """Decode ``size`` more bytes into the window, dropping what was read."""
        chunk = self._raw[self._read : self._read + size]
        self._read += len(chunk)
        try:
            text = self._decoder.decode(chunk, final=self._read == len(self._raw))
        except UnicodeDecodeError:
            raise NotPlain from None
        self._values += _separators(text, 0)
        if self._values > self._max_values:
            raise NotPlain
        self._text = self._text[self._at :] + text
        self._at = 0


def _separators(text: str, start: int) -> int:
    """Separators (``,``, ``:``, ``[``, ``{``) from ``start``: every value but the first
    follows one, so this plus one bounds the values a scan of the text builds."""
    return sum(text.count(sep, start) for sep in ",:[{")
