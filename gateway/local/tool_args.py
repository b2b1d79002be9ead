"""Tool-call arguments as local models write them, made into a JSON object.

An OpenAI-compatible engine hands over ``tool_calls[].function.arguments`` as the text the model
wrote; the Messages API's ``tool_use.input`` is always a JSON object. Open models write text
that is almost JSON, and each way it falls short is repaired here:

* Python literals (Qwen2.5 and Llama write ``{'path': 'a', 'recursive': True, 'x': None}``);
* trailing commas, ``//`` and ``/* */`` comments, unquoted keys and missing commas;
* a fenced ```` ```json ```` block, with prose around it, or a stray ``</tool_call>`` after
  the object (Hermes-style templates when the engine's parser splits a tag late);
* an object encoded twice (``"{\\"a\\": 1}"``: the arguments written as a JSON string);
* arguments cut off by ``max_tokens`` (``{"path": "/tmp/a``): open strings and containers are
  closed, a key left without its value is dropped.

The outcome says what happened: ``"ok"`` (strict JSON, as sent), ``"repaired"`` or
``"failed"`` (the value is then ``{}``: a ``tool_use`` input is an object, whatever came).
A list holding exactly one object is taken as that object; any other non-object fails.

Cost is bounded, per call and per reply. Strict JSON goes through
:func:`gateway.text.jsonutil.loads` first, at C speed and any size. The repair is this module's
own single pass over regex tokens, linear in the input, for at most :data:`MAX_REPAIR_CHARS`
(256 KiB) and :data:`MAX_REPAIR_TOKENS` tokens. A string is one token matched at C speed
(unrolled, possessive), its escapes checked by one C-speed match and rewritten, where they
must be, by a split and a table, its control characters by ``str.replace``/``translate``: no
Python call per character or escape. Measured at 256 KiB on CPython 3.11 (CPU time, best of 5,
on a shared 2-core machine): a string with a trailing comma 6 ms, JSON-escaped code cut off
10 ms (45 ms with a callback per escape before), raw newlines cut off 13 ms (148 ms before),
every escape invalid (``\\x``) 35 ms, ``{`` then quotes (16,384 tokens, about 2 us a token)
30 ms. A reply's calls are repaired in one step of the event loop (all of a buffered reply's;
a stream's waiting calls when a block closes), so they share one :class:`RepairBudget`:
:data:`MAX_REPLY_REPAIRS` calls, :data:`MAX_REPLY_REPAIR_CHARS` characters,
:data:`MAX_REPLY_REPAIR_TOKENS` tokens, and :data:`MAX_REPLY_REPAIR_SECONDS` as a backstop:
about 70 ms of repair a reply at worst (the time, past the counts, caps a slower machine:
0.1 s and the repair under way). A call past it is not repaired: ``"failed"``, as for an
argument past the per-call bound (before, a reply of twenty 256 KiB broken calls repaired all
of them in one step). The ``json_repair`` library covers the long tail the pass gives
up on (smart quotes, an apostrophe inside a single-quoted string), but only on input of at most
:data:`MAX_LIBRARY_CHARS` characters and :data:`MAX_LIBRARY_OPENS` brackets: it parses
character by character, and its cost grows with the square of the length and faster with
nesting (``{"`` repeated, json_repair 0.64.6: 25 ms for 512 characters, 84 ms for 1 KiB,
4.6 s for 8 KiB, 158 s for 64 KiB; 128 nested ``{{1/'`` 150 ms). Within both bounds the worst
of 3,000 repeated patterns took 34 ms. It also returns ``NaN`` and ``Infinity`` as floats and
raises on deep nesting, so it is called inside a catch-all and its value goes through a strict
round trip.
"""

from __future__ import annotations

import re
import time
from typing import Any, NamedTuple

import json_repair

from gateway.text import jsonutil

__all__ = [
    "MAX_LIBRARY_CHARS",
    "MAX_LIBRARY_OPENS",
    "MAX_REPAIR_CHARS",
    "MAX_REPAIR_TOKENS",
    "MAX_REPLY_REPAIRS",
    "MAX_REPLY_REPAIR_CHARS",
    "MAX_REPLY_REPAIR_SECONDS",
    "MAX_REPLY_REPAIR_TOKENS",
    "RepairBudget",
    "Repaired",
    "repair_arguments",
]

MAX_REPAIR_CHARS = 256 * 1024
MAX_REPAIR_TOKENS = 1 << 14
MAX_LIBRARY_CHARS = 512
MAX_LIBRARY_OPENS = 8  # { and [: its cost grows fastest with nesting
_MAX_DEPTH = jsonutil.MAX_NESTING

