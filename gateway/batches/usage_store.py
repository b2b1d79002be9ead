"""The usage table: each client's usage of each model by the minute, in the batches' database.

One row per (minute, client, model) in ``llm_gateway_usage_minutes``; a write adds to the
row's counts (SQLite's and PostgreSQL's ``INSERT ... ON CONFLICT DO UPDATE SET n = n +
excluded.n``), so every process writing to one database (``--workers`` on one SQLite file,
replicas on one PostgreSQL) adds up instead of overwriting. A report sums the rows into
its buckets and groupings in SQL: what comes back is one row per bucket and group.

As the batch store (:mod:`gateway.batches.store`): SQLAlchemy Core on SQLite (WAL, ``BEGIN
IMMEDIATE`` writes) or PostgreSQL (psycopg 3, every wait bounded), every call one
transaction on a worker thread of its own (so a write never waits behind a batch's, nor
blocks the event loop), failures a ``StoreError`` without the password.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from gateway.batches.engines import open_engine
from gateway.batches.one_thread import OneThreadStore
from gateway.tenancy.usage import COUNTS, Row
from gateway.tenancy.usage_report import ReportQuery, ReportRow

__all__ = ["USAGE", "UsageStore"]

T = TypeVar("T")

_METADATA = sa.MetaData()
USAGE = sa.Table(
    "llm_gateway_usage_minutes",
    _METADATA,
    sa.Column("minute", sa.BigInteger, primary_key=True),  # its start, epoch seconds (UTC)
    sa.Column("client", sa.Text, primary_key=True),  # [[clients]] name, or "anonymous"
    sa.Column("model", sa.Text, primary_key=True),  # the model alias that answered
    *(sa.Column(name, sa.BigInteger, nullable=False, server_default="0") for name in COUNTS),
)
_u = USAGE.c
_SCHEMA_LOCK = 0x6C6C6D75  # PostgreSQL advisory lock taken while creating the table


class UsageStore(OneThreadStore):
    """The usage table of one database (see the module docstring)."""

    NAME = "usage store"

    @classmethod
    def open(cls, url: str) -> UsageStore:
        """Open the database at ``url`` (as the batch store reads it) and create the table
        if absent; StoreError naming the file or server on failure."""
        store = cls(*open_engine(url))
        store._start()
        return store

    def _setup(self, conn: Connection) -> None:
        if self._pg:  # replicas starting at once: one creates, the others then see it
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SCHEMA_LOCK})
        _METADATA.create_all(conn, checkfirst=True)
        conn.execute(sa.select(*USAGE.c).limit(0)).all()

    async def add(self, rows: Sequence[Row]) -> None:
        """Add ``rows`` to the table's counts, in one transaction."""
        if not rows:
            return
        insert = postgresql.insert if self._pg else sqlite.insert
        stmt = insert(USAGE)
        stmt = stmt.on_conflict_do_update(
            index_elements=[_u.minute, _u.client, _u.model],
            set_={name: _u[name] + stmt.excluded[name] for name in COUNTS},
        )
        params = [
            {"minute": m, "client": c, "model": model, **dict(zip(COUNTS, n, strict=True))}
            for m, c, model, n in rows
        ]

        def tx(conn: Connection) -> None:
            conn.execute(stmt, params)

        await self._run("add", tx)

    async def rows(self, q: ReportQuery) -> list[ReportRow]:
        """The page's usage summed per bucket (and client, model when grouped by them)."""
        start = sa.literal(q.start, sa.BigInteger)
        width = sa.literal(q.width, sa.BigInteger)
        bucket = (start + (_u.minute - start) // width * width).label("bucket")
        keys: list[Any] = [bucket]
        if q.by_client:
            keys.append(_u.client)
        if q.by_model:
            keys.append(_u.model)
        query = sa.select(*keys, *(sa.func.sum(_u[name]).label(name) for name in COUNTS)).where(
            _u.minute >= q.start, _u.minute < q.end
        )
        if q.clients:
            query = query.where(_u.client.in_(q.clients))
        if q.models:
            query = query.where(_u.model.in_(q.models))
        query = query.group_by(*keys).order_by(*keys)

        def tx(conn: Connection) -> list[ReportRow]:
            return [
                (
                    int(r.bucket),
                    r.client if q.by_client else None,
                    r.model if q.by_model else None,
                    tuple(int(r._mapping[name]) for name in COUNTS),
                )
                for r in conn.execute(query)
            ]

        return await self._run("report", tx)
