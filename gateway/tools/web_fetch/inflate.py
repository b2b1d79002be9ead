"""Undoing a response's ``Content-Encoding`` in chunks, never past a cap.

aiohttp's own decompression is off (``auto_decompress=False``): it inflates a chunk whole,
so a gzip bomb (a few kilobytes that inflate to gigabytes) would be held in memory before any
cap could look at it. Here each decoder is asked for at most what the cap still allows plus
one byte (zlib's ``max_length``, brotli's ``output_buffer_limit``); the byte past the cap is the
proof that the body is too large, and the work stops there. Cost: each wire byte is inflated
once; what one call returns is bounded by the cap, whatever the ratio.

Codings: ``identity``, ``gzip`` / ``x-gzip`` (several members in a row too), ``deflate`` (the
zlib format RFC 9110 names, and the raw deflate some servers send instead), ``br`` when the
``brotli`` package (1.2 or later: the output limit) is installed. A chain of codings
(``gzip, br``) is undone from the last applied, at most :data:`MAX_CODINGS` of them.
"""

from __future__ import annotations

import zlib
from typing import Any, Protocol

__all__ = ["ACCEPT_ENCODING", "MAX_CODINGS", "BadEncoding", "Inflater", "PastCap", "decoder"]

try:  # optional: aiohttp[speedups] brings it; 1.2 added the output limit
    import brotli as _brotli

    _HAS_BROTLI = hasattr(_brotli.Decompressor(), "can_accept_more_data")
except ImportError:  # pragma: no cover - depends on the environment
    _brotli = None
    _HAS_BROTLI = False

MAX_CODINGS = 2
_STAGE = 64 * 1024  # bytes of a middle stage handed on at a time
ACCEPT_ENCODING = "gzip, deflate, br" if _HAS_BROTLI else "gzip, deflate"


class PastCap(Exception):
    """The inflated body passed its cap."""


class BadEncoding(Exception):
    """A coding this module does not undo, or data that is not in it."""


class Inflater(Protocol):
    def feed(self, data: bytes, limit: int) -> bytes:
        """Decoded bytes of ``data``, at most ``limit + 1`` of them (the caller's cap
        check sees the one past it); raises BadEncoding."""
        ...

    def flush(self, limit: int) -> bytes:
        """What is left once the input ended (at most ``limit + 1`` bytes)."""
        ...


class _Identity:
    __slots__ = ()

    def feed(self, data: bytes, limit: int) -> bytes:
        return data

    def flush(self, limit: int) -> bytes:
        return b""


class _Zlib:
    """gzip (members in a row) or deflate (zlib format, or raw when the header is not).
    Input that a capped call left unread is kept and read first by the next call."""

    __slots__ = ("_d", "_gzip", "_head", "_pending", "_wbits")

    def __init__(self, gzip: bool) -> None:
        self._gzip = gzip
        self._wbits = 16 + zlib.MAX_WBITS if gzip else zlib.MAX_WBITS
        self._d: Any = None
        self._head = b""
        self._pending = b""

    def _start(self, data: bytes) -> bytes:
        if not self._gzip:
            # RFC 9110's deflate is the zlib format; some servers send raw deflate: a zlib
            # header is two bytes whose big-endian value is a multiple of 31, method 8
            self._head += data
            if len(self._head) < 2:
                return b""
            data, self._head = self._head, b""
            zlib_header = (data[0] & 0x0F) == 8 and ((data[0] << 8) | data[1]) % 31 == 0
            self._wbits = zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS
        self._d = zlib.decompressobj(self._wbits)
        return data

    def feed(self, data: bytes, limit: int) -> bytes:
        if self._pending:
            data, self._pending = self._pending + data, b""
        if self._d is None:
            data = self._start(data)
            if self._d is None:
                return b""
        out = bytearray()
        try:
            while data:
                d = self._d
                out += d.decompress(data, limit + 1 - len(out))
                if d.unconsumed_tail:
                    data = d.unconsumed_tail
                elif d.eof and d.unused_data:
                    if not self._gzip:
                        raise BadEncoding("data after the deflate stream")
                    data = d.unused_data  # the next gzip member
                    self._d = zlib.decompressobj(self._wbits)
                else:
                    break
                if len(out) > limit:
                    self._pending = data
                    break
        except zlib.error:
            raise BadEncoding("corrupt compressed data") from None
        return bytes(out)

    def flush(self, limit: int) -> bytes:
        out = bytearray()
        while self._pending and len(out) <= limit:
            out += self.feed(b"", limit - len(out))
        if len(out) > limit:
            return bytes(out)
        if self._d is None:
            if self._head:
                raise BadEncoding("truncated compressed data")
            return b""
        if not self._d.eof:
            raise BadEncoding("truncated compressed data")
        return bytes(out)