# What the repairs of one reply may spend together (its calls are repaired in one step of the
# event loop: all of a buffered reply's, or a stream's waiting calls when a block closes).
MAX_REPLY_REPAIRS = 64  # calls
MAX_REPLY_REPAIR_CHARS = 512 * 1024  # two calls at the per-call bound
MAX_REPLY_REPAIR_TOKENS = 2 * MAX_REPAIR_TOKENS  # two calls at the worst per-call cost
MAX_REPLY_REPAIR_SECONDS = 0.1  # a backstop: the counts above bound the work already


class Repaired(NamedTuple):
    value: dict[str, Any]  # always a JSON object
    outcome: str  # "ok", "repaired" or "failed"


_FAILED = Repaired({}, "failed")


class RepairBudget:
    """What one reply's repairs may still spend; a repair it cannot afford is not tried
    (the call fails: ``{}``, counted as unrepairable, and in :attr:`refused`).

    A repair is tried only while calls, characters, tokens and time are all left; it is
    charged its characters, the tokens its pass read and the time it took (the time can
    run past the budget by at most one repair's: tens of milliseconds)."""

    __slots__ = ("calls", "chars", "refused", "seconds", "tokens")

    def __init__(
        self,
        *,
        calls: int = MAX_REPLY_REPAIRS,
        chars: int = MAX_REPLY_REPAIR_CHARS,
        tokens: int = MAX_REPLY_REPAIR_TOKENS,
        seconds: float = MAX_REPLY_REPAIR_SECONDS,
    ) -> None:
        self.calls = calls
        self.chars = chars
        self.tokens = tokens
        self.seconds = seconds
        self.refused = 0  # repairs not tried, or stopped, because the budget was spent

    def _afford(self, size: int) -> bool:
        if self.calls > 0 and self.chars >= size and self.tokens > 0 and self.seconds > 0:
            return True
        self.refused += 1
        return False


def repair_arguments(raw: str | None, budget: RepairBudget | None = None) -> Repaired:
    """The arguments object in ``raw``, and whether it was strict, repaired or lost.

    ``budget``: the reply's (shared by its calls); None, this call's own. Strict JSON costs
    none of it."""
    if raw is None or not raw.strip():
        return Repaired({}, "ok")
    try:
        value = jsonutil.loads(raw)
    except ValueError:
        pass
    else:
        if type(value) is dict:
            return Repaired(value, "ok")
        return _as_object(value, budget, nested=False)
    if len(raw) > MAX_REPAIR_CHARS:
        return _FAILED
    value = _repair(raw, budget)
    return _FAILED if value is _NOTHING else _as_object(value, budget, nested=False)


def _as_object(value: Any, budget: RepairBudget | None, *, nested: bool) -> Repaired:
    if type(value) is dict:
        return Repaired(value, "repaired")
    if type(value) is list and len(value) == 1 and type(value[0]) is dict:
        return Repaired(value[0], "repaired")
    if type(value) is str and not nested and value.strip():
        # Encoded twice: the string holds the object (one level only, as models do).
        inner = _strict(value)
        if inner is _NOTHING and len(value) <= MAX_REPAIR_CHARS:
            inner = _repair(value, budget)
        if inner is not _NOTHING:
            return _as_object(inner, budget, nested=True)
    return _FAILED


_NOTHING: Any = object()


def _strict(text: str) -> Any:
    try:
        return jsonutil.loads(text)
    except ValueError:
        return _NOTHING


def _repair(raw: str, budget: RepairBudget | None) -> Any:
    """The value the repair pass finds, else json_repair's for short input, else _NOTHING;
    within ``budget``, charged what it spent."""
    if budget is None:
        budget = RepairBudget()
    if not budget._afford(len(raw)):
        return _NOTHING
    started = time.perf_counter()
    budget.calls -= 1
    budget.chars -= len(raw)
    try:
        value = _attempt(raw, budget)
    finally:
        budget.seconds -= time.perf_counter() - started
    if value is _NOTHING and budget.tokens < 0:
        budget.refused += 1  # the pass stopped where the reply's tokens ran out
    return value


def _attempt(raw: str, budget: RepairBudget) -> Any:
    text = _rewrite(_unwrap(raw), budget)
    if text is not None:
        value = _strict(text)
        if value is not _NOTHING:
            return value
    if len(raw) <= MAX_LIBRARY_CHARS and raw.count("{") + raw.count("[") <= MAX_LIBRARY_OPENS:
        return _library(raw)
    return _NOTHING


