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
the end, because only the end tells). A block that does not end within :data:`MAX_HELD`
characters of its marker is text: its first ``MAX_HELD`` characters go out as such and the
search for markers goes on after them; a message longer than that is no whole-message call.

At the end of the stream an open ``<tool_call>`` block is still recognised when its body is
complete: a whole JSON object, or a ``<function=...>`` closed by ``</function>``. Models often
stop at EOS before ``</tool_call>``, and a body that parses is not a guess; a body cut in the
middle stays text.

Every decision depends only on the text, never on where it was cut into chunks:
:func:`split_text_tool_calls` gives the same pieces as feeding any split of it. The work is
linear in the text whatever the cut (a looping model writes thousands of openers without
closers, one token a delta): an open block is read by a scanner that goes on from where the
last delta left it (:mod:`.text_blocks`) and the held text is a list of the deltas, joined once
when the block ends; every character is looked at by one block at most.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from gateway.local.text_blocks import (
    HERMES_OPEN,
    MISTRAL,
    HermesBlock,
    MistralBlock,
    TextToolCall,
    whole_call,
)

__all__ = ["MAX_HELD", "TextToolCall", "TextToolCalls", "split_text_tool_calls"]

MAX_HELD = 256 * 1024

Piece = str | TextToolCall

_PYTHON_TAG = "<|python_tag|>"
_MARKERS = (HERMES_OPEN, MISTRAL)
_MARKER = re.compile("|".join(re.escape(marker) for marker in _MARKERS))
_LONGEST = max(map(len, _MARKERS))
_FIRSTS = "".join(sorted({marker[0] for marker in _MARKERS}))

Block = HermesBlock | MistralBlock


