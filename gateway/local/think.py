"""Inline ``<think>`` reasoning in ``content``, split into reasoning and text pieces.

Protocol facts relied on:

- An engine started without a reasoning parser returns the model's reasoning inside
  ``choices[].delta.content`` (or ``message.content``) as ``<think>\\n…\\n</think>\\n\\nanswer``
  (DeepSeek-R1 distills, QwQ, Qwen3). When the chat template itself opens ``<think>`` at the
  end of the prompt, the content has no opener: ``…\\n</think>\\n\\nanswer``.
- The tags are emitted at the very start of the content (after at most a little whitespace),
  and the model closes its reasoning once. A ``<think>`` anywhere else is prose about tags.
- The upstream cuts deltas anywhere, even inside a tag or between ``\\r`` and ``\\n``.
- A model that runs out of tokens mid-thought ends the stream without ``</think>``.

Modes: ``"off"`` (all text, untouched), ``"auto"`` (an opener at the start opens reasoning),
``"opened"`` (the content starts inside reasoning; a redundant leading opener is dropped).

The exact rules (whitespace is ``" \\t\\r\\n"``; ``W`` is :data:`MAX_WHITESPACE`):

1. Opener: the content's leading whitespace, if at most ``W`` characters, followed by
   ``<think>``. Both are dropped. With more leading whitespace there is no opener.
2. ``auto`` without an opener: the whole content is text, unchanged. If it contains ``</think>``
   the template opened the reasoning: :attr:`InlineThinking.orphan_close` is set, but the text
   stays as it is (a stream has already shown it, and buffered must equal streamed).
3. Reasoning starts after the opener (``auto`` with one, or ``opened``). All whitespace at its
   start is dropped. It ends at the first ``</think>``, which is dropped together with the last
   ``min(W, run)`` characters of the whitespace run right before it. Without ``</think>`` the
   rest of the content is reasoning, trailing whitespace kept.
4. After ``</think>`` all whitespace is dropped; the rest is text, unchanged (no more tags).

Holding: only what the future decides is held: at the start, up to ``W`` whitespace characters
plus a proper prefix of ``<think>``; in reasoning, up to ``W`` trailing whitespace characters
plus a proper prefix of ``</think>``. So at most ``W + 7`` characters per stream. Dropped
whitespace is skipped, never held. Feeding a content cut at any offsets gives the same pieces
(once adjacent pieces of one kind are merged) as :func:`split_inline_thinking` on the whole.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

__all__ = ["MAX_WHITESPACE", "MODES", "InlineThinking", "Phase", "split_inline_thinking"]

Piece = tuple[bool, str]  # (is_reasoning, text)

MODES = ("auto", "opened", "off")
# Enough for "\n\n" or "\r\n\r\n" around a tag with room to spare; it bounds what is held.
MAX_WHITESPACE = 32

_OPEN = "<think>"
_CLOSE = "</think>"
_WS = " \t\r\n"
# a partial close tag at a chunk end is at most this long ("</think" without ">")
_PARTIAL = len(_CLOSE) - 1


class Phase(enum.Enum):
    START = "start"  # start of content: leading whitespace and a prefix of "<think>" held
    REASONING_LEAD = "reasoning_lead"  # after the opener: whitespace dropped
    REASONING = "reasoning"  # trailing whitespace and a prefix of "</think>" held
    AFTER_CLOSE = "after_close"  # after "</think>": whitespace dropped
    TEXT = "text"  # nothing held
    DONE = "done"  # flushed


class InlineThinking:
    """Splits content deltas into (reasoning, text) pieces; one per streamed choice."""

    __slots__ = ("_held", "_tail", "_watch", "mode", "orphan_close", "phase")

    def __init__(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"inline thinking mode must be one of {MODES}, not {mode!r}")
        self.mode = mode
        self.phase = Phase.TEXT if mode == "off" else Phase.START
        self.orphan_close = False
        self._held = ""
        # auto mode without an opener looks for "</think>" (rule 2); _tail is the end of the
        # text so far that may be the start of one, kept only to see a tag cut in two
        self._watch = False
        self._tail = ""

    def __repr__(self) -> str:
        return f"<InlineThinking {self.mode} {self.phase.value} held={len(self._held)}>"

    @property
    def held(self) -> str:
        """What is held back until the next delta or :meth:`flush` decides it."""
        return self._held

    @property
    def undecided(self) -> str:
        """At the start of the content, what is held until it shows whether an opener comes
        (leading whitespace, a prefix of ``<think>``): nothing has been passed on yet. ""
        in any other phase."""
        return self._held if self.phase is Phase.START else ""

    def drop_undecided(self) -> None:
        """Forget :attr:`undecided`: the content starts again (a mid-stream continuation
        with nothing to prefill, gateway/messages/continuation.py)."""
        if self.phase is Phase.START:
            self._held = ""

    def passes(self, text: str) -> bool:
        """``feed(text)`` would return ``text`` itself as text and change nothing: a caller
        on the hot path may use ``text`` as it is instead (no list, no tuple)."""
        return self.phase is Phase.TEXT and (
            not self._watch or (not self._tail and "<" not in text)
        )

    def feed(self, text: str) -> list[Piece]:
        """One content delta in; the pieces it decides, in order, same-kind pieces merged."""
        if self.passes(text):
            return [(False, text)] if text else []  # the hot path: one scan at most
        handler = _HANDLERS.get(self.phase)
        if handler is None:
            raise RuntimeError(f"InlineThinking.feed in phase {self.phase.value}")
        out: list[Piece] = []
        if text:
            handler(self, text, out)
        return out

    def flush(self) -> list[Piece]:
        """End of content: release what is held (rules 2 and 3 decide it as if no more came)."""
        if self.phase is Phase.DONE:
            raise RuntimeError("InlineThinking.flush called twice")
        out: list[Piece] = []
        if self.phase is Phase.START:
            held, self._held = self._held, ""
            self._no_opener(held, out)
        if self.phase is Phase.REASONING and self._held:
            _emit(out, True, self._held)  # no close came: a held "\n" or "</thi" is reasoning
        self._held = ""
        self.phase = Phase.DONE
        return out

    def _on_start(self, text: str, out: list[Piece]) -> None:
        buf = self._held + text if self._held else text
        self._held = ""
        lead = 0
        while lead < len(buf) and lead <= MAX_WHITESPACE and buf[lead] in _WS:
            lead += 1
        if lead <= MAX_WHITESPACE:
            if buf.startswith(_OPEN, lead):
                self.phase = Phase.REASONING_LEAD
                self._on_reasoning_lead(buf[lead + len(_OPEN) :], out)
                return
            if len(buf) - lead < len(_OPEN) and _OPEN.startswith(buf[lead:]):  # "<thi": undecided
                self._held = buf
                return
        self._no_opener(buf, out)

    def _no_opener(self, buf: str, out: list[Piece]) -> None:
        if self.mode == "auto":
            self.phase = Phase.TEXT
            self._watch = True
            self._on_text(buf, out)
        else:  # "opened": the template opened it, the content is reasoning from the start
            self.phase = Phase.REASONING_LEAD
            self._on_reasoning_lead(buf, out)

    def _on_reasoning_lead(self, text: str, out: list[Piece]) -> None:
        rest = text.lstrip(_WS)
        if rest:
            self.phase = Phase.REASONING
            self._on_reasoning(rest, out)

    def _on_reasoning(self, text: str, out: list[Piece]) -> None:
        buf = self._held + text if self._held else text
        self._held = ""
        close = buf.find(_CLOSE)
        if close >= 0:
            _emit(out, True, buf[: _ws_run_start(buf, close)])
            self.phase = Phase.AFTER_CLOSE
            self._on_after_close(buf[close + len(_CLOSE) :], out)
            return
        keep = _hold_start(buf)
        _emit(out, True, buf[:keep])
        self._held = buf[keep:]

    def _on_after_close(self, text: str, out: list[Piece]) -> None:
        rest = text.lstrip(_WS)
        if rest:
            self.phase = Phase.TEXT
            _emit(out, False, rest)

    def _on_text(self, text: str, out: list[Piece]) -> None:
        if self._watch:
            self._look_for_orphan(text)
        _emit(out, False, text)

    def _look_for_orphan(self, text: str) -> None:
        tail = self._tail
        if (tail and _CLOSE in tail + text[:_PARTIAL]) or _CLOSE in text:
            self.orphan_close = True
            self._watch = False  # seen once is enough: the hot path from now on
            self._tail = ""
            return
        # a short delta may continue a partial tag from before it
        seen = tail + text if len(text) < _PARTIAL else text
        self._tail = seen[_partial_close_start(seen) :]


def _partial_close_start(s: str) -> int:
    """Index where a proper prefix of ``</think>`` ends ``s``, or ``len(s)``.

    The tag has one ``<``, so such a suffix starts at the last ``<`` of the last 7 characters.
    """
    j = s.rfind("<", max(0, len(s) - _PARTIAL))
    return j if j >= 0 and _CLOSE.startswith(s[j:]) else len(s)


def _ws_run_start(s: str, end: int) -> int:
    """Start of the last ``min(MAX_WHITESPACE, run)`` whitespace characters before ``end``."""
    k = end
    while k > 0 and end - k < MAX_WHITESPACE and s[k - 1] in _WS:
        k -= 1
    return k


def _hold_start(buf: str) -> int:
    """In reasoning: where the held suffix (whitespace, then a partial close tag) starts."""
    return _ws_run_start(buf, _partial_close_start(buf))


def _emit(out: list[Piece], reasoning: bool, piece: str) -> None:
    if not piece:
        return
    if out and out[-1][0] is reasoning:
        out[-1] = (reasoning, out[-1][1] + piece)
    else:
        out.append((reasoning, piece))


_HANDLERS: dict[Phase, Callable[[InlineThinking, str, list[Piece]], None]] = {
    Phase.START: InlineThinking._on_start,
    Phase.REASONING_LEAD: InlineThinking._on_reasoning_lead,
    Phase.REASONING: InlineThinking._on_reasoning,
    Phase.AFTER_CLOSE: InlineThinking._on_after_close,
    Phase.TEXT: InlineThinking._on_text,
}


def split_inline_thinking(text: str, mode: str) -> list[Piece]:
    """A whole content (a buffered response): the same pieces a stream of it gives, merged."""
    splitter = InlineThinking(mode)
    out = splitter.feed(text)
    for reasoning, piece in splitter.flush():
        _emit(out, reasoning, piece)
    return out