def _library(raw: str) -> Any:
    try:
        value = json_repair.repair_json(raw, return_objects=True, skip_json_loads=True)
        # Its floats may be NaN or infinite, its strings lone surrogates: what the
        # strict decoder refuses, the round trip refuses too.
        return jsonutil.loads(jsonutil.dumps(value))
    except Exception:  # a parser of hostile text: RecursionError, ValueError, ...
        return _NOTHING


# --- unwrap: the value out of the text around it -----------------------------------------

# The body of the first fenced block; an unclosed fence (cut off) runs to the end.
_FENCE = re.compile(r"```[\w+-]*[ \t]*\n?([\s\S]*?)(?:```|\Z)")
_VALUE_START = re.compile(r"[{\[\"']")


def _unwrap(raw: str) -> str:
    """From where the value starts: inside a fence if there is one, past any prose or tag."""
    text = raw  # not stripped at the end: a string cut off may end in a newline it holds
    fence = _FENCE.search(text)
    if fence is not None:
        text = fence[1]
    start = _VALUE_START.search(text)
    if start is None:
        return ""
    if text[start.start()] in "\"'" and start.start() > 0:
        brace = text.find("{")  # prose quoting a word before the object
        return text[brace:] if brace >= 0 else text[start.start() :]
    return text[start.start() :]


