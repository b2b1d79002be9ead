"""``thinking.display: "updates"``: the short progress note a thinking block shows.

Anthropic facts relied on: with ``display: "updates"`` (beta
``thinking-display-updates-2026-08-18``, what Claude Code 2.1.332 asks on every request)
the reasoning itself stays hidden and only the short progress updates the model writes
between tool calls come back; each thinking block still carries its signature, so the
reasoning goes back to the model on the next turn.

A local engine writes no separate progress notes: its reasoning is all there is. The
gateway shows, in the block's ``thinking``, the note the reasoning ends on: its last
non-empty paragraph (where a model states what it does next), at most
:data:`UPDATE_CHARS` characters: a longer one keeps its end, from a word on, after "…".
The signature seals the whole reasoning, as for ``"omitted"``; a replayed block whose text
is exactly the note its signature's reasoning gives is restored to that reasoning
(:func:`is_update_of`), so the engine sees what it wrote, and its prefix cache still matches.

Cost: one backward scan over the reasoning's tail, once per thinking block (at its end),
never per token; at most :data:`_SCAN` characters are read.
"""

from __future__ import annotations

__all__ = ["UPDATE_CHARS", "is_update_of", "progress_update"]

# A progress note, at most: a sentence or two, as the API's updates are.
UPDATE_CHARS = 240
# Characters from the end read to find the last paragraph (bounds the work on a long block).
_SCAN = 4 * UPDATE_CHARS
_ELLIPSIS = "…"


def progress_update(reasoning: str) -> str:
    """The short note shown for ``reasoning`` (``""`` for blank reasoning)."""
    tail = reasoning[-_SCAN:].rstrip()
    if not tail:
        return ""
    cut = tail.rfind("\n\n")
    while cut != -1 and not tail[cut:].strip():
        cut = tail.rfind("\n\n", 0, cut)
    paragraph = " ".join(tail[cut + 1 :].split()) if cut != -1 else " ".join(tail.split())
    if len(paragraph) <= UPDATE_CHARS:
        return paragraph
    end = paragraph[len(paragraph) - (UPDATE_CHARS - len(_ELLIPSIS)) :]
    space = end.find(" ")
    if 0 <= space < UPDATE_CHARS // 2:
        end = end[space + 1 :]
    return _ELLIPSIS + end


def is_update_of(text: str, reasoning: str) -> bool:
    """``text`` is the note :func:`progress_update` gives for ``reasoning``."""
    return bool(text) and progress_update(reasoning) == text
