"""Tool calls written as text in a model's native format, found in streamed content.

An engine started without its tool parser (vLLM without ``--tool-call-parser``, llama.cpp
without ``--jinja``) passes the model's tool-call syntax through as ``content``. The formats,
as the engines' own parsers read them:

* Hermes, Qwen2.5, Qwen3: ``<tool_call>\\n{"name": "X", "arguments": {...}}\\n</tool_call>``,
  one block per call, several in a row; ``arguments`` is an object or a JSON string.
* Qwen3-Coder: ``<tool_call>\\n<function=X>\\n<parameter=K>\\nV\\n</parameter>\\n</function>\\n
  </tool_call>``; each value is JSON where it decodes, else the text, one newline trimmed each
  side.
* Mistral: ``[TOOL_CALLS][{"name": "X", "arguments": {...}}, ...]``, and since the v11
  tokenizer ``[TOOL_CALLS]X[ARGS]{...}``.
* Llama 3.x: the whole message is ``{"name": "X", "parameters": {...}}``, maybe after
  ``<|python_tag|>``; only when nothing but whitespace is around it.

A call is recognised only when its name is one of the request's tools: anything else (prose
that mentions ``<tool_call>``, an unknown name, JSON that does not parse) stays text, byte for
byte. The parser holds back only what may still become a call: a tail that may be the start
of a tag, an open block, or a message that so far may be Llama's whole-message JSON (held to
the end, because only the end tells). A held block over :data:`MAX_HELD` characters is text.

At the end of the stream an open ``<tool_call>`` block is still recognised when its body is
complete: a whole JSON object, or a ``<function=...>`` closed by ``</function>``. Models often
stop at EOS before ``</tool_call>``, and a body that parses is not a guess; a body cut in the
middle stays text.

Every decision depends only on the text, never on where it was cut into chunks:
:func:`split_text_tool_calls` gives the same pieces as feeding any split of it.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any, NamedTuple

from gateway.text import jsonutil

__all__ = ["MAX_HELD", "TextToolCall", "TextToolCalls", "split_text_tool_calls"]

MAX_HELD = 256 * 1024


class TextToolCall(NamedTuple):
    name: str
    arguments: str  # JSON text of the arguments object, repaired later (tool_args)


Piece = str | TextToolCall

_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_MISTRAL = "[TOOL_CALLS]"
_MISTRAL_ARGS = "[ARGS]"
_PYTHON_TAG = "<|python_tag|>"
_MARKERS = (_HERMES_OPEN, _MISTRAL)
_MARKER = re.compile("|".join(re.escape(marker) for marker in _MARKERS))
_FUNCTION = re.compile(r"<function=([^>\n]+)>([\s\S]*?)</function>")
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>([\s\S]*?)</parameter>")
# A JSON string, or a bracket: enough to find where a value ends.
# An unclosed string runs to the end, so a bracket inside it is never taken for one.
_JSON_PART = re.compile(r'"(?:[^"\\]|\\[\s\S])*+\\?(?:"|\Z)|[{}\[\]]')
_NAME = re.compile(r"[\w.\-]*")
_MAX_NAME = 256  # longer is no tool name: the marker was text
_WHOLE = re.compile(r"\s*(?:<\|python_tag\|>)?\s*")


class TextToolCalls:
    """Content deltas in, text and calls out, in order; see the module docstring."""

    def __init__(self, tool_names: Collection[str]) -> None:
        self._names = frozenset(tool_names)
        self._held = ""
        # Where the scan of an open block at the start of _held stopped, so the next feed
        # goes on from there instead of scanning the block again (quadratic otherwise).
        self._memo: dict[int, tuple[int, int]] = {}
        self._whole = bool(self._names)  # the message may still be Llama's whole-message call
        self.found = 0

    def __repr__(self) -> str:
        return f"TextToolCalls(held={len(self._held)}, whole={self._whole}, found={self.found})"

    @property
    def held(self) -> str:
        """The text held back as a possible call, not yet passed on: the end of the text so
        far (a tail that may begin a marker, an open block, or the whole message while it
        may be Llama's whole-message JSON)."""
        return self._held

    def drop_held(self) -> None:
        """Forget :attr:`held`: it was never passed on, and a mid-stream continuation has
        the model write it again from where the text passed on ends
        (gateway/messages/continuation.py). Whether the message may still be a
        whole-message call is kept: what was passed on is unchanged."""
        self._held = ""
        self._memo = {}

    def passes(self, text: str) -> bool:
        """``feed(text)`` would return ``[text]`` and hold nothing: nothing is held, the
        message can no longer be a whole-message call, and no marker can start in it."""
        return (not self._held and not self._whole and _MISTRAL[0] not in text
                and _HERMES_OPEN[0] not in text)

    def feed(self, text: str) -> list[Piece]:
        if not self._names:
            return [text] if text else []
        if self.passes(text):
            return [text] if text else []
        self._held += text
        out: list[Piece] = []
        if self._whole:
            if _may_be_whole(self._held) and len(self._held) <= MAX_HELD:
                return out
            self._whole = False
        self._scan(out, final=False)
        return out

    def flush(self) -> list[Piece]:
        out: list[Piece] = []
        if self._whole:
            self._whole = False
            call = _whole_call(self._held, self._names)
            if call is not None:
                self._held = ""
                self.found += 1
                return [call]
        self._scan(out, final=True)
        return out

    def _scan(self, out: list[Piece], *, final: bool) -> None:
        """Release all of the held text that can no longer become a call."""
        held = self._held
        start = 0
        while True:
            marker = _MARKER.search(held, start)
            if marker is None:
                keep = 0 if final else _tag_prefix(held, start)
                _text(out, held[start:len(held) - keep])
                self._held = held[len(held) - keep:]
                return
            _text(out, held[start:marker.start()])
            memo = self._memo if marker.start() == 0 else {}
            end, calls = _block(held, marker.start(), marker[0], self._names, final, memo)
            if end is None:  # open: held until it closes, unless too long
                if marker.start() + MAX_HELD >= len(held):
                    self._held = held[marker.start():]
                    self._memo = memo if marker.start() == 0 else {}  # its offsets moved
                    return
                end, calls = marker.end(), None
            elif end - marker.start() > MAX_HELD:
                end, calls = marker.end(), None
            if calls is None:
                _text(out, held[marker.start():end])
            else:
                out.extend(calls)
                self.found += len(calls)
            start = end
            self._memo = {}


def split_text_tool_calls(text: str, tool_names: Collection[str]) -> list[Piece]:
    """The pieces of a whole message: the same as feeding it in any chunks, then flushing."""
    parser = TextToolCalls(tool_names)
    return parser.feed(text) + parser.flush()


def _text(out: list[Piece], text: str) -> None:
    if text:
        if out and type(out[-1]) is str:
            out[-1] += text
        else:
            out.append(text)


_LONGEST = max(map(len, _MARKERS))
_FIRSTS = "".join(sorted({marker[0] for marker in _MARKERS}))


def _tag_prefix(held: str, start: int) -> int:
    """How many characters at the end of ``held`` may be the start of a marker.

    Per chunk of prose this is the hot path: only a tail that begins with a marker's first
    character can be one, so most chunks are answered by a scan for those characters."""
    lo = max(start, len(held) - (_LONGEST - 1))
    for at in range(lo, len(held)):
        if held[at] in _FIRSTS:
            tail = held[at:]
            if any(marker.startswith(tail) for marker in _MARKERS):
                return len(held) - at
    return 0


def _may_be_whole(held: str) -> bool:
    rest = held.lstrip()
    if rest.startswith(_PYTHON_TAG):
        return True
    return _PYTHON_TAG.startswith(rest) or rest.startswith("{")


def _whole_call(held: str, names: frozenset[str]) -> TextToolCall | None:
    """Llama 3.x: the whole message, after whitespace and ``<|python_tag|>``, one call."""
    body = held[_WHOLE.match(held).end():]  # type: ignore[union-attr]
    if len(held) > MAX_HELD or not body.startswith("{"):
        return None
    value = _object(body)
    if value is None:
        return None
    return _call(value, names, ("parameters", "arguments"))


# --- blocks: where a call that starts at a marker ends, and what it holds ----------------


def _block(held: str, at: int, marker: str, names: frozenset[str], final: bool,
           memo: dict[int, tuple[int, int]]) -> tuple[int | None, list[Piece] | None]:
    """(end of the block or None while open, its calls or None when it is text)."""
    if marker == _HERMES_OPEN:
        searched = memo.get(-1, (at + len(marker), 0))[0]
        close = held.find(_HERMES_CLOSE, searched)
        if close < 0:
            memo[-1] = (max(searched, len(held) - len(_HERMES_CLOSE) + 1), 0)
            if not final:
                return None, None
            calls = _tool_call_body(held[at + len(marker):], names, final=True)
            return len(held), calls
        end = close + len(_HERMES_CLOSE)
        return end, _tool_call_body(held[at + len(marker):close], names, final=False)
    return _mistral(held, at + len(marker), names, final, memo)


def _tool_call_body(body: str, names: frozenset[str], *, final: bool) -> list[Piece] | None:
    if "<function=" in body:
        functions = list(_FUNCTION.finditer(body))
        if not functions or (final and _FUNCTION.sub("", body).strip()):
            return None
        calls = [_coder_call(function, names) for function in functions]
        return None if None in calls else calls  # type: ignore[return-value]
    value = _object(body.strip())
    if value is None:
        return None
    call = _call(value, names, ("arguments", "parameters"))
    return None if call is None else [call]


def _coder_call(function: re.Match[str], names: frozenset[str]) -> TextToolCall | None:
    name = function[1].strip()
    if name not in names:
        return None
    arguments: dict[str, Any] = {}
    for parameter in _PARAMETER.finditer(function[2]):
        value = parameter[2].removeprefix("\n").removesuffix("\n")
        try:
            arguments[parameter[1].strip()] = jsonutil.loads(value)
        except ValueError:
            arguments[parameter[1].strip()] = value
    return TextToolCall(name, jsonutil.dumps(arguments))


def _mistral(held: str, at: int, names: frozenset[str], final: bool,
             memo: dict[int, tuple[int, int]]) -> tuple[int | None, list[Piece] | None]:
    """``[TOOL_CALLS][...]`` or ``[TOOL_CALLS]name[ARGS]{...}``, ending where the JSON does.

    Where the text after the marker can be neither, the marker alone is text (end ``at``).
    """
    open_: tuple[int | None, list[Piece] | None] = (len(held), None) if final else (None, None)
    start = len(held) - len(held[at:].lstrip())
    if start == len(held):
        return open_
    if held[start] == "[":
        end = _json_end(held, start, memo)
        if end is None:
            return open_
        try:
            value = jsonutil.loads(held[start:end])
        except ValueError:
            return end, None
        if type(value) is not list or not value:
            return end, None
        calls = [_call(item, names, ("arguments",)) if type(item) is dict else None
                 for item in value]
        return end, None if None in calls else calls  # type: ignore[return-value]
    name_end = _NAME.match(held, at).end()  # type: ignore[union-attr]
    if name_end - at > _MAX_NAME:
        return at, None
    if not held.startswith(_MISTRAL_ARGS, name_end):
        cut = name_end == len(held) or _MISTRAL_ARGS.startswith(held[name_end:])
        return open_ if cut else (at, None)
    brace = name_end + len(_MISTRAL_ARGS)
    if brace == len(held):
        return open_
    end = _json_end(held, brace, memo) if held[brace] == "{" else brace
    if end is None:
        return open_
    name = held[at:name_end]
    if end == brace or name not in names or _object(held[brace:end]) is None:
        return end, None
    return end, [TextToolCall(name, held[brace:end])]


def _json_end(text: str, start: int, memo: dict[int, tuple[int, int]]) -> int | None:
    """Where the JSON object or array opening at ``start`` closes, or None if it does not
    yet; ``memo`` keeps where the scan stopped and its depth, for the next, longer text."""
    position, depth = memo.get(start, (start, 0))
    for part in _JSON_PART.finditer(text, position):
        bracket = part[0]
        if bracket == "{" or bracket == "[":
            depth += 1
        elif bracket == "}" or bracket == "]":
            depth -= 1
            if depth == 0:
                return part.end()
        elif part.end() == len(text) and (len(bracket) < 2 or bracket[-1] != '"'
                                          or bracket[-2] == "\\"):
            break  # a string still open: scanned again once it closes
        position = part.end()
    memo[start] = (position, depth)
    return None


def _object(text: str) -> dict[str, Any] | None:
    try:
        value = jsonutil.loads(text)
    except ValueError:
        return None
    return value if type(value) is dict else None


def _call(value: dict[str, Any], names: frozenset[str],
          keys: tuple[str, ...]) -> TextToolCall | None:
    name = value.get("name")
    if type(name) is not str or name not in names:
        return None
    arguments: Any = next((value[key] for key in keys if key in value), {})
    if type(arguments) is str:
        return TextToolCall(name, arguments)
    if type(arguments) is not dict:
        return None
    return TextToolCall(name, jsonutil.dumps(arguments))
