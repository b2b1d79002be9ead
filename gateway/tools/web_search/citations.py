"""Citations of web search results, only where the model's text quotes a result verbatim.

The API's text blocks may carry ``web_search_result_location`` citations (``url``, ``title``,
``cited_text``, ``encrypted_index``); streamed, a cited passage is a text block of its own
whose ``citations_delta`` comes before its text. A local model writes no citations, and a
citation must never be invented: here a passage is cited only when the model's text holds a
search result's whole snippet, character for character (snippets shorter than
:data:`MIN_QUOTE` are not looked for: a short phrase is not a quote). Paraphrase is never
cited.

A source may carry its own ``citation`` (a web fetch's passage,
:mod:`gateway.tools.web_fetch.fetches`: a ``char_location`` into the fetched document): that
is what cites it, one reply's quotes of searches and of fetches found in one pass.

Streamed text is held back only while it could still be the start of a snippet (at most one
snippet's length), so a reply that quotes nothing streams as before.

Cost: the snippets are indexed by their first :data:`MIN_QUOTE` characters, so a position of
the text is one slice and one dict look-up, not a comparison with every snippet (which made
200k characters against 40 snippets of 1,000 characters take 6 s on the event loop). Only
the snippets sharing those characters are compared there, and one reply's comparisons do
at most :data:`_WORK_PER_CHAR` units of work per character of its text (plus
:data:`_WORK_BASE`; a unit is a look-up or :data:`_CHARS_PER_UNIT` characters compared):
past that the reply's text is passed on uncited. A text that only repeats the snippets'
openings, at once or a character at a time, is then read in linear time; a reply that
quotes never comes near it (a quote pays for itself with the text it covers). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway.messages import search_blocks as blocks

__all__ = ["MIN_QUOTE", "Quotes"]

MIN_QUOTE = 20  # characters a snippet needs to be looked for as a quote
_CITED_TEXT = 150  # the API's cited_text holds at most this many characters
# comparing a snippet of n characters costs 1 + n // _CHARS_PER_UNIT units of split()'s work
_CHARS_PER_UNIT = 64
_WORK_PER_CHAR = 8
_WORK_BASE = 16384

Piece = tuple[str, "dict[str, Any] | None"]  # (text, its citation or None)


class Quotes:
    """The snippets of one reply's results, and the quotes of them in the model's text."""

    __slots__ = ("_firsts", "_held", "_index", "_key", "_openings", "_sources", "_work")

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._sources: list[Mapping[str, Any]] = []
        self._firsts: set[str] = set()
        # a snippet's first MIN_QUOTE characters -> the sources opening so, in their order
        self._index: dict[str, list[Mapping[str, Any]]] = {}
        self._openings: set[str] = set()  # the shorter openings: a text's tail may be one
        self._work = _WORK_BASE  # what this reply's comparisons may still cost
        self._held = 0  # characters of the last split()'s text given back to be held

    def __bool__(self) -> bool:
        return bool(self._sources)

    def add(self, results: Iterable[Mapping[str, Any]]) -> None:
        for result in results:
            snippet = result.get("snippet") or ""
            if len(snippet) < MIN_QUOTE:
                continue
            same = self._index.setdefault(snippet[:MIN_QUOTE], [])
            if any(s["snippet"] == snippet for s in same):
                continue  # the first source of a snippet is the one cited
            same.append(result)
            self._sources.append(result)
            self._firsts.add(snippet[0])
            self._openings.update(snippet[:n] for n in range(1, MIN_QUOTE))

    def split(self, text: str) -> tuple[list[Piece], str]:
        """``text`` (the held text and the new piece) cut into plain and quoted pieces, and
        what to hold back: a tail that may still become a quote."""
        end = len(text)
        if self._work < 0:  # see the module docstring
            return ([(text, None)] if text else []), ""
        self._work += _WORK_PER_CHAR * max(0, end - self._held)
        out: list[Piece] = []
        start = at = 0
        while at < end:
            if text[at] not in self._firsts:
                at += 1
                continue
            found, maybe, cost = self._at(text, at)
            self._work -= cost
            if self._work < 0:  # see the module docstring: the rest is passed on uncited
                at = end
                break
            if found is not None:
                if at > start:
                    out.append((text[start:at], None))
                snippet = found["snippet"]
                out.append((snippet, self._citation(found)))
                at = start = at + len(snippet)
                continue
            if maybe:
                break
            at += 1
        if at > start:
            out.append((text[start:at], None))
        self._held = end - at
        return out, text[at:]

    def _at(self, text: str, at: int) -> tuple[Mapping[str, Any] | None, bool, int]:
        """(the source whose snippet starts at ``at``, whether one may yet start there, the
        work it took)."""
        rest = len(text) - at
        if rest < MIN_QUOTE:
            return None, text[at:] in self._openings, 1
        candidates = self._index.get(text[at : at + MIN_QUOTE])
        if candidates is None:
            return None, False, 1
        cost = 0
        maybe = False
        tail: str | None = None
        for source in candidates:
            snippet = source["snippet"]
            cost += 1
            if rest >= len(snippet):
                cost += len(snippet) // _CHARS_PER_UNIT
                if text.startswith(snippet, at):
                    return source, False, cost
            elif not maybe:
                if tail is None:
                    tail = text[at:]
                cost += rest // _CHARS_PER_UNIT
                maybe = snippet.startswith(tail)
        return None, maybe, cost

    def _citation(self, source: Mapping[str, Any]) -> dict[str, Any]:
        made = source.get("citation")
        if made is not None:  # a fetched document's passage: its citation made with it
            return dict(made)
        cited = source["snippet"][:_CITED_TEXT]
        return {
            "type": "web_search_result_location",
            "url": source["url"],
            "title": source.get("title"),
            "encrypted_index": blocks.seal_result(
                self._key, {"url": source["url"], "title": source.get("title"), "snippet": cited}
            ),
            "cited_text": cited,
        }
