"""One request's web fetches: its limit, its URL context, its domain filters, its text
budget, and each fetched page made a ``web_fetch_result`` document.

:class:`Fetches` is the :class:`~gateway.tools.rounds.ServerTool` the rounds loop runs for a
call of the model's ``web_fetch(url)``. In order, a call is refused without any network
access when: the request's fetches are used up (``max_uses_exceeded``); the URL is not a
string, not ``http(s)``, or not one a browser parses (``invalid_tool_input``); it is longer
than the fetcher allows (``url_too_long``); the conversation does not hold it
(``url_not_in_prior_context``, :mod:`.context`); the tool's ``allowed_domains`` /
``blocked_domains`` refuse its host (``url_not_allowed``, web search's
:class:`~gateway.tools.web_search.domains.DomainFilter`); the request's text budget is spent
(``content_too_large``). Then the fetcher (:mod:`.net`) fetches it, checking every address
and redirect (its refusals carry their own codes) and asking the domain filters about each
redirect's target before requesting it (one off the allowed domains is ``url_not_allowed``,
and is never requested).

HTML becomes its readable text and title (:mod:`.extract`), other text is decoded as is, a
PDF goes to the client whole (base64) and to the model as the text the gateway's PDF
workers extract (:mod:`gateway.messages.documents`); any other type is
``unsupported_content_type``. The text is cut to the tool's ``max_content_tokens`` (at
:data:`CHARS_PER_TOKEN` characters a token, the API's "approximate" limit) and
``web_fetch.max_content_chars``. With ``citations.enabled`` each sentence of the document of
at least :data:`~gateway.tools.web_search.citations.MIN_QUOTE` characters may be cited
(``char_location`` into the document) where the model's text quotes it whole.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from gateway.errors import InvalidRequest
from gateway.messages import fetch_blocks as blocks
from gateway.messages.documents.pdf_pool import PdfPool
from gateway.messages.documents.pdf_text import find_pdfs
from gateway.tools.web_fetch.context import UrlContext, url_key
from gateway.tools.web_fetch.extract import html_text, plain_text
from gateway.tools.web_fetch.fetcher_service import WebFetchService
from gateway.tools.web_fetch.net import FetchRefused
from gateway.tools.web_search.citations import MIN_QUOTE, Quotes
from gateway.tools.web_search.domains import DomainFilter
from gateway.tools.web_search.hosts import host_and_path

__all__ = ["CHARS_PER_TOKEN", "Fetches", "sentences"]

CHARS_PER_TOKEN = 4
_PDF = "application/pdf"
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]*")
_MAX_CITABLE = 2000  # sentences of one document offered for citations, at most


def sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence of ``text`` long enough to be a quote (a sentence ends
    at ``.``, ``!``, ``?`` or a line's end; leading spaces are not part of it)."""
    out = []
    for found in _SENTENCE.finditer(text):
        start, end = found.span()
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if end - start >= MIN_QUOTE:
            out.append((start, end))
            if len(out) >= _MAX_CITABLE:
                break
    return out