class _Brotli:
    """brotli's output limit is a floor where its buffer stops growing, not a ceiling: what
    one call produced past ``limit + 1`` is kept for the next."""

    __slots__ = ("_d", "_spill")

    def __init__(self) -> None:
        assert _brotli is not None
        self._d = _brotli.Decompressor()
        self._spill = b""

    def feed(self, data: bytes, limit: int) -> bytes:
        out = bytearray(self._spill)
        self._spill = b""
        d = self._d
        try:
            while len(out) <= limit and not d.can_accept_more_data():
                out += d.process(b"", output_buffer_limit=limit + 1 - len(out))
            if data:
                if len(out) > limit:  # the caller stops here (or drains before more input)
                    raise BadEncoding("input while output is pending")
                out += d.process(data, output_buffer_limit=limit + 1 - len(out))
                while len(out) <= limit and not d.can_accept_more_data():
                    out += d.process(b"", output_buffer_limit=limit + 1 - len(out))
        except _brotli.error:  # type: ignore[union-attr]
            raise BadEncoding("corrupt brotli data") from None
        if len(out) > limit + 1:
            self._spill = bytes(out[limit + 1 :])
            del out[limit + 1 :]
        return bytes(out)

    def flush(self, limit: int) -> bytes:
        out = self.feed(b"", limit)
        if len(out) <= limit and not self._d.is_finished():
            raise BadEncoding("truncated brotli data")
        return out


class _Chain:
    """Codings applied in order (``gzip, br``: gzip first) undone in reverse. A stage's
    output is taken :data:`_STAGE` bytes at a time (the decoders keep what a capped call left
    unread), so a stage in the middle is bounded by the cap of the last one."""

    __slots__ = ("_steps",)

    def __init__(self, steps: list[Inflater]) -> None:
        self._steps = steps  # innermost (last applied) first

    def _through(self, i: int, data: bytes, limit: int, final: bool) -> bytes:
        """``data`` through steps ``i`` and on, at most ``limit + 1`` bytes out; ``final``:
        the input ended, flush the steps."""
        if i == len(self._steps):
            return data
        step = self._steps[i]
        last = i + 1 == len(self._steps)
        out = bytearray()
        piece = step.feed(data, limit if last else _STAGE)
        while True:
            out += self._through(i + 1, piece, limit - len(out), False) if piece else b""
            if len(out) > limit or not piece:
                break
            piece = step.feed(b"", limit - len(out) if last else _STAGE)  # what was left unread
        while final and len(out) <= limit:  # a flush is capped too: repeat until empty
            rest = step.flush(limit - len(out) if last else _STAGE)
            if last:
                out += rest
                break
            out += self._through(i + 1, rest, limit - len(out), not rest)
            if not rest:
                break
        return bytes(out)

    def feed(self, data: bytes, limit: int) -> bytes:
        return self._through(0, data, limit, False)

    def flush(self, limit: int) -> bytes:
        return self._through(0, b"", limit, True)


def _one(coding: str) -> Inflater:
    if coding in ("", "identity"):
        return _Identity()
    if coding in ("gzip", "x-gzip"):
        return _Zlib(gzip=True)
    if coding == "deflate":
        return _Zlib(gzip=False)
    if coding == "br" and _HAS_BROTLI:
        return _Brotli()
    raise BadEncoding("unsupported content coding")


def decoder(content_encoding: str | None) -> Inflater:
    """The decoder for a ``Content-Encoding`` header; raises BadEncoding."""
    codings = [c.strip().lower() for c in (content_encoding or "").split(",")]
    codings = [c for c in codings if c not in ("", "identity")]
    if not codings:
        return _Identity()
    if len(codings) > MAX_CODINGS:
        raise BadEncoding("too many content codings")
    steps = [_one(c) for c in reversed(codings)]
    return steps[0] if len(steps) == 1 else _Chain(steps)
