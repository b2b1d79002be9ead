"""The usage aggregate (rows by minute, client and model; bounded; rows given back) and the
usage report's query and buckets (the Admin API's parameters, limits, paging and shape)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gateway import errors
from gateway.tenancy.usage import UsageAggregate
from gateway.tenancy.usage_report import ReportRow, parse_query, report

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC).timestamp()  # a Monday, 10:00:00 UTC


def test_replies_add_up_per_minute_client_and_model() -> None:
    agg = UsageAggregate()
    agg.add(T0 + 1, "alice", "m1", 10, 2, 5, 0)
    agg.add(T0 + 59, "alice", "m1", 1, 0, 1, 3)
    agg.add(T0 + 60, "alice", "m1", 7, 0, 7, 0)  # the next minute
    agg.add(T0 + 2, "bob", "m1", 4, 0, 4, 0)
    agg.add(T0 + 3, "alice", "m2", 9, 9, 9, 9)
    m = int(T0)
    assert agg.take() == [
        (m, "alice", "m1", (2, 11, 2, 6, 3)),
        (m, "alice", "m2", (1, 9, 9, 9, 9)),
        (m, "bob", "m1", (1, 4, 0, 4, 0)),
        (m + 60, "alice", "m1", (1, 7, 0, 7, 0)),
    ]
    assert agg.take() == [] and len(agg) == 0


def test_rows_given_back_are_added_to_new_ones_within_the_bound() -> None:
    agg = UsageAggregate(max_keys=2)
    agg.add(T0, "a", "m", 1, 0, 1, 0)
    rows = agg.take()  # a write that failed gives them back
    agg.add(T0, "a", "m", 2, 0, 2, 0)
    agg.add(T0, "b", "m", 3, 0, 3, 0)
    agg.give_back(rows)
    agg.add(T0, "c", "m", 5, 0, 5, 0)  # a third key: no room, counted
    agg.give_back([(int(T0) + 60, "a", "m", (4, 1, 1, 1, 1))])  # no room: its 4 counted
    assert agg.take() == [
        (int(T0), "a", "m", (2, 3, 0, 3, 0)),
        (int(T0), "b", "m", (1, 3, 0, 3, 0)),
    ]
    assert agg.dropped == 5


def _q(now: float = T0 + 3600 * 5 + 30, **params: Any) -> Any:
    return parse_query({k: v if isinstance(v, list) else [v] for k, v in params.items()}, now)


@pytest.mark.parametrize(
    ("params", "start", "end", "width", "next_start"),
    [
        # 1d, the default: from the day of starting_at to the day holding now, limit 7
        (
            {"starting_at": "2026-03-02T10:11:12Z"},
            "2026-03-02T00:00",
            "2026-03-03T00:00",
            86400,
            None,
        ),
        # 1h: snapped to the hour; ending_at's hour is the last bucket
        (
            {
                "starting_at": "2026-03-02T10:30:00Z",
                "ending_at": "2026-03-02T12:10:00Z",
                "bucket_width": "1h",
            },
            "2026-03-02T10:00",
            "2026-03-02T13:00",
            3600,
            None,
        ),
        # 1m with the default limit (60): a page, then the next from its end
        (
            {
                "starting_at": "2026-03-02T10:00:00Z",
                "ending_at": "2026-03-02T12:00:00Z",
                "bucket_width": "1m",
            },
            "2026-03-02T10:00",
            "2026-03-02T11:00",
            60,
            "2026-03-02T11:00",
        ),
        (
            {
                "starting_at": "2026-03-02T10:00:00Z",
                "ending_at": "2026-03-02T12:00:00Z",
                "bucket_width": "1m",
                "limit": "90",
            },
            "2026-03-02T10:00",
            "2026-03-02T11:30",
            60,
            "2026-03-02T11:30",
        ),
        # an offset is read: 12:00+02:00 is 10:00Z
        (
            {
                "starting_at": "2026-03-02T12:00:00+02:00",
                "ending_at": "2026-03-02T10:02:00Z",
                "bucket_width": "1m",
            },
            "2026-03-02T10:00",
            "2026-03-02T10:02",
            60,
            None,
        ),
        # group_by[], arrays with or without []
        (
            {
                "starting_at": "2026-03-02T00:00:00Z",
                "group_by[]": ["model", "api_key_id"],
                "models": ["m"],
            },
            "2026-03-02T00:00",
            "2026-03-03T00:00",
            86400,
            None,
        ),
    ],
)
def test_the_query_pages_snapped_buckets(
    params: dict[str, Any], start: str, end: str, width: int, next_start: str | None
) -> None:
    q = _q(**params)

    def at(s: str) -> int:
        return int(datetime.fromisoformat(s + ":00+00:00").timestamp())

    assert (q.start, q.end, q.width) == (at(start), at(end), width)
    assert q.next_start == (None if next_start is None else at(next_start))


def test_group_by_and_filters_are_read() -> None:
    q = _q(
        starting_at="2026-03-02T00:00:00Z",
        **{"group_by[]": ["api_key_id"], "api_key_ids[]": ["a", "b", "a"]},
    )
    assert (q.by_client, q.by_model, q.clients, q.models) == (True, False, ("a", "b"), ())


@pytest.mark.parametrize(
    ("params", "names"),
    [
        ({}, "starting_at"),
        ({"starting_at": "yesterday"}, "starting_at"),
        ({"starting_at": "2026-03-02T00:00:00Z", "ending_at": "2026-03-01T00:00:00Z"}, "ending_at"),
        ({"starting_at": "2026-03-02T00:00:00Z", "bucket_width": "2h"}, "bucket_width"),
        ({"starting_at": "2026-03-02T00:00:00Z", "limit": "32"}, "limit"),  # 1d: at most 31
        ({"starting_at": "2026-03-02T00:00:00Z", "bucket_width": "1h", "limit": "169"}, "limit"),
        ({"starting_at": "2026-03-02T00:00:00Z", "bucket_width": "1m", "limit": "1441"}, "limit"),
        ({"starting_at": "2026-03-02T00:00:00Z", "limit": "0"}, "limit"),
        ({"starting_at": "2026-03-02T00:00:00Z", "limit": "x"}, "limit"),
        ({"starting_at": "2026-03-02T00:00:00Z", "group_by[]": "workspace_id"}, "group_by"),
        ({"starting_at": "2026-03-02T00:00:00Z", "workspace_ids[]": "w"}, "workspace_ids[]"),
        ({"starting_at": "2026-03-02T00:00:00Z", "page": "page_bm9wZQ=="}, "page"),
        ({"starting_at": "2026-03-02T00:00:00Z", "page": "garbage"}, "page"),
        ({"starting_at": ["2026-03-02T00:00:00Z", "2026-03-03T00:00:00Z"]}, "starting_at"),
        ({"starting_at": "2026-03-02T00:00:00Z", "models[]": ""}, "models"),
    ],
)
def test_a_bad_parameter_is_a_400_naming_it(params: dict[str, Any], names: str) -> None:
    with pytest.raises(errors.InvalidRequest) as e:
        _q(**params)
    assert e.value.status == 400 and e.value.message.startswith(names + ":")


def test_limits_at_their_maxima_are_accepted() -> None:
    for width, limit in (("1d", "31"), ("1h", "168"), ("1m", "1440")):
        q = _q(starting_at="2026-01-01T00:00:00Z", bucket_width=width, limit=limit)
        assert (q.end - q.start) // q.width == int(limit)


def test_pages_walk_the_range_with_next_page() -> None:
    """Page after page of a 150-minute range, 60 at a time: 60, 60, 30 buckets, the
    cursor of each answer the start of the next, has_more False on the last."""
    base = {
        "starting_at": "2026-03-02T10:00:00Z",
        "ending_at": "2026-03-02T12:30:00Z",
        "bucket_width": "1m",
    }
    sizes, page, starts = [], None, []
    for _ in range(5):
        q = _q(**base, **({"page": page} if page else {}))
        body = report(q, [])
        sizes.append(len(body["data"]))
        starts.append(body["data"][0]["starting_at"])
        page = body["next_page"]
        assert body["has_more"] is (page is not None)
        if page is None:
            break
    assert sizes == [60, 60, 30]
    assert starts == ["2026-03-02T10:00:00Z", "2026-03-02T11:00:00Z", "2026-03-02T12:00:00Z"]


def test_the_report_has_every_bucket_and_the_api_fields() -> None:
    q = _q(
        starting_at="2026-03-02T10:00:00Z",
        ending_at="2026-03-02T13:00:00Z",
        bucket_width="1h",
        **{"group_by[]": ["api_key_id", "model"]},
    )
    h = int(T0)
    rows: list[ReportRow] = [
        (h + 7200, "bob", "m1", (1, 5, 0, 6, 0)),
        (h, "bob", "m1", (2, 10, 3, 20, 1)),
        (h, "alice", "m2", (1, 1, 0, 2, 0)),
    ]
    body = report(q, rows)
    assert [b["starting_at"] for b in body["data"]] == [
        "2026-03-02T10:00:00Z",
        "2026-03-02T11:00:00Z",
        "2026-03-02T12:00:00Z",
    ]
    assert body["data"][0]["ending_at"] == "2026-03-02T11:00:00Z"
    assert [(r["api_key_id"], r["model"]) for r in body["data"][0]["results"]] == [
        ("alice", "m2"),
        ("bob", "m1"),
    ]
    assert body["data"][1]["results"] == []
    assert body["data"][0]["results"][1] == {
        "uncached_input_tokens": 10,
        "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0},
        "cache_read_input_tokens": 3,
        "output_tokens": 20,
        "server_tool_use": {"web_search_requests": 1},
        "api_key_id": "bob",
        "workspace_id": None,
        "model": "m1",
        "service_tier": None,
        "context_window": None,
    }
    assert (body["has_more"], body["next_page"]) == (False, None)
