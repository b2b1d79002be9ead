"""The SearXNG backend: one search, bounded, its failure an API error code.

SearXNG's JSON API (``GET {searxng_url}/search?q=QUERY&format=json``, the ``json`` format
enabled in its ``settings.yml`` under ``search.formats``) answers ``{"query",
"number_of_results", "results": [{"url", "title", "content", "publishedDate", "engine",
"score", "category", ...}], "answers", "corrections", "infoboxes", "suggestions",
"unresponsive_engines"}``; ``publishedDate`` may be null or absent, ``content`` absent. A
``language`` parameter (``en-US``, ``de``, ``all``) picks the results' language.

Bounds: a search takes at most ``web_search.timeout`` seconds, all in (connect, answer,
body); a body past ``web_search.max_response_bytes`` is not read further; a big body is
decoded in a thread, so neither a slow nor a large answer stalls the event loop. What fails
becomes the ``web_search_tool_result_error`` code the reply carries: HTTP 429 ->
``too_many_requests``; any other status, a timeout, a connection error or a body that is not
SearXNG's JSON -> ``unavailable``. The backend's address never reaches a client.

Client: aiohttp's own ``ClientSession`` (one per process, made and closed by the app), not
the upstream pool: that pool is built for chat-completion streams (llhttp framing, replicas,
continuation, per-upstream metrics), a search is one small GET to a different kind of server,
and aiohttp's client gives the timeouts, redirects and keep-alive it needs. This module is
that client's boundary: aiohttp's errors are caught here and nowhere else in the tools.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import aiohttp
import structlog

from gateway.ops.config_schema import WebSearchConfig
from gateway.ops.metrics import Metrics
from gateway.text import jsonutil

__all__ = ["BACKEND", "Result", "SearchFailed", "Searxng", "language", "parse_results",
           "query_error"]

BACKEND = "searxng"  # the metrics' backend label
Result = dict[str, Any]  # {"url", "title", "page_age", "snippet"}

_log = structlog.get_logger("gateway.tools.searxng")
_OFF_LOOP_BYTES = 256 * 1024  # a body past this is decoded in a thread
_MAX_URL = 2048
_MAX_CONNECTIONS = 32  # searches at once to the backend; more wait for a connection
_MAX_TITLE = 512


class SearchFailed(Exception):
    """A search that failed; ``code`` is the API's error code for it."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def _page_age(value: Any) -> str | None:
    """``publishedDate`` as the API writes ``page_age`` ("April 30, 2025"); None if absent."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value[:64]
    return f"{when:%B} {when.day}, {when.year}"


def _text(value: Any, limit: int) -> str:
    if not isinstance(value, str):
        return ""
    text = " ".join(value.split())  # one line: the model reads one snippet per line
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def parse_results(data: Any, *, max_results: int, max_chars: int,
                  keep: Any = None) -> list[Result]:
    """SearXNG's answer -> at most ``max_results`` results, each snippet at most
    ``max_chars`` characters; ``keep(url)`` filters (the tool's domains). Results without an
    http(s) URL are skipped, and a URL seen already. Raises SearchFailed("unavailable") for
    an answer that is not SearXNG's shape."""
    if not isinstance(data, Mapping) or not isinstance(data.get("results"), list):
        raise SearchFailed("unavailable")
    out: list[Result] = []
    seen: set[str] = set()
    for item in data["results"]:
        if len(out) >= max_results:
            break
        if not isinstance(item, Mapping):
            continue
        url = item.get("url")
        if (not isinstance(url, str) or len(url) > _MAX_URL or url in seen
                or not url.startswith(("http://", "https://"))):
            continue
        if keep is not None and not keep(url):
            continue
        seen.add(url)
        out.append({
            "url": url,
            "title": _text(item.get("title"), _MAX_TITLE) or url,
            "page_age": _page_age(item.get("publishedDate")),
            "snippet": _text(item.get("content"), max_chars),
        })
    return out


class Searxng:
    """Searches one SearXNG instance (see the module docstring)."""

    __slots__ = ("_config", "_metrics", "_session")

    def __init__(self, config: WebSearchConfig, metrics: Metrics,
                 session: aiohttp.ClientSession | None = None) -> None:
        self._config = config
        self._metrics = metrics
        self._session = session
        metrics.add_web_search_backend(BACKEND)

    async def start(self) -> None:
        """Open the client session (in the running loop; the app's cleanup_ctx calls it)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=_MAX_CONNECTIONS),
                timeout=aiohttp.ClientTimeout(total=None))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def config(self) -> WebSearchConfig:
        return self._config

    async def search(self, query: str, *, language: str | None = None,
                     keep: Any = None, max_chars: int | None = None) -> list[Result]:
        """The results for ``query`` (filtered by ``keep``); raises SearchFailed."""
        t0 = time.perf_counter()
        try:
            data = await self._fetch(query, language)
            results = parse_results(
                data, max_results=self._config.max_results,
                max_chars=min(self._config.max_result_chars, max_chars or 1 << 30), keep=keep)
        except SearchFailed as failed:
            self._count(failed.code, t0)
            raise
        self._count(None, t0)
        return results

    def count_refused(self, code: str) -> None:
        """A search refused before the backend was asked (max_uses_exceeded, ...)."""
        self._metrics.web_search_errors.labels(BACKEND, code).inc()

    def _count(self, code: str | None, t0: float) -> None:
        metrics = self._metrics
        metrics.web_search_duration.labels(BACKEND).observe(time.perf_counter() - t0)
        metrics.web_searches.labels(BACKEND, "ok" if code is None else "error").inc()
        if code is not None:
            metrics.web_search_errors.labels(BACKEND, code).inc()

    async def _fetch(self, query: str, language: str | None) -> Any:
        config = self._config
        params = {"q": query, "format": "json"}
        if language:
            params["language"] = language
        status = None
        try:
            async with asyncio.timeout(config.timeout):
                assert self._session is not None, "Searxng.start() was not called"
                async with self._session.get(config.searxng_url + "/search", params=params,
                                             headers={"Accept": "application/json"}) as resp:
                    status = resp.status
                    if status == 429:
                        raise SearchFailed("too_many_requests")
                    if status != 200:
                        raise SearchFailed("unavailable")
                    body = await _read(resp.content, config.max_response_bytes)
        except SearchFailed as failed:
            _log.warning("web_search_failed", backend=BACKEND, error_code=failed.code,
                         status=status)
            raise
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            _log.warning("web_search_failed", backend=BACKEND, error_code="unavailable",
                         status=status, cause=type(exc).__name__)
            raise SearchFailed("unavailable") from None
        try:
            if len(body) > _OFF_LOOP_BYTES:
                return await asyncio.to_thread(jsonutil.loads, body)
            return jsonutil.loads(body)
        except ValueError:
            _log.warning("web_search_failed", backend=BACKEND, error_code="unavailable",
                         status=status, cause="not_json")
            raise SearchFailed("unavailable") from None


async def _read(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The body, or SearchFailed("unavailable") past ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0
    async for chunk in content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            _log.warning("web_search_failed", backend=BACKEND, error_code="unavailable",
                         cause="response_too_large", limit=limit)
            raise SearchFailed("unavailable")
        parts.append(chunk)
    return b"".join(parts)


# A user_location's country -> SearXNG's language for it (the main language; countries with
# several are left to the instance's default, as is a location without a country).
_LANGUAGES: Mapping[str, str] = {
    "US": "en-US", "GB": "en-GB", "AU": "en-AU", "NZ": "en-NZ", "IE": "en-IE", "CA": "en-CA",
    "DE": "de-DE", "AT": "de-AT", "FR": "fr-FR", "ES": "es-ES", "MX": "es-MX", "AR": "es-AR",
    "IT": "it-IT", "PT": "pt-PT", "BR": "pt-BR", "NL": "nl-NL", "SE": "sv-SE", "NO": "nb-NO",
    "DK": "da-DK", "FI": "fi-FI", "PL": "pl-PL", "CZ": "cs-CZ", "JP": "ja-JP", "KR": "ko-KR",
    "CN": "zh-CN", "TW": "zh-TW", "RU": "ru-RU", "UA": "uk-UA", "TR": "tr-TR", "GR": "el-GR",
    "HU": "hu-HU", "RO": "ro-RO", "IL": "he-IL", "SA": "ar-SA", "EG": "ar-EG", "ID": "id-ID",
    "TH": "th-TH", "VN": "vi-VN",
}


def language(location: Mapping[str, Any] | None) -> str | None:
    """The SearXNG ``language`` for a tool's ``user_location``, where one is clear."""
    if not location or not isinstance(location.get("country"), str):
        return None
    return _LANGUAGES.get(location["country"].upper())


def query_error(query: Any, limit: int) -> str | None:
    """Why a model's ``query`` cannot be searched (an error code), or None."""
    if not isinstance(query, str) or not query.strip():
        return "invalid_tool_input"
    if len(query) > limit:
        return "query_too_long"
    return None