class TextToolCalls:
    """Content deltas in, text and calls out, in order; see the module docstring."""

    __slots__ = ("_block", "_head", "_names", "_parts", "_size", "_sure", "_whole", "found")

    def __init__(self, tool_names: Collection[str]) -> None:
        self._names = frozenset(tool_names)
        # The held text, as the deltas came (joined when something is decided: joining on
        # every delta would copy all of it each time), and its length.
        self._parts: list[str] = []
        self._size = 0
        self._block: Block | None = None  # the open block the held text starts with
        self._whole = bool(self._names)  # the message may still be Llama's whole-message call
        self._head = ""  # while it may: its first characters after the leading whitespace
        self._sure = False  # ... and they settle that it may, whatever follows
        self.found = 0

    def __repr__(self) -> str:
        return f"TextToolCalls(held={self._size}, whole={self._whole}, found={self.found})"

    @property
    def held(self) -> str:
        """The text held back as a possible call, not yet passed on: the end of the text so
        far (a tail that may begin a marker, an open block, or the whole message while it
        may be Llama's whole-message JSON)."""
        if len(self._parts) > 1:
            self._parts[:] = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    @property
    def holding(self) -> bool:
        """Anything is held (:attr:`held` is not ""), without joining it."""
        return self._size > 0

    def drop_held(self) -> None:
        """Forget :attr:`held`: it was never passed on, and a mid-stream continuation has
        the model write it again from where the text passed on ends
        (gateway/messages/continuation.py). Whether the message may still be a
        whole-message call is kept: what was passed on is unchanged."""
        self._parts = []
        self._size = 0
        self._block = None
        self._head, self._sure = "", False

    def passes(self, text: str) -> bool:
        """``feed(text)`` would return ``[text]`` and hold nothing: nothing is held, the
        message can no longer be a whole-message call, and no marker can start in it."""
        return (
            not self._size
            and not self._whole
            and MISTRAL[0] not in text
            and HERMES_OPEN[0] not in text
        )

    def feed(self, text: str) -> list[Piece]:
        if not self._names or self.passes(text):
            return [text] if text else []
        out: list[Piece] = []
        block = self._block
        if self._whole:
            self._hold(text)
            if self._size <= MAX_HELD and self._may_be_whole(text):
                return out
            self._whole = False
            self._scan(self._take(), out, final=False)
        elif block is not None:
            # the block goes on from where it stopped; it is never longer than the cap
            end = block.scan(text, 0, min(len(text), MAX_HELD + 1 - self._size))
            self._hold(text)
            if end is None and self._size <= MAX_HELD:
                return out
            self._block = None
            self._scan(self._take(), out, final=False, opened=(block, end))
        else:  # at most a marker's first characters are held
            self._scan(self._take() + text, out, final=False)
        return out

    def flush(self) -> list[Piece]:
        out: list[Piece] = []
        held = self._take()
        if self._whole:
            self._whole = False
            call = whole_call(held, self._names) if len(held) <= MAX_HELD else None
            if call is not None:
                self.found += 1
                return [call]
        block, self._block = self._block, None
        self._scan(held, out, final=True, opened=None if block is None else (block, None))
        return out

    def _hold(self, text: str) -> None:
        self._parts.append(text)
        self._size += len(text)

    def _take(self) -> str:
        held = self._parts[0] if len(self._parts) == 1 else "".join(self._parts)
        self._parts = []
        self._size = 0
        return held

    def _may_be_whole(self, text: str) -> bool:
        """After whitespace, ``{`` or ``<|python_tag|>`` (or a start of it) so far: only the
        first characters after the whitespace are looked at, once."""
        if self._sure:
            return True
        head = self._head + (text if self._head else text.lstrip())
        self._head = head = head[: len(_PYTHON_TAG)]
        self._sure = head.startswith("{") or head == _PYTHON_TAG
        return self._sure or _PYTHON_TAG.startswith(head)

    def _scan(
        self,
        held: str,
        out: list[Piece],
        *,
        final: bool,
        opened: tuple[Block, int | None] | None = None,
    ) -> None:
        """Release all of ``held`` that can no longer become a call; ``opened``: a block
        ``held`` starts with, and where it ends (None: not yet)."""
        texts: list[str] = []  # text out since the last call, joined once
        start = 0
        while True:
            if opened is not None:
                at, (block, end) = 0, opened
                opened = None
            else:
                marker = _MARKER.search(held, start)
                if marker is None:
                    keep = 0 if final else _tag_prefix(held, start)
                    texts.append(held[start : len(held) - keep])
                    if keep:
                        self._hold(held[len(held) - keep :])
                    break
                at = marker.start()
                texts.append(held[start:at])
                block = HermesBlock() if marker[0] == HERMES_OPEN else MistralBlock()
                end = block.scan(held, marker.end(), min(len(held), at + MAX_HELD + 1))
                if end is None and not final and len(held) - at <= MAX_HELD:
                    self._hold(held[at:])  # open: held until it ends
                    self._block = block
                    break
            start = self._settle(held, at, block, end, final, texts, out)
        _text(out, texts)

    def _settle(
        self,
        held: str,
        at: int,
        block: Block,
        end: int | None,
        final: bool,
        texts: list[str],
        out: list[Piece],
    ) -> int:
        """Pass on the block at ``at``, ending at ``at + end`` (None: open at the end of
        the stream); where the scan goes on."""
        if end is None and len(held) - at <= MAX_HELD:  # final: what it holds is complete
            end = len(held) - at
            calls = block.final(held, at, self._names)
        elif end is None or end > MAX_HELD:  # too long: text, and the search goes on in it
            texts.append(held[at : at + MAX_HELD])
            return at + MAX_HELD
        else:
            calls = block.calls(held, at, end, self._names)
        if calls is None:
            texts.append(held[at : at + end])
        else:
            _text(out, texts)
            texts.clear()
            out.extend(calls)
            self.found += len(calls)
        return at + end


def split_text_tool_calls(text: str, tool_names: Collection[str]) -> list[Piece]:
    """The pieces of a whole message: the same as feeding it in any chunks, then flushing."""
    parser = TextToolCalls(tool_names)
    return parser.feed(text) + parser.flush()


def _text(out: list[Piece], texts: list[str]) -> None:
    text = "".join(texts)
    if text:
        out.append(text)


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