class Fetches:
    """One request's fetches (see the module docstring)."""

    name = blocks.NAME
    result_type = "web_fetch_tool_result"
    usage_key = "web_fetch_requests"

    def __init__(
        self,
        service: WebFetchService,
        tool: Mapping[str, Any],
        req: Mapping[str, Any],
        quotes: Quotes,
        *,
        model: str,
        pdfs: PdfPool | None = None,
        request_id: str | None = None,
    ) -> None:
        config = service.config
        max_uses = tool.get("max_uses")
        self.limit = min(max_uses, config.max_fetches) if max_uses else config.max_fetches
        self.attempts = 0
        self.requests = 0
        self.chars_left = config.max_fetched_chars
        tokens = tool.get("max_content_tokens")
        self.max_chars = config.max_content_chars
        if tokens:
            self.max_chars = min(self.max_chars, tokens * CHARS_PER_TOKEN)
        self.citations = bool((tool.get("citations") or {}).get("enabled"))
        self.quotes = quotes
        self.context = UrlContext(tool.get("url_sources"))
        self.context.add_request(req)
        self._documents = _documents_in(req)  # the next fetched document's index
        self._keep = DomainFilter(tool.get("allowed_domains"), tool.get("blocked_domains"))
        self._service = service
        self._model = model
        self._pdfs = pdfs
        self._request_id = request_id

    def seen(self, block: Mapping[str, Any]) -> None:
        """A result of this reply: its URLs may be fetched next."""
        self.context.add_result(block)

    async def run(self, tool_input: Mapping[str, Any]) -> tuple[Any, str]:
        """(the result block's ``content``, the tool message the model gets) for one call."""
        self.attempts += 1
        url: Any = tool_input.get("url")
        code = self._refusal(url)
        if code is not None:
            self._service.count(self._model, code)
            return self._error(code)
        began = time.perf_counter()
        try:
            content, text = await self._fetch(url)
        except FetchRefused as refused:
            code = refused.code if refused.code in blocks.ERROR_CODES else "unavailable"
            self._service.count(self._model, code, time.perf_counter() - began)
            self._service.failures.warn(
                refused.reason,
                error_code=code,
                host=_host(url),
                request_id=self._request_id,
                model=self._model,
            )
            return self._error(code)
        self._service.count(self._model, "ok", time.perf_counter() - began)
        self.requests += 1
        return content, text

    def _refusal(self, url: Any) -> str | None:
        """Why a call is answered without fetching (an error code), or None."""
        if self.attempts > self.limit:
            return "max_uses_exceeded"
        if not isinstance(url, str) or not url.strip():
            return "invalid_tool_input"
        if len(url) > self._service.fetcher.policy.max_url_chars:
            return "url_too_long"
        if url_key(url) is None:
            return "invalid_tool_input"
        if url not in self.context:
            return "url_not_in_prior_context"
        if not self._keep(url):
            return "url_not_allowed"
        if self.chars_left <= 0:
            return "content_too_large"
        return None

    async def _fetch(self, url: str) -> tuple[dict[str, Any], str]:
        # the domain filters judge every hop before it is requested: a redirect off the
        # allowed domains is url_not_allowed, and its target never sees a request
        fetched = await self._service.fetcher.fetch(url, allow=lambda hop: self._keep(str(hop)))
        limit = min(self.max_chars, self.chars_left)
        kind = fetched.kind
        title: str | None = None
        if kind == "pdf":
            source = {
                "type": "base64",
                "media_type": _PDF,
                "data": base64.b64encode(fetched.body).decode("ascii"),
            }
            text = (await self._pdf_text(source))[:limit]
        else:
            if kind == "html":  # the fetcher passes HTML, text and PDF only
                title, text = html_text(fetched.body, fetched.charset, max_chars=limit)
            else:
                text = plain_text(fetched.body, fetched.charset, max_chars=limit)
            text = text[:limit]
            source = {"type": "text", "media_type": "text/plain", "data": text}
        self.chars_left -= len(text)
        document: dict[str, Any] = {"type": "document", "source": source}
        document["title"] = title
        document["citations"] = {"enabled": self.citations}
        index = self._documents
        self._documents += 1
        if self.citations and source["type"] == "text":
            self._citable(text, title, index)
        content = {
            "type": "web_fetch_result",
            "url": fetched.url,
            "retrieved_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "content": document,
        }
        return content, blocks.document_text(fetched.url, title, text)

    async def _pdf_text(self, source: dict[str, Any]) -> str:
        """A fetched PDF's text, read by the gateway's PDF workers (as a user's PDF is)."""
        if self._pdfs is None:
            raise FetchRefused("unsupported_content_type", "no_pdf_workers")
        req = {"messages": [{"role": "user", "content": [{"type": "document", "source": source}]}]}
        try:
            out = await self._pdfs.to_text(req, find_pdfs(req["messages"]))
        except InvalidRequest:  # not a PDF the workers can read, or out of CPU time
            raise FetchRefused("unsupported_content_type", "pdf_unreadable") from None
        # the document, its source now the text (gateway/messages/documents/pdf_text.py)
        return str(out["messages"][0]["content"][0]["source"]["data"])

    def _citable(self, text: str, title: str | None, index: int) -> None:
        self.quotes.add(
            {
                "snippet": text[start:end],
                "citation": {
                    "type": "char_location",
                    "cited_text": text[start:end],
                    "document_index": index,
                    "document_title": title,
                    "start_char_index": start,
                    "end_char_index": end,
                },
            }
            for start, end in sentences(text)
        )

    def _error(self, code: str) -> tuple[dict[str, Any], str]:
        return {"type": "web_fetch_tool_result_error", "error_code": code}, blocks.error_text(code)


def _documents_in(req: Mapping[str, Any]) -> int:
    """Documents the conversation holds before this reply's fetches: the user's document
    blocks and earlier fetched documents (a ``char_location`` citation's
    ``document_index`` counts them in order)."""
    count = 0
    for turn in req.get("messages") or ():
        content = turn.get("content")
        if isinstance(content, str):
            continue
        for block in content or ():
            kind = block.get("type")
            if kind == "document" or (
                kind == "web_fetch_tool_result"
                and (block.get("content") or {}).get("type") == "web_fetch_result"
            ):
                count += 1
    return count


def _host(url: str) -> str:
    """The host of a URL, for a log line (never its path or query: they may hold secrets)."""
    parsed = host_and_path(url)
    return parsed[0] if parsed is not None else ""
