"""The usage report in the Admin API's shape: its query read and checked, its buckets made.

``GET {prefix}/v1/organizations/usage_report/messages`` (the HTTP shell: gateway/http/usage_api.py)
takes the Admin API's parameters:

- ``starting_at`` (required, RFC 3339; snapped down to its bucket's start, UTC),
  ``ending_at`` (optional; buckets that start before it, so the bucket holding it is the
  last; default: the bucket holding now);
- ``bucket_width`` ``1m``, ``1h`` or ``1d`` (default ``1d``);
- ``limit``: buckets per page; its default and maximum per width are the API's: 1d 7 and
  31, 1h 24 and 168, 1m 60 and 1440;
- ``page``: the ``next_page`` of the previous answer (an opaque cursor: the next bucket's
  start), the other parameters repeated;
- ``group_by[]`` ``api_key_id`` and/or ``model``; ``api_key_ids[]`` and ``models[]`` filters.
  The gateway's ``api_key_id`` is the client's configured ``name``. Every array parameter is
  accepted with or without ``[]``.

Any other parameter (the API's workspace, service tier, context window... filters and
groupings the gateway has nothing to report on) is a 400 naming it, as is a bad value.

The answer: ``{"data": [{"starting_at", "ending_at", "results": [...]}], "has_more",
"next_page"}``, every bucket of the page present (``results`` empty where nothing was
used); a result holds ``uncached_input_tokens``, ``cache_creation`` (always zero: no engine
says what it cached), ``cache_read_input_tokens``, ``output_tokens``,
``server_tool_use.web_search_requests``, and ``api_key_id``/``model`` when grouped by them
(else null, as ``workspace_id``, ``service_tier`` and ``context_window`` always are).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gateway import errors

__all__ = ["WIDTHS", "ReportQuery", "ReportRow", "parse_query", "report"]

# width -> (seconds, default limit, maximum limit), as the Admin API documents them
WIDTHS = {"1m": (60, 60, 1440), "1h": (3600, 24, 168), "1d": (86400, 7, 31)}
_GROUPS = ("api_key_id", "model")
_SINGLE = ("starting_at", "ending_at", "bucket_width", "limit", "page")
_ARRAYS = ("group_by", "api_key_ids", "models")
_MAX_VALUES = 256  # filter values per parameter
_MAX_VALUE = 256  # characters per value
_PAGE_PREFIX = "page_"

# (bucket start in epoch seconds, client or None, model or None,
#  (requests, uncached input, cache read, output, web searches)): what the store sums
ReportRow = tuple[int, str | None, str | None, Sequence[int]]


@dataclass(frozen=True, slots=True)
class ReportQuery:
    """One page's query: buckets ``[start, end)`` of ``width`` seconds."""

    start: int
    end: int
    width: int
    by_client: bool
    by_model: bool
    clients: tuple[str, ...]
    models: tuple[str, ...]
    next_start: int | None  # the next page's first bucket; None: this is the last page


