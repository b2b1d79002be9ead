"""Citations of web search results, only where the model's text quotes a result verbatim.

The API's text blocks may carry ``web_search_result_location`` citations (``url``, ``title``,
``cited_text``, ``encrypted_index``); streamed, a cited passage is a text block of its own
whose ``citations_delta`` comes before its text. A local model writes no citations, and a
citation must never be invented: here a passage is cited only when the model's text holds a
search result's whole snippet, character for character (snippets shorter than
:data:`MIN_QUOTE` are not looked for: a short phrase is not a quote). Paraphrase is never
cited.

Streamed text is held back only while it could still be the start of a snippet (at most one
snippet's length), so a reply that quotes nothing streams as before. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway.messages import web_search as blocks

__all__ = ["MIN_QUOTE", "Quotes"]

MIN_QUOTE = 20  # characters a snippet needs to be looked for as a quote
_CITED_TEXT = 150  # the API's cited_text holds at most this many characters

Piece = tuple[str, "dict[str, Any] | None"]  # (text, its citation or None)


class Quotes:
    """The snippets of one reply's results, and the quotes of them in the model's text."""

    __slots__ = ("_firsts", "_key", "_sources")

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._sources: list[Mapping[str, Any]] = []
        self._firsts: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self._sources)

    def add(self, results: Iterable[Mapping[str, Any]]) -> None:
        for result in results:
            snippet = result.get("snippet") or ""
            if len(snippet) >= MIN_QUOTE:
                self._sources.append(result)
                self._firsts.add(snippet[0])

    def split(self, text: str) -> tuple[list[Piece], str]:
        """``text`` (the held text and the new piece) cut into plain and quoted pieces, and
        what to hold back: a tail that may still become a quote."""
        out: list[Piece] = []
        start = at = 0
        end = len(text)
        while at < end:
            if text[at] not in self._firsts:
                at += 1
                continue
            found, maybe = self._at(text, at)
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
        return out, text[at:]

    def _at(self, text: str, at: int) -> tuple[Mapping[str, Any] | None, bool]:
        """(the source whose snippet starts at ``at``, whether one may yet start there)."""
        maybe = False
        rest = len(text) - at
        tail: str | None = None
        for source in self._sources:
            snippet = source["snippet"]
            if text.startswith(snippet, at):
                return source, False
            if not maybe and rest < len(snippet):
                if tail is None:
                    tail = text[at:]
                maybe = snippet.startswith(tail)
        return None, maybe

    def _citation(self, source: Mapping[str, Any]) -> dict[str, Any]:
        cited = source["snippet"][:_CITED_TEXT]
        return {"type": "web_search_result_location", "url": source["url"],
                "title": source.get("title"),
                "encrypted_index": blocks.seal_result(
                    self._key, {"url": source["url"], "title": source.get("title"),
                                "snippet": cited}),
                "cited_text": cited}