# --- rewrite: almost-JSON tokens to strict JSON text ------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
    | (?P<dq_cut>"[^"\\]*+(?:\\[\s\S][^"\\]*+)*+)(?:(?P<dq>")|\\?\Z)
    | (?P<sq_cut>'[^'\\]*+(?:\\[\s\S][^'\\]*+)*+)(?:(?P<sq>')|\\?\Z)
    | (?P<comment>//[^\n]*+|/\*[\s\S]*?(?:\*/|\Z))
    | (?P<num>-?(?:\d++\.?\d*+|\.\d++)(?:[eE][+-]?\d++)?)
    | (?P<word>[A-Za-z_$][\w$]*+)
    | (?P<punct>[{}\[\],:])
    """,
    re.VERBOSE,
)
# A string is read once: its closing quote is a group of its own, the last one matched (the
# token's kind) when it is there; else the string was cut off. The slice of a string token
# that is its body, by token kind (a cut one lost its end quote, and may end in half an
# escape).
_BODY = {"dq": (1, -1), "sq": (1, -1), "dq_cut": (1, None), "sq_cut": (1, None)}
_LITERALS = {
    "true": "true", "True": "true", "false": "false", "False": "false",
    "null": "null", "None": "null", "NULL": "null", "undefined": "null",
    "NaN": "null", "Infinity": "null",
}  # fmt: skip
# A backslash and what it escapes, or a double quote (which a single-quoted body may hold).
_ESCAPE_OR_QUOTE = re.compile(r'\\([\s\S])|"')
# what each split part of it becomes: a JSON escape kept, a bare quote (None) escaped
_ESCAPED: dict[str | None, str] = {c: "\\" + c for c in '"\\/bfnrtu'}
_ESCAPED[None] = '\\"'
# a body whose every backslash starts a JSON escape: no escape to rewrite (one C-speed match);
# and with no control character (or bare double quote): nothing to rewrite at all
_JSON_BODY = re.compile(r'[^\\]*+(?:\\["\\/bfnrtu][^\\]*+)*+')
_CLEAN_BODY = re.compile(r'[^\\\x00-\x1f]*+(?:\\["\\/bfnrtu][^\\\x00-\x1f]*+)*+')
_CLEAN_SQ_BODY = re.compile(r'[^\\\x00-\x1f"]*+(?:\\["\\/bfnrtu][^\\\x00-\x1f"]*+)*+')
_CONTROL = re.compile(r"[\x00-\x1f]")
_CONTROL_ESCAPES = {c: f"\\u{c:04x}" for c in range(32)} | {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
    ord("\b"): "\\b",
    ord("\f"): "\\f",
}

# What was written last: the states of a JSON text that matter to close it.
_OPEN, _COMMA, _KEY, _COLON, _VALUE = range(5)


def _rewrite(text: str, budget: RepairBudget) -> str | None:
    """Strict JSON text for the first value in ``text``, or None where it is not one.

    One pass over tokens: values are re-quoted, Python literals mapped, commas dropped or
    added, and whatever is open at the end is closed. Text after the first complete value
    is ignored (a ``</tool_call>``, prose) unless another container starts there. The tokens
    it reads are charged to ``budget``; it gives up past what is left there.
    """
    writer = _Writer()
    position = 0
    limit = min(MAX_REPAIR_TOKENS, budget.tokens)
    count = 0
    try:
        for count, match in enumerate(_TOKEN.finditer(text), 1):
            if match.start() != position or count > limit:
                return None  # a character no token takes, or too much work
            position = match.end()
            kind = match.lastgroup
            if kind == "ws" or kind == "comment":
                continue
            if not writer.take(kind, match[0]):
                return None
            if not writer.stack:
                rest = text[position:]
                return "".join(writer.out) if "{" not in rest and "[" not in rest else None
        return writer.close() if position == len(text) else None
    finally:
        budget.tokens -= count


class _Writer:
    """Strict JSON text written token by token; each method returns False to give up."""

    def __init__(self) -> None:
        self.out: list[str] = []
        self.stack: list[str] = []  # "}" or "]": what closes each open container
        self.last = _OPEN

    def take(self, kind: str | None, token: str) -> bool:
        if kind != "punct" or token in "{[":
            return self._value(kind, token)
        if not self.stack:
            return False
        if token == ",":
            if self.last == _KEY:  # a key alone is not kept: ``{"a", "b": 1}``
                self._drop_key()
            elif self.last == _VALUE:
                self.out.append(",")
                self.last = _COMMA
            return True  # else a doubled comma, or one after ``[``: dropped
        if token == ":":
            if self.last != _KEY:
                return False
            self.out.append(":")
            self.last = _COLON
            return True
        if token != self.stack[-1] or self.last == _COLON:
            return False
        if self.last == _COMMA:
            self.out.pop()  # a trailing comma
        elif self.last == _KEY:
            self._drop_key()
        self.out.append(self.stack.pop())
        self.last = _VALUE
        return True

    def _value(self, kind: str | None, token: str) -> bool:
        if self.last == _VALUE and self.stack:
            self.out.append(",")  # a missing comma between two values
            self.last = _COMMA
        elif self.last == _KEY:
            self.out.append(":")  # a missing colon
            self.last = _COLON
        key = bool(self.stack) and self.stack[-1] == "}" and self.last in (_OPEN, _COMMA)
        if kind == "punct":  # { or [
            if key or len(self.stack) >= _MAX_DEPTH:
                return False
            self.out.append(token)
            self.stack.append("}" if token == "{" else "]")
            self.last = _OPEN
            return True
        self.out.append(_scalar(kind, token, key))
        self.last = _KEY if key else _VALUE
        return True

    def _drop_key(self) -> None:
        self.out.pop()
        self.last = _OPEN if self.out[-1] in ("{", "[") else _COMMA

    def close(self) -> str | None:
        """Text cut off: drop a key without its value and a dangling comma; close the rest."""
        if self.last == _COLON:
            self.out.pop()
            self.last = _KEY
        if self.last == _KEY:
            self._drop_key()
        if self.last == _COMMA:
            self.out.pop()
        self.out.extend(reversed(self.stack))
        return "".join(self.out) if self.out else None


def _scalar(kind: str | None, token: str, key: bool) -> str:
    if kind in _BODY:
        start, end = _BODY[kind]
        body = token[start:end]
        if end is None and (len(body) - len(body.rstrip("\\"))) % 2:
            body = body[:-1]  # half an escape, cut off
        if (_CLEAN_SQ_BODY if kind[0] == "s" else _CLEAN_BODY).fullmatch(body):
            return f'"{body}"'  # what models mostly write: one scan, nothing to rewrite
        if (kind[0] == "s" and '"' in body) or ("\\" in body and not _JSON_BODY.fullmatch(body)):
            body = _json_escaped(body)
        return _quoted(body)
    if kind == "num":
        number = token + "0" if token.endswith(".") else token
        return _quoted(number) if key else number
    literal = _LITERALS.get(token)
    if literal is None or key:
        return _quoted(token)  # an unquoted key, or an unquoted string value
    return literal


def _json_escaped(body: str) -> str:
    """An escape JSON has is kept; any other (Python's ``\\'``, ``\\x``) loses its backslash; a
    bare double quote (a single-quoted body may hold one) is escaped. Split at C speed and
    mapped by a table: no Python call per escape (a callback per match took 0.1 s for a
    256 KiB body of escapes)."""
    parts = _ESCAPE_OR_QUOTE.split(body)
    parts[1::2] = [_ESCAPED.get(c, c) for c in parts[1::2]]
    return "".join(parts)


def _quoted(body: str) -> str:
    """A JSON string of ``body``: raw control characters are escaped (strict JSON refuses
    them; models write raw newlines into code)."""
    if _CONTROL.search(body):
        # the common ones at C speed; a table lookup per character only for what is left
        body = body.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
        if _CONTROL.search(body):
            body = body.translate(_CONTROL_ESCAPES)
    return f'"{body}"'
