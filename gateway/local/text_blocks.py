"""The blocks of :mod:`.text_tools`: where a call that starts at a marker ends, and the calls
it holds.

A block is read by a scanner fed the text after its marker a piece at a time (the deltas of
a stream, or one whole message) that goes on from where the last piece left it: it never
looks at a character twice, whatever the cut. It answers where the block ends, counted from
its marker, or None while it may still go on; :meth:`calls` (or :meth:`final`, at the end of
the stream) then reads the whole block, once. Every search here is a plain substring search
or a regular expression that cannot backtrack: the work is linear in the text.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from gateway.text import jsonutil

__all__ = ["HERMES_OPEN", "MISTRAL", "HermesBlock", "MistralBlock", "TextToolCall", "whole_call"]

HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL, _MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"
_FUNCTION = ("<function=", "</function>")
_PARAMETER = ("<parameter=", "</parameter>")
_TAG_NAME_END = re.compile(r"[>\n]")  # a tag's name is [^>\n]+ closed by ">"
_SPACE = re.compile(r"\s*")
_NAME = re.compile(r"[\w.\-]*")
_MAX_NAME = 256  # longer is no tool name: the marker was text
# In JSON, outside a string: what changes the depth or opens a string; inside: what ends it.
_OUTSIDE = re.compile(r'[{}\[\]"]')
_INSIDE = re.compile(r'["\\]')
_WHOLE = re.compile(r"\s*(?:<\|python_tag\|>)?\s*")


class TextToolCall(NamedTuple):
    name: str
    arguments: str  # JSON text of the arguments object, repaired later (tool_args)


class _Json:
    """Where a JSON object or array ends (its brackets counted, strings skipped), read a
    piece at a time: the state between pieces is the depth and whether a string, or an
    escape in one, is open."""

    __slots__ = ("depth", "escape", "string")

    def __init__(self) -> None:
        self.depth = 0
        self.string = False
        self.escape = False

    def scan(self, text: str, pos: int, hi: int) -> int | None:
        """Where in ``text`` the value closes, or None if not by ``hi``."""
        while pos < hi:
            if self.escape:
                self.escape = False
                pos += 1
            elif self.string:
                part = _INSIDE.search(text, pos, hi)
                if part is None:
                    return None
                self.string = part[0] == "\\"
                self.escape = self.string
                pos = part.end()
            else:
                part = _OUTSIDE.search(text, pos, hi)
                if part is None:
                    return None
                pos = part.end()
                bracket = part[0]
                if bracket == '"':
                    self.string = True
                elif bracket == "{" or bracket == "[":
                    self.depth += 1
                else:
                    self.depth -= 1
                    if self.depth == 0:
                        return pos
        return None


class HermesBlock:
    """``<tool_call>`` up to the first ``</tool_call>``."""

    __slots__ = ("seen", "tail")

    def __init__(self) -> None:
        self.seen = len(HERMES_OPEN)  # characters of the block read so far
        self.tail = ""  # the last of them that may begin a close tag cut in two

    def scan(self, text: str, lo: int, hi: int) -> int | None:
        """Read ``text[lo:hi]``, what follows the block so far; where the block ends."""
        if self.tail:  # a close tag that began before this piece
            joint = self.tail + text[lo : min(hi, lo + len(_HERMES_CLOSE) - 1)]
            close = joint.find(_HERMES_CLOSE)
            if close >= 0:
                return self.seen - len(self.tail) + close + len(_HERMES_CLOSE)
        close = text.find(_HERMES_CLOSE, lo, hi)
        if close >= 0:
            return self.seen + close - lo + len(_HERMES_CLOSE)
        keep = len(_HERMES_CLOSE) - 1
        self.tail = (self.tail + text[max(lo, hi - keep) : hi])[-keep:]
        self.seen += hi - lo
        return None

    @staticmethod
    def calls(held: str, at: int, end: int, names: frozenset[str]) -> list[TextToolCall] | None:
        body = held[at + len(HERMES_OPEN) : at + end - len(_HERMES_CLOSE)]
        return _tool_call_body(body, names, final=False)

    @staticmethod
    def final(held: str, at: int, names: frozenset[str]) -> list[TextToolCall] | None:
        """Open at the end of the stream: its calls if what it holds is whole."""
        return _tool_call_body(held[at + len(HERMES_OPEN) :], names, final=True)


_SPACES, _NAMING, _ARGS, _BRACE, _JSON = range(5)


class MistralBlock:
    """``[TOOL_CALLS][...]`` or ``[TOOL_CALLS]name[ARGS]{...}``, ending where the JSON does.

    Where the text after the marker can be neither, the marker alone is a block of text;
    ``[ARGS]`` followed by anything but ``{`` ends a block of text there."""

    __slots__ = ("args", "json", "json_at", "listed", "name_len", "phase", "seen", "spaced", "text")

    def __init__(self) -> None:
        self.seen = len(MISTRAL)
        self.phase = _SPACES
        self.spaced = False  # whitespace after the marker: only a list may follow
        self.name_len = 0
        self.args = 0  # characters of [ARGS] seen
        self.json = _Json()
        self.json_at = 0  # where the JSON starts in the block
        self.listed = False  # the list form
        self.text = False  # the block ended as text

    def scan(self, text: str, lo: int, hi: int) -> int | None:
        """Read ``text[lo:hi]``, what follows the block so far; where the block ends."""
        base = self.seen - lo  # the block's offset of text[0]
        self.seen += hi - lo
        pos = lo
        if self.phase == _SPACES:
            pos = _SPACE.match(text, pos, hi).end()  # type: ignore[union-attr]
            self.spaced = self.spaced or pos > lo
            if pos == hi:
                return None
            if text[pos] == "[":
                self.phase, self.json_at, self.listed = _JSON, base + pos, True
            elif self.spaced:
                return self._text(len(MISTRAL))
            else:
                self.phase = _NAMING
        if self.phase == _NAMING:
            bound = min(hi, pos + _MAX_NAME + 1 - self.name_len)
            name_end = _NAME.match(text, pos, bound).end()  # type: ignore[union-attr]
            self.name_len += name_end - pos
            if self.name_len > _MAX_NAME:
                return self._text(len(MISTRAL))
            pos = name_end
            if pos == hi:
                return None
            self.phase = _ARGS
        if self.phase == _ARGS:
            while self.args < len(_MISTRAL_ARGS) and pos < hi:
                if text[pos] != _MISTRAL_ARGS[self.args]:
                    return self._text(len(MISTRAL))
                self.args += 1
                pos += 1
            if self.args < len(_MISTRAL_ARGS):
                return None
            self.phase = _BRACE
        if self.phase == _BRACE:
            if pos == hi:
                return None
            if text[pos] != "{":
                return self._text(base + pos)
            self.phase, self.json_at = _JSON, base + pos
        end = self.json.scan(text, pos, hi)
        return None if end is None else base + end

    def _text(self, end: int) -> int:
        self.text = True
        return end

    def calls(
        self, held: str, at: int, end: int, names: frozenset[str]
    ) -> list[TextToolCall] | None:
        if self.text:
            return None
        value_text = held[at + self.json_at : at + end]
        if self.listed:
            try:
                value = jsonutil.loads(value_text)
            except ValueError:
                return None
            if type(value) is not list or not value:
                return None
            calls = [
                _call(item, names, ("arguments",)) if type(item) is dict else None for item in value
            ]
            return None if None in calls else calls  # type: ignore[return-value]
        name = held[at + len(MISTRAL) : at + len(MISTRAL) + self.name_len]
        if name not in names or _object(value_text) is None:
            return None
        return [TextToolCall(name, value_text)]

    @staticmethod
    def final(held: str, at: int, names: frozenset[str]) -> None:
        """Open at the end of the stream: text."""
        return None


def whole_call(held: str, names: frozenset[str]) -> TextToolCall | None:
    """Llama 3.x: the whole message, after whitespace and ``<|python_tag|>``, one call."""
    body = held[_WHOLE.match(held).end() :]  # type: ignore[union-attr]
    if not body.startswith("{"):
        return None
    value = _object(body)
    if value is None:
        return None
    return _call(value, names, ("parameters", "arguments"))


# --- what a block holds --------------------------------------------------------------------


def _tool_call_body(body: str, names: frozenset[str], *, final: bool) -> list[TextToolCall] | None:
    if _FUNCTION[0] in body:
        functions, stray = _tags(body, 0, len(body), _FUNCTION)
        if not functions or (final and stray):
            return None
        calls = [_coder_call(body, function, names) for function in functions]
        return None if None in calls else calls  # type: ignore[return-value]
    value = _object(body.strip())
    if value is None:
        return None
    call = _call(value, names, ("arguments", "parameters"))
    return None if call is None else [call]


def _tags(
    text: str, lo: int, hi: int, tag: tuple[str, str]
) -> tuple[list[tuple[str, int, int]], bool]:
    """The ``<tag=NAME>VALUE</tag>`` in ``text[lo:hi]`` as (NAME, where VALUE starts, where
    it ends), as the regular expression ``<tag=([^>\\n]+)>([\\s\\S]*?)</tag>`` finds them,
    and whether anything but whitespace lies outside them.

    Linear where the expression is quadratic: it scans to the end from every opener without
    a closer, which a looping model writes by the thousand. An opener without a closer after
    it means none after any later one either; the end of a name, found once, serves every
    opener before it."""
    opener, closer = tag
    found: list[tuple[str, int, int]] = []
    stray = False
    pos = last = lo
    name_end = lo - 1  # the first ">" or "\n" at or after some point before here
    while True:
        at = text.find(opener, pos, hi)
        if at < 0:
            break
        name_at = at + len(opener)
        if name_end < name_at:
            found_end = _TAG_NAME_END.search(text, name_at, hi)
            name_end = hi if found_end is None else found_end.start()
        if name_end == hi:
            break  # no name ends: nor does any later one
        if name_end == name_at or text[name_end] != ">":
            pos = at + 1
            continue
        close = text.find(closer, name_end + 1, hi)
        if close < 0:
            break
        stray = stray or _stray(text, last, at)
        found.append((text[name_at:name_end], name_end + 1, close))
        pos = last = close + len(closer)
    return found, stray or _stray(text, last, hi)


def _stray(text: str, lo: int, hi: int) -> bool:
    return hi > lo and not text[lo:hi].isspace()


def _coder_call(
    body: str, function: tuple[str, int, int], names: frozenset[str]
) -> TextToolCall | None:
    name = function[0].strip()
    if name not in names:
        return None
    arguments: dict[str, Any] = {}
    for key, start, end in _tags(body, function[1], function[2], _PARAMETER)[0]:
        value = body[start:end].removeprefix("\n").removesuffix("\n")
        try:
            arguments[key.strip()] = jsonutil.loads(value)
        except ValueError:
            arguments[key.strip()] = value
    return TextToolCall(name, jsonutil.dumps(arguments))


def _object(text: str) -> dict[str, Any] | None:
    try:
        value = jsonutil.loads(text)
    except ValueError:
        return None
    return value if type(value) is dict else None


def _call(
    value: dict[str, Any], names: frozenset[str], keys: tuple[str, ...]
) -> TextToolCall | None:
    name = value.get("name")
    if type(name) is not str or name not in names:
        return None
    arguments: Any = next((value[key] for key in keys if key in value), {})
    if type(arguments) is str:
        return TextToolCall(name, arguments)
    if type(arguments) is not dict:
        return None
    return TextToolCall(name, jsonutil.dumps(arguments))
