"""Model-name patterns: ``*`` matches any run of characters (newlines too), nothing else is
special, and a pattern matches the whole name.

Matched without a regex: a ``*``-only glob needs no backtracking, because the leftmost place
each literal piece between two stars can go is always as good as any later one (whatever a
later placement leaves for the rest, an earlier one leaves more). So: the first piece is a
prefix, the last a suffix, and each piece between is found with ``str.find`` after the
previous one. One pass over the name per piece, O(len(name) * len(pattern)) at worst, where
``.*a.*b.*`` as a regex backtracks polynomially in the name's length (a 2,000-character name
against ``x-*-*-*-*-z`` ran for minutes).
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=256)
def _pieces(pattern: str) -> tuple[str, ...]:
    return tuple(pattern.split("*"))


def glob_match(pattern: str, name: str) -> bool:
    """Whether ``name`` matches ``pattern`` in full, ``*`` matching any run (empty too)."""
    pieces = _pieces(pattern)
    if len(pieces) == 1:
        return name == pattern
    head, *middle, tail = pieces
    if len(name) < len(head) + len(tail) or not name.startswith(head) or not name.endswith(tail):
        return False
    at, end = len(head), len(name) - len(tail)
    for piece in middle:
        if not piece:
            continue
        found = name.find(piece, at, end)
        if found < 0:
            return False
        at = found + len(piece)
    return True