def _values(params: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """The parameters by name (``group_by[]`` as ``group_by``); unknown ones are a 400."""
    out: dict[str, list[str]] = {}
    for raw, values in params.items():
        name = raw.removesuffix("[]")
        if name not in _SINGLE and name not in _ARRAYS:
            raise errors.InvalidRequest(raw[:64], "not supported by this gateway")
        if name in _SINGLE and (raw != name or len(values) > 1 or name in out):
            raise errors.InvalidRequest(name, "given more than once")
        out.setdefault(name, []).extend(values)
    return out


def _instant(name: str, value: str) -> float:
    if len(value) > 64:
        raise errors.InvalidRequest(name, "not an RFC 3339 timestamp")
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise errors.InvalidRequest(name, "not an RFC 3339 timestamp") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _stamp(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _page_token(t: int) -> str:
    return _PAGE_PREFIX + base64.urlsafe_b64encode(_stamp(t).encode()).decode()


def _page_start(value: str) -> float:
    try:
        if not value.startswith(_PAGE_PREFIX) or len(value) > 64:
            raise ValueError
        return _instant("page", base64.urlsafe_b64decode(value[len(_PAGE_PREFIX) :]).decode())
    except (ValueError, binascii.Error, UnicodeDecodeError, errors.InvalidRequest):
        raise errors.InvalidRequest("page", "not a next_page token of this report") from None


def _names(name: str, values: list[str]) -> tuple[str, ...]:
    if len(values) > _MAX_VALUES:
        raise errors.InvalidRequest(name, f"at most {_MAX_VALUES} values")
    for v in values:
        if not v or len(v) > _MAX_VALUE:
            raise errors.InvalidRequest(name, f"each value 1 to {_MAX_VALUE} characters")
    return tuple(dict.fromkeys(values))


def parse_query(params: Mapping[str, Sequence[str]], now: float) -> ReportQuery:
    """The page a request asks for (``params``: name -> its values, as given), or a 400
    naming the parameter at fault."""
    p = _values(params)
    width_name = (p.get("bucket_width") or ["1d"])[0]
    if width_name not in WIDTHS:
        raise errors.InvalidRequest("bucket_width", "one of 1d, 1h, 1m")
    width, default_limit, max_limit = WIDTHS[width_name]
    if "starting_at" not in p:
        raise errors.InvalidRequest("starting_at", "required")
    start = int(_instant("starting_at", p["starting_at"][0]) // width) * width
    if "ending_at" in p:
        ending = _instant("ending_at", p["ending_at"][0])
        if ending <= start:
            raise errors.InvalidRequest("ending_at", "must be after starting_at")
    else:
        ending = now
    end = -int(-ending // width) * width  # snapped up: the bucket holding it is the last
    if "page" in p:
        page = int(_page_start(p["page"][0]) // width) * width
        if page < start or page >= max(end, start + width):
            raise errors.InvalidRequest("page", "not a next_page token of this report")
        start = page
    limit = default_limit
    if "limit" in p:
        raw = p["limit"][0]
        if not raw.isdigit() or not 1 <= int(raw) <= max_limit:
            raise errors.InvalidRequest(
                "limit", f"an integer from 1 to {max_limit} for bucket_width {width_name}"
            )
        limit = int(raw)
    groups = _names("group_by", p.get("group_by", []))
    for g in groups:
        if g not in _GROUPS:
            raise errors.InvalidRequest(
                "group_by", f"{g[:64]!r} is not supported by this gateway (api_key_id, model)"
            )
    page_end = min(end, start + limit * width)
    return ReportQuery(
        start=start,
        end=max(page_end, start),
        width=width,
        by_client="api_key_id" in groups,
        by_model="model" in groups,
        clients=_names("api_key_ids", p.get("api_key_ids", [])),
        models=_names("models", p.get("models", [])),
        next_start=page_end if page_end < end else None,
    )


def _result(client: str | None, model: str | None, counts: Sequence[int]) -> dict[str, Any]:
    _, uncached, cache_read, output, searches = counts
    return {
        "uncached_input_tokens": uncached,
        "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0},
        "cache_read_input_tokens": cache_read,
        "output_tokens": output,
        "server_tool_use": {"web_search_requests": searches},
        "api_key_id": client,
        "workspace_id": None,
        "model": model,
        "service_tier": None,
        "context_window": None,
    }


def report(query: ReportQuery, rows: Iterable[ReportRow]) -> dict[str, Any]:
    """The answer's body: every bucket of the page, each with its rows' results (``rows``:
    summed per bucket and grouping, from the store), ordered by api_key_id then model."""
    results: dict[int, list[tuple[str, str, dict[str, Any]]]] = {}
    for bucket, client, model, counts in rows:
        entry = _result(client, model, counts)
        results.setdefault(bucket, []).append((client or "", model or "", entry))
    data = []
    for t in range(query.start, query.end, query.width):
        found = sorted(results.get(t, ()), key=lambda r: (r[0], r[1]))
        data.append(
            {
                "starting_at": _stamp(t),
                "ending_at": _stamp(t + query.width),
                "results": [entry for _, _, entry in found],
            }
        )
    nxt = query.next_start
    return {
        "data": data,
        "has_more": nxt is not None,
        "next_page": None if nxt is None else _page_token(nxt),
    }
