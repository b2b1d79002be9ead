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

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from gateway.batches.engines import open_engine
from gateway.batches.schema import StoreError
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
_DB_ERRORS = (exc.SQLAlchemyError, sqlite3.Error, OSError)


class UsageStore:
    """The usage table of one database (see the module docstring)."""

    def __init__(self, engine: Engine, where: str, password: str | None) -> None:
        self._engine = engine
        self._pg = engine.dialect.name == "postgresql"
        self._where = where
        self._password = password
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="usage-store")
        self._closed = False

    @classmethod
    def open(cls, url: str) -> UsageStore:
        """Open the database at ``url`` (as the batch store reads it) and create the table
        if absent; StoreError naming the file or server on failure."""
        engine, where, password = open_engine(url)
        store = cls(engine, where, password)
        try:
            store._executor.submit(store._call, "open", store._setup).result()
        except BaseException:
            store._shutdown()
            raise
        return store

    def _setup(self, conn: Connection) -> None:
        if self._pg:  # replicas starting at once: one creates, the others then see it
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SCHEMA_LOCK})
        _METADATA.create_all(conn, checkfirst=True)
        conn.execute(sa.select(*USAGE.c).limit(0)).all()

    def _call(self, op: str, fn: Callable[[Connection], T]) -> T:
        try:
            with self._engine.begin() as conn:
                return fn(conn)
        except _DB_ERRORS as e:
            orig = e.orig if isinstance(e, exc.DBAPIError) and e.orig is not None else e
            first = (str(orig).strip().splitlines() or [""])[0][:200]
            if self._password:
                first = first.replace(self._password, "***")
            raise StoreError(
                f"usage store {op} failed ({self._where}): {type(orig).__name__}: {first}"
            ) from None

    async def _run(self, op: str, fn: Callable[[Connection], T]) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, self._call, op, fn
            )
        except RuntimeError as e:  # the executor was shut down
            raise StoreError(f"usage store {op} failed: the store is closed") from e

    def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._executor.submit(self._engine.dispose).result()
        self._executor.shutdown(wait=True)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._shutdown)

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
