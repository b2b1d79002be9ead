"""A model's ``content`` as local engines really send it, normalised into what it means.

An engine started without its reasoning parser leaves ``<think>…</think>`` in the content
(:mod:`.think`); one started without its tool parser leaves a tool call written in the
model's native format (:mod:`.text_tools`). :class:`ContentNormaliser` runs both over the
content deltas of one reply, in that order, and yields ordered pieces:

* ``(THINKING_PIECE, str)``: reasoning found inline;
* ``(TEXT_PIECE, str)``: what the model said;
* ``(CALL_PIECE, TextToolCall)``: a tool call written as text, for a tool the request offered.

Where calls are looked for, whitespace at the end of the text so far (the newlines a model
writes before a call, in a delta of their own or at the end of a sentence's) is held until
something follows it: text after it keeps it, a call drops it, and at the end it is dropped
after a call and kept otherwise. Whatever the split of the content into deltas, the same
whitespace goes, so no text ends in a line break before a tool call and prose keeps every
byte.

The buffered path (``from_chat``) feeds the whole content once and the stream feeds each
delta: the pieces are the same for any split, so buffered and streamed replies to the same
upstream output are equal. Pure: no I/O, no logging; the caller counts what was found.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from gateway.local.text_tools import TextToolCall, TextToolCalls
from gateway.local.think import InlineThinking, Phase

__all__ = ["CALL_PIECE", "TEXT_PIECE", "THINKING_PIECE", "ContentNormaliser", "LazyNormaliser"]

THINKING_PIECE, TEXT_PIECE, CALL_PIECE = 0, 1, 2

Piece = tuple[int, Any]
_MAX_SPACE = 4096  # whitespace held at most; past it, it is text like any other


class ContentNormaliser:
    """Content deltas in, ordered (kind, value) pieces out; see the module docstring.

    ``thinking``: the inline-reasoning mode ("auto", "opened", "off"); ``tool_names``: the
    tools the request offered (none: no call is ever recognised); ``text_calls``: look for
    tool calls written as text at all.
    """

    __slots__ = ("_after_call", "_calls", "_space", "_think", "calls_found", "thinking_found")

    def __init__(
        self, *, thinking: str = "auto", tool_names: Collection[str] = (), text_calls: bool = True
    ) -> None:
        self._think = InlineThinking(thinking) if thinking != "off" else None
        self._calls = TextToolCalls(tool_names) if text_calls and tool_names else None
        self._space = ""  # whitespace-only text held until something follows it
        self._after_call = False  # the last piece out was a call
        self.calls_found = 0
        self.thinking_found = False

    @property
    def orphan_close(self) -> bool:
        """A ``</think>`` with no opener was seen (a template that opens it in the prompt)."""
        return self._think is not None and self._think.orphan_close

    @property
    def held_call(self) -> str:
        """The end of the content held back because it may be a tool call written as text
        (a possible opener such as ``<tool_``, an open ``<tool_call>`` block, a whole message
        that may be Llama's ``{"name": ...}``; at the very start also what the inline
        reasoning holds, whitespace and a ``<`` that may open ``<think>`` as well as a call):
        never shown, an end of the raw content as the engine sent it (reasoning is decided
        before a call can start, so nothing held follows it); "" when none is held, or no
        tools were offered. Whitespace held after shown text, before it, is not part of it:
        it stays held (text after it keeps it, a call drops it)."""
        calls = self._calls
        if calls is None:
            return ""
        if self._think is not None and self._think.undecided:
            return self._think.undecided  # nothing has reached the call parser yet
        return calls.held

    @property
    def holds_call(self) -> bool:
        """:attr:`held_call` is not "", without joining what is held (asked per delta)."""
        calls = self._calls
        if calls is None:
            return False
        return bool(self._think is not None and self._think.undecided) or calls.holding

    def reasoning_parsed(self) -> bool:
        """The engine sent reasoning in a field of its own: its reasoning parser is on, and
        content never carries an inline ``<think>``, so it is no longer looked for (unless
        content already came and is held at its start). True when nothing is left to look
        for (no tool calls either): the caller may stop feeding content here."""
        think = self._think
        if think is not None and think.phase is Phase.START and not think.held:
            self._think = None
        return self._think is None and self._calls is None

    def drop_held_call(self) -> None:
        """Forget :attr:`held_call`: a stream cut inside it is asked again with only what
        came before it as the prefill, and the model writes the call again whole (a
        prefill ending inside a call's text is resumed imperfectly: a garbled call reaches
        the client as text). See gateway/messages/continuation.py."""
        if self._calls is not None:
            if self._think is not None:
                self._think.drop_undecided()
            self._calls.drop_held()

    def plain(self, text: str) -> bool:
        """Take ``text`` as plain text if :meth:`feed` would return it as one text piece of
        itself with nothing held: True, and the caller uses ``text`` as it is (the stream's
        hot path: no lists, no tuples per chunk); False, and the caller feeds it."""
        if self._think is not None and not self._think.passes(text):
            return False
        calls = self._calls
        if calls is None:
            return True
        if self._space or not calls.passes(text) or text[-1:].isspace() or not text:
            return False
        self._after_call = False
        return True

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        think = self._think
        if think is None:
            self._text(text, out)
            return out
        for reasoning, piece in think.feed(text):
            if reasoning:
                self.thinking_found = True
                out.append((THINKING_PIECE, piece))
            else:
                self._text(piece, out)
        return out

    def whole(self, text: str) -> list[Piece]:
        """A whole content (a buffered reply): ``feed(text) + flush()``. Text with no ``<``
        where only inline reasoning in "auto" mode is looked for (no tool was offered, or
        text calls are off) is one text piece as it is: no opener, no orphan close, nothing
        held (a whole content of whitespace is text too, once flushed)."""
        think = self._think
        if (
            self._calls is None
            and think is not None
            and think.mode == "auto"
            and think.phase is Phase.START
            and not think.held
            and "<" not in text
        ):
            think.phase = Phase.DONE  # as flush() leaves it
            return [(TEXT_PIECE, text)] if text else []
        return self.feed(text) + self.flush()

    def flush(self) -> list[Piece]:
        """The end of the content: whatever was held, resolved."""
        out: list[Piece] = []
        if self._think is not None:
            for reasoning, piece in self._think.flush():
                if reasoning:
                    self.thinking_found = True
                    out.append((THINKING_PIECE, piece))
                else:
                    self._text(piece, out)
        if self._calls is not None:
            self._pieces(self._calls.flush(), out)
        if self._space and not self._after_call:
            out.append((TEXT_PIECE, self._space))
        self._space = ""
        return out

    def _text(self, text: str, out: list[Piece]) -> None:
        if self._calls is None:
            self._plain(text, out)
        else:
            self._pieces(self._calls.feed(text), out)

    def _pieces(self, pieces: list[str | TextToolCall], out: list[Piece]) -> None:
        for piece in pieces:
            if isinstance(piece, str):
                self._plain(piece, out)
            else:
                self._space = ""
                self._after_call = True
                self.calls_found += 1
                out.append((CALL_PIECE, piece))

    def _plain(self, text: str, out: list[Piece]) -> None:
        if not text:
            return
        if self._calls is not None:
            body = text.rstrip()
            if self._space:
                body = self._space + body if body else ""
            held = text[len(text.rstrip()) :]
            if not body:  # only whitespace so far
                self._space += held
                if len(self._space) <= _MAX_SPACE:
                    return
                body, self._space = self._space, ""
            else:
                self._space = held
            self._after_call = False
            if len(self._space) > _MAX_SPACE:
                body, self._space = body + self._space, ""
            out.append((TEXT_PIECE, body))
            return
        out.append((TEXT_PIECE, text))


class LazyNormaliser:
    """A buffered reply's :class:`ContentNormaliser`, built only where the whole content
    needs one: with no tool offered (or text calls off), a content the normaliser would
    return as one text piece of itself (the engine sent its reasoning in a field of its
    own, or no ``<`` where only "auto" inline reasoning is looked for) costs no normaliser.
    :attr:`built` is the one made (None: none was needed; nothing was found, nothing to
    count)."""

    __slots__ = ("built", "thinking", "tool_names")

    def __init__(self, *, thinking: str = "auto", tool_names: Collection[str] = ()) -> None:
        self.thinking = thinking
        self.tool_names = tool_names
        self.built: ContentNormaliser | None = None

    def for_whole(self, text: str, *, reasoning: bool) -> ContentNormaliser | None:
        """The normaliser for the whole content ``text`` (``reasoning``: the reply carries
        reasoning in a field of its own), or None where it would change nothing."""
        if not self.tool_names and (
            self.thinking == "off" or reasoning or (self.thinking == "auto" and "<" not in text)
        ):
            return None
        self.built = ContentNormaliser(thinking=self.thinking, tool_names=self.tool_names)
        return self.built
