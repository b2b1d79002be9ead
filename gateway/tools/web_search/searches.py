"""One request's web searches: its limit (``max_uses``, ``web_search.max_searches``), its
result-text budget, its domain filters and language, and the sealing of each result.

:class:`Searches` runs one call of the model's search function against the backend
(:mod:`.searxng`) and answers with the ``web_search_tool_result`` block's content and the
tool message the model gets; the round loop is :mod:`.loop`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.messages import search_blocks as blocks
from gateway.tools.web_search.citations import Quotes
from gateway.tools.web_search.domains import DomainFilter
from gateway.tools.web_search.searxng import SearchFailed, Searxng, language, query_error

__all__ = ["MAX_QUERY_CHARS", "Searches"]

MAX_QUERY_CHARS = 500  # a longer query is answered with query_too_long


class Searches:
    """One request's searches: the limit, the text budget, the filters, the sealing (a
    :class:`~gateway.tools.rounds.ServerTool`)."""

    result_type = "web_search_tool_result"
    usage_key = "web_search_requests"

    __slots__ = (
        "_backend",
        "_keep",
        "_key",
        "_language",
        "_request_id",
        "attempts",
        "chars_left",
        "limit",
        "name",
        "quotes",
        "requests",
    )

    def __init__(
        self,
        backend: Searxng,
        tool: Mapping[str, Any],
        signing_key: bytes,
        *,
        request_id: str | None = None,
        quotes: Quotes | None = None,
    ) -> None:
        config = backend.config
        self.name = tool["name"]
        max_uses = tool.get("max_uses")
        self.limit = min(max_uses, config.max_searches) if max_uses else config.max_searches
        self.attempts = 0
        self.requests = 0  # searches the backend answered: usage.server_tool_use
        self.chars_left = config.max_request_chars
        self._backend = backend
        self._key = signing_key
        self._keep = DomainFilter(tool.get("allowed_domains"), tool.get("blocked_domains"))
        self._language = language(tool.get("user_location"))
        self._request_id = request_id  # for the backend's failure log lines
        # the results' snippets, for citations (the reply's, shared with its other tools)
        self.quotes = quotes if quotes is not None else Quotes(signing_key)

    def seen(self, block: Mapping[str, Any]) -> None:
        """Another result of the reply: nothing a search needs."""

    async def run(self, tool_input: Mapping[str, Any]) -> tuple[Any, str]:
        """(the result block's ``content``, the tool message the model gets) for one call."""
        self.attempts += 1
        query: Any = tool_input.get("query")
        code = (
            "max_uses_exceeded"
            if self.attempts > self.limit
            else query_error(query, MAX_QUERY_CHARS)
        )
        if code is None and self.chars_left <= 0:
            code = "request_too_large"
        if code is None:
            try:
                results = await self._backend.search(
                    query,
                    language=self._language,
                    keep=self._keep,
                    max_chars=self.chars_left,
                    request_id=self._request_id,
                )
            except SearchFailed as failed:
                code = failed.code
        else:
            self._backend.count_refused(code)
        if code is not None:
            return (
                {"type": "web_search_tool_result_error", "error_code": code},
                blocks.error_text(code),
            )
        self.requests += 1
        kept: list[dict[str, Any]] = []
        text = blocks.results_text([])
        for result in results:  # as many as the request's text budget holds
            candidate = blocks.results_text([*kept, result])
            if kept and len(candidate) > self.chars_left:
                break
            kept.append(result)
            text = candidate
        self.chars_left -= len(text)
        self.quotes.add(kept)
        content = [
            {
                "type": "web_search_result",
                "url": r["url"],
                "title": r["title"],
                "encrypted_content": blocks.seal_result(self._key, r),
                "page_age": r["page_age"],
            }
            for r in kept
        ]
        return content, text
