"""Server-sent events: an incremental decoder for upstream bodies and the encoder for ours.

Protocol facts relied on (WHATWG "server-sent events" parsing, which is also how the
Anthropic SDKs and OpenAI-compatible servers read and write SSE):

- A line ends with LF, CRLF or a lone CR. A CRLF may be split across two reads.
- A blank line dispatches the event. Several ``data:`` lines are joined with LF.
- ``field: value``: one optional space after the colon is dropped; a line with no colon
  is a field with an empty value. Lines starting with ``:`` are comments (keepalives).
- Only ``data`` matters to the gateway; ``id`` and ``retry`` are ignored. Chat and
  completions upstreams send bare ``data:`` events; a Responses stream names each event
  (``event: response.created``), and :meth:`SSEDecoder.feed_named` keeps that name so
  the pass-through can frame the event again as it came.
- An event whose data is empty is never useful (clients skip it), so it is not returned.

The decoder works per line with ``bytes.split``/``bytes.find`` (no per-byte Python loop)
and keeps only the unfinished line and the current event's data lines, so memory per
stream is bounded by ``max_event_bytes``: a single line or event larger than that raises
:class:`SSEEventTooLarge` (an upstream that never sends a line end must not grow us without limit).

Our own output is always ``event: NAME\\ndata: <one-line JSON>\\n\\n`` (LF only), the form
every Anthropic client accepts.
"""

from __future__ import annotations

__all__ = ["SSEDecoder", "SSEEventTooLarge", "encode_event"]

# A byte string is looked for with ``find``, not ``in``: CPython 3.11's ``bytes in bytes``
# first reads its operand as an int, raising (and clearing) a TypeError with a formatted
# message each time, at twice find's time; the decoder looks once or twice per event.
_LF = b"\n"
_CR = b"\r"
_DATA = b"data"
_EVENT = b"event"


MAX_EVENT_BYTES = 8 * 1024 * 1024  # the default bound on one line or event


class SSEEventTooLarge(Exception):
    """An SSE line or event past the decoder's size bound: the upstream's fault, never ours.

    Its own type (not ``ValueError``) so that a caller catching it cannot also swallow a bug
    of the translator's and report it as the upstream's malformed stream.
    """


class SSEDecoder:
    """Bytes in (any split), complete events' ``data`` payloads out."""

    __slots__ = ("_data", "_event", "_line", "_max", "_names", "_size", "_skip_lf")

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._line = b""  # the unfinished last line
        self._data: list[bytes] = []  # data lines of the event being read
        self._size = 0  # bytes in self._data (plus joins)
        self._skip_lf = False  # the previous chunk ended with CR: a leading LF is its pair
        self._event = b""  # the event field of the event being read
        self._names: list[bytes] | None = None  # while feed_named runs: each payload's name

    def feed(self, chunk: bytes) -> list[bytes]:
        if not chunk:
            return []
        if (
            chunk.find(_CR) < 0
            and not self._line
            and not self._data
            and not self._event
            and not self._skip_lf
            and self._names is None
        ):
            return self._whole_events(chunk)
        return self._lines(chunk)

    def _whole_events(self, chunk: bytes) -> list[bytes]:
        """Between events, no CR: split at blank lines; an event that is one ``data: ``
        line is its payload at once (what every upstream sends), any other goes line by
        line. The same events as :meth:`_lines`, without a Python step per line."""
        parts = chunk.split(b"\n\n")
        rest = parts.pop()
        out: list[bytes] = []
        for event in parts:
            if event[:6] == b"data: " and event.find(_LF) < 0:
                if len(event) - 5 > self._max:
                    raise SSEEventTooLarge("SSE event exceeds the size limit")
                if len(event) > 6:
                    out.append(event[6:])
            else:
                for line in event.split(_LF):
                    self._line_in(line, out)
                self._line_in(b"", out)
        if rest:
            out += self._lines(rest)
        return out

    def _lines(self, chunk: bytes) -> list[bytes]:
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == _LF:
                chunk = chunk[1:]
        if chunk.find(_CR) >= 0:
            # A trailing CR ends its line now; remember it so a LF that opens the next
            # chunk is not read as a second (blank) line.
            self._skip_lf = chunk[-1:] == _CR
            chunk = chunk.replace(b"\r\n", _LF).replace(_CR, _LF)
        parts = chunk.split(_LF)
        if len(parts) == 1:
            self._line += chunk
            if len(self._line) > self._max:
                raise SSEEventTooLarge("SSE line exceeds the size limit")
            return []
        parts[0] = self._line + parts[0]
        self._line = parts.pop()
        if len(self._line) > self._max:
            raise SSEEventTooLarge("SSE line exceeds the size limit")
        out: list[bytes] = []
        for line in parts:
            self._line_in(line, out)
        return out

    def feed_named(self, chunk: bytes) -> list[tuple[bytes, bytes]]:
        """:meth:`feed`, each payload paired with its event's name (b"" when unnamed)."""
        names: list[bytes] = []
        self._names = names
        try:
            payloads = self.feed(chunk)
        finally:
            self._names = None
        return list(zip(names, payloads, strict=True))

    def flush_named(self) -> list[tuple[bytes, bytes]]:
        """:meth:`flush`, each payload paired with its event's name (b"" when unnamed)."""
        names: list[bytes] = []
        self._names = names
        try:
            payloads = self.flush()
        finally:
            self._names = None
        return list(zip(names, payloads, strict=True))

    @property
    def idle(self) -> bool:
        """Between events: no partial line or event held."""
        return not self._line and not self._data and not self._event and not self._skip_lf

    def flush(self) -> list[bytes]:
        """End of body: an unterminated last line and event still count."""
        out: list[bytes] = []
        if self._line:
            line, self._line = self._line, b""
            self._line_in(line, out)
        self._line_in(b"", out)
        self._skip_lf = False
        return out

    def _line_in(self, line: bytes, out: list[bytes]) -> None:
        if not line:
            if self._data:
                payload = self._data[0] if len(self._data) == 1 else _LF.join(self._data)
                self._data = []
                self._size = 0
                if payload:
                    out.append(payload)
                    if self._names is not None:
                        self._names.append(self._event)
            if self._event:
                self._event = b""
            return
        colon = line.find(b":")
        if colon == 0:
            return  # comment
        if colon < 0:
            field, value = line, b""
        else:
            field = line[:colon]
            value = line[colon + 2 :] if line[colon + 1 : colon + 2] == b" " else line[colon + 1 :]
        if field != _DATA:
            if field == _EVENT:
                self._event = value
            return
        self._size += len(value) + 1
        if self._size > self._max:
            raise SSEEventTooLarge("SSE event exceeds the size limit")
        self._data.append(value)


def encode_event(name: str, data_json: bytes) -> bytes:
    """One Anthropic event frame; ``data_json`` must be one line of JSON."""
    return b"event: " + name.encode("ascii") + b"\ndata: " + data_json + b"\n\n"
