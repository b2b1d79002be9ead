"""The SearXNG backend: one search, bounded, its failure an API error code.

SearXNG's JSON API (``GET {searxng_url}/search?q=QUERY&format=json``, the ``json`` format
enabled in its ``settings.yml`` under ``search.formats``) answers ``{"query",
"number_of_results", "results": [{"url", "title", "content", "publishedDate", "engine",
"score", "category", ...}], "answers", "corrections", "infoboxes", "suggestions",
"unresponsive_engines"}``; ``publishedDate`` may be null or absent, ``content`` absent. A
``language`` parameter (``en-US``, ``de``, ``all``) picks the results' language.

Bounds: a search takes at most ``web_search.timeout`` seconds, all in (connect, answer,
body); a body past ``web_search.max_response_bytes`` is not read further; a body past
:data:`_OFF_LOOP_BYTES` is decoded in a thread (the decoder's nesting, value and digit caps
apply): ujson holds the GIL while it parses (about 8 ms for 2 MiB of results here), the
checking walk after it (about three times that) lets the loop run; at most
:data:`_MAX_SCANNED` results of a list are looked at, each field cut before it is cleaned.

A backend is not trusted: a result keeps only an ``http(s)://`` URL with a host and nothing
in it that could break a line (whitespace, control characters), its title, snippet and date
are made one line of printable text (control and bidi-override characters and lone
surrogates dropped) and cut to their caps, and a field of another type is taken as absent.
Failures are logged (``web_search_failed``) at most once a second per cause, the lines held
back counted in the next (the upstream client's :class:`FailureLog`). What fails becomes
the ``web_search_tool_result_error`` code the reply carries: HTTP 429 ->
``too_many_requests``; any other status, a timeout, a connection error or a body that is not
SearXNG's JSON -> ``unavailable``. The backend's address never reaches a client.

Client: aiohttp's own ``ClientSession`` (one per process, made and closed by the app), not
the upstream pool: that pool is built for chat-completion streams (llhttp framing, replicas,
continuation, per-upstream metrics), a search is one small GET to a different kind of server,
and aiohttp's client gives the timeouts and keep-alive it needs. This module is that
client's boundary: aiohttp's errors are caught here and nowhere else in the tools.

Redirects are not followed: the operator names the instance, and a redirect (a proxy in
front of it, a compromised or misconfigured instance) could send the search, its query
and the gateway's connection to any host, also one inside the gateway's network. A 3xx
answer is a failure like any other status (``unavailable``, logged as ``http_3xx``).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from gateway.ops.config_schema import WebSearchConfig
from gateway.ops.metrics import Metrics
from gateway.text import jsonutil
from gateway.upstream.failures import FailureLog

__all__ = [
    "BACKEND",
    "Result",
    "SearchFailed",
    "Searxng",
    "language",
    "parse_results",
    "query_error",
]

BACKEND = "searxng"  # the metrics' backend label
Result = dict[str, Any]  # {"url", "title", "page_age", "snippet"}

_OFF_LOOP_BYTES = 256 * 1024  # a body past this is decoded in a thread
_MAX_URL = 2048
_MAX_CONNECTIONS = 32  # searches at once to the backend; more wait for a connection
_MAX_TITLE = 512
_MAX_SCANNED = 500  # results of one answer looked at, at most (SearXNG pages hold ~10-30)
_MAX_AGE = 64  # characters of a publishedDate kept when it is not an ISO date
# what never reaches a client or the model from a backend's text: C0/C1 controls, bidi
# overrides and isolates, the BOM, lone surrogates (not Unicode: the reply could not be
# encoded)
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")
# what a URL may not hold (a line of the model's tool message; a link a client shows)
_BAD_URL = re.compile(
    "[\x00-\x20\x7f-\xa0\u1680\u2000-\u200f\u2028-\u202f\u205f-\u206f\u3000\ufeff\ud800-\udfff]"
)


class SearchFailed(Exception):
    """A search that failed; ``code`` is the API's error code for it, ``cause`` what the
    log line says went wrong (None: nothing to log), ``status`` the backend's HTTP status."""

    def __init__(self, code: str, cause: str | None = None, status: int | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.cause = cause
        self.status = status


def _page_age(value: Any) -> str | None:
    """``publishedDate`` as the API writes ``page_age`` ("April 30, 2025"); None if absent.
    A date that is not ISO 8601 is kept as one short line of text."""
    if not isinstance(value, str) or not value:
        return None
    value = value[:_MAX_AGE]
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return _text(value, _MAX_AGE) or None
    return f"{when:%B} {when.day}, {when.year}"


def _text(value: Any, limit: int) -> str:
    """``value`` as one line of printable text of at most ``limit`` characters ("" if it
    is not a string); the work is bounded by ``limit``, not by the value's size."""
    if not isinstance(value, str):
        return ""
    cut = value[: limit * 4 + 64]  # whitespace runs collapse; more than this is never kept
    text = _UNPRINTABLE.sub("", " ".join(cut.split()))  # one line: one snippet per line
    if not text or (len(text) <= limit and len(cut) == len(value)):
        return text
    return text[: limit - 1].rstrip() + "…"


def _url(value: Any) -> str | None:
    """A result's URL, verbatim, when a client may be given it: ``http(s)://`` with a host,
    at most :data:`_MAX_URL` characters, nothing that breaks or hides in a line."""
    if (
        not isinstance(value, str)
        or len(value) > _MAX_URL
        or not value.startswith(("http://", "https://"))
        or _BAD_URL.search(value)
    ):
        return None
    try:
        parts = urlsplit(value)
        host = parts.hostname
        parts.port  # noqa: B018  # raises for a port that is not one
    except ValueError:  # a bracketed host that is not an IPv6 address, a bad port
        return None
    return value if host else None


def parse_results(data: Any, *, max_results: int, max_chars: int, keep: Any = None) -> list[Result]:
    """SearXNG's answer -> at most ``max_results`` results, each snippet at most
    ``max_chars`` characters; ``keep(url)`` filters (the tool's domains). Results without a
    URL a client may be given (:func:`_url`) are skipped, and a URL seen already; only the
    first :data:`_MAX_SCANNED` are looked at. Raises SearchFailed("unavailable") for an
    answer that is not SearXNG's shape."""
    if not isinstance(data, Mapping) or not isinstance(data.get("results"), list):
        raise SearchFailed("unavailable")
    out: list[Result] = []
    seen: set[str] = set()
    for item in data["results"][:_MAX_SCANNED]:
        if len(out) >= max_results:
            break
        if not isinstance(item, Mapping):
            continue
        url = _url(item.get("url"))
        if url is None or url in seen:
            continue
        if keep is not None and not keep(url):
            continue
        seen.add(url)
        out.append(
            {
                "url": url,
                "title": _text(item.get("title"), _MAX_TITLE) or url,
                "page_age": _page_age(item.get("publishedDate")),
                "snippet": _text(item.get("content"), max_chars),
            }
        )
    return out


class Searxng:
    """Searches one SearXNG instance (see the module docstring)."""

    __slots__ = ("_config", "_metrics", "_report", "_session")

    def __init__(
        self,
        config: WebSearchConfig,
        metrics: Metrics,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._session = session
        self._report = FailureLog(BACKEND, event="web_search_failed", key="backend")
        metrics.add_web_search_backend(BACKEND)

    async def start(self) -> None:
        """Open the client session (in the running loop; the app's cleanup_ctx calls it)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=_MAX_CONNECTIONS),
                timeout=aiohttp.ClientTimeout(total=None),
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def config(self) -> WebSearchConfig:
        return self._config

    async def search(
        self,
        query: str,
        *,
        language: str | None = None,
        keep: Any = None,
        max_chars: int | None = None,
        request_id: str | None = None,
    ) -> list[Result]:
        """The results for ``query`` (filtered by ``keep``); raises SearchFailed (logged,
        at most a line a second per cause). A cancellation (the client left) propagates,
        the backend's connection closed on the way."""
        t0 = time.perf_counter()
        try:
            data = await self._fetch(query, language)
            try:
                results = parse_results(
                    data,
                    max_results=self._config.max_results,
                    max_chars=min(self._config.max_result_chars, max_chars or 1 << 30),
                    keep=keep,
                )
            except SearchFailed:
                raise SearchFailed("unavailable", "not_searxng", 200) from None
        except SearchFailed as failed:
            self._count(failed.code, t0)
            if failed.cause is not None:
                self._report.warn(
                    failed.cause,
                    error_code=failed.code,
                    status=failed.status,
                    request_id=request_id,
                )
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
                async with self._session.get(
                    config.searxng_url + "/search",
                    params=params,
                    headers={"Accept": "application/json"},
                    allow_redirects=False,
                ) as resp:
                    status = resp.status
                    if status == 429:
                        raise SearchFailed("too_many_requests", "too_many_requests", status)
                    if status != 200:
                        # one cause per class of status: the log's rate limit stays bounded
                        raise SearchFailed("unavailable", f"http_{status // 100}xx", status)
                    body = await _read(resp.content, config.max_response_bytes)
        except SearchFailed:
            raise
        except TimeoutError:
            raise SearchFailed("unavailable", "timeout", status) from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise SearchFailed("unavailable", type(exc).__name__, status) from None
        try:
            if len(body) > _OFF_LOOP_BYTES:
                return await asyncio.to_thread(jsonutil.loads, body)
            return jsonutil.loads(body)
        except (ValueError, RecursionError):
            raise SearchFailed("unavailable", "not_json", status) from None


async def _read(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The body, or SearchFailed("unavailable") past ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0
    async for chunk in content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise SearchFailed("unavailable", "response_too_large", 200)
        parts.append(chunk)
    return b"".join(parts)


# A user_location's country -> SearXNG's language for it (the main language; countries with
# several are left to the instance's default, as is a location without a country).
_LANGUAGES: Mapping[str, str] = {
    "US": "en-US",
    "GB": "en-GB",
    "AU": "en-AU",
    "NZ": "en-NZ",
    "IE": "en-IE",
    "CA": "en-CA",
    "DE": "de-DE",
    "AT": "de-AT",
    "FR": "fr-FR",
    "ES": "es-ES",
    "MX": "es-MX",
    "AR": "es-AR",
    "IT": "it-IT",
    "PT": "pt-PT",
    "BR": "pt-BR",
    "NL": "nl-NL",
    "SE": "sv-SE",
    "NO": "nb-NO",
    "DK": "da-DK",
    "FI": "fi-FI",
    "PL": "pl-PL",
    "CZ": "cs-CZ",
    "JP": "ja-JP",
    "KR": "ko-KR",
    "CN": "zh-CN",
    "TW": "zh-TW",
    "RU": "ru-RU",
    "UA": "uk-UA",
    "TR": "tr-TR",
    "GR": "el-GR",
    "HU": "hu-HU",
    "RO": "ro-RO",
    "IL": "he-IL",
    "SA": "ar-SA",
    "EG": "ar-EG",
    "ID": "id-ID",
    "TH": "th-TH",
    "VN": "vi-VN",
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
