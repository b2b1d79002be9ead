"""The usage table against real databases: a SQLite file and a real PostgreSQL server.

Two stores on one database stand for two replicas: their writes of the same (minute, client,
model) add up (the upsert adds, it never overwrites); a report sums the minutes into its
buckets and groupings in SQL. A batch request claimed from the batch store carries its
batch's owner (its usage is the owner's).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.batches.store import BatchStore
from gateway.batches.usage_store import UsageStore
from gateway.tenancy.usage_report import parse_query

T0 = int(datetime(2026, 3, 2, 10, 0, tzinfo=UTC).timestamp())


def _drop(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "DROP TABLE IF EXISTS llm_gateway_usage_minutes, llm_gateway_batch_requests, "
            "llm_gateway_batches"
        )


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "usage.sqlite3")
    url: str = request.getfixturevalue("pg_url")
    _drop(url)
    return url


@pytest.fixture
async def stores(db_url: str) -> AsyncIterator[tuple[UsageStore, UsageStore]]:
    a, b = UsageStore.open(db_url), UsageStore.open(db_url)
    yield a, b
    await a.close()
    await b.close()


async def test_replicas_add_up_and_reports_group_in_sql(
    stores: tuple[UsageStore, UsageStore],
) -> None:
    a, b = stores
    await a.add([(T0, "alice", "m1", (1, 10, 2, 5, 0)), (T0 + 60, "bob", "m1", (1, 1, 0, 1, 0))])
    await b.add([(T0, "alice", "m1", (2, 20, 0, 7, 3))])  # the same row: added
    await b.add([(T0 + 3600, "alice", "m2", (1, 4, 0, 4, 0))])

    def q(**params: str | list[str]) -> object:
        base = {"starting_at": "2026-03-02T10:00:00Z", "ending_at": "2026-03-02T12:00:00Z"}
        merged = {**base, **params}
        return parse_query(
            {k: v if isinstance(v, list) else [v] for k, v in merged.items()}, T0 + 7200
        )

    cases = [
        # by the hour, grouped by client and model
        (
            q(bucket_width="1h", **{"group_by[]": ["api_key_id", "model"]}),
            [
                (T0, "alice", "m1", (3, 30, 2, 12, 3)),
                (T0, "bob", "m1", (1, 1, 0, 1, 0)),
                (T0 + 3600, "alice", "m2", (1, 4, 0, 4, 0)),
            ],
        ),
        # by the day, nothing grouped: one row
        (q(bucket_width="1d"), [(T0 - 36000, None, None, (5, 35, 2, 17, 3))]),
        # by the minute, grouped by model, one client only
        (
            q(bucket_width="1m", limit="120", **{"group_by[]": "model", "api_key_ids[]": "alice"}),
            [(T0, None, "m1", (3, 30, 2, 12, 3)), (T0 + 3600, None, "m2", (1, 4, 0, 4, 0))],
        ),
        # a model filter, by client
        (
            q(bucket_width="1h", **{"group_by[]": "api_key_id", "models[]": "m1"}),
            [(T0, "alice", None, (3, 30, 2, 12, 3)), (T0, "bob", None, (1, 1, 0, 1, 0))],
        ),
    ]
    for query, expected in cases:
        assert await a.rows(query) == expected  # type: ignore[arg-type]


async def test_a_claimed_batch_request_carries_its_owner(db_url: str) -> None:
    store = BatchStore.open(db_url)
    try:
        await store.create("b1", "owner-1", [("c", "m", b"{}")], 1.0, 1e12)
        claimed = await store.claim("w", ["m"], 5, 2.0, 60.0)
        assert [c.owner for c in claimed] == ["owner-1"]
    finally:
        await store.close()
