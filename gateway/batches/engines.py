"""Engines for the batch store: SQLite (a file, WAL, BEGIN IMMEDIATE writes) or PostgreSQL
(psycopg 3); what is wrong with a URL or a folder is a StoreError naming it."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.engine import Connection, Engine, make_url

from gateway.batches.schema import StoreError

BUSY_TIMEOUT_S = 30.0
# Every wait on PostgreSQL bounded: the connect, a statement or a lock (30 s, as SQLite's busy
# timeout), and a server or network that goes silent (TCP keepalives and a send timeout), so
# the store's one thread, and the batch routes behind it, never hang on a dead connection.
_PG_BOUNDS: dict[str, Any] = {
    "connect_timeout": 10,
    "options": "-c statement_timeout=30000 -c lock_timeout=30000",
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30000,
}


def open_engine(url: str) -> tuple[Engine, str, str | None]:
    """(engine, where (a file path or "postgresql database DB at HOST:PORT", for messages),
    the password to keep out of them) for ``sqlite:///ABS/PATH``, a bare file path or
    ``postgresql://user:pw@host:port/db``."""
    password: str | None = None
    if url.startswith(("postgresql:", "postgres:", "postgresql+psycopg:")):
        try:
            parsed = make_url(url).set(drivername="postgresql+psycopg")
        except (exc.ArgumentError, ValueError):
            raise StoreError("batch database: malformed postgresql URL") from None
        password = parsed.password if isinstance(parsed.password, str) else None
        where = (
            f"postgresql database {parsed.database or '?'} at "
            f"{parsed.host or 'localhost'}:{parsed.port or 5432}"
        )
        try:
            engine = sa.create_engine(parsed, pool_pre_ping=True, connect_args=_PG_BOUNDS)
        except (exc.SQLAlchemyError, ImportError) as e:
            raise StoreError(
                f"{where}: {type(e).__name__} (is the postgresql extra "
                "installed? pip install 'llm-gateway[postgresql]')"
            ) from None
    elif "://" in url and not url.startswith("sqlite:"):
        scheme = url.split("://", 1)[0]
        raise StoreError(
            f"batch database: unsupported URL scheme {scheme!r} "
            "(sqlite:///PATH, a file path, or postgresql://)"
        )
    else:
        path = sqlite_path(url)
        where = path or "in-memory sqlite database"
        if path is not None:
            check_dir(path)
        engine = sqlite_engine(path)
    return engine, where, password


def sqlite_engine(path: str | None) -> Engine:
    """An engine whose write transactions are BEGIN IMMEDIATE (reads: a deferred BEGIN)."""
    engine = sa.create_engine(
        f"sqlite:///{path}" if path else "sqlite://",
        connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (below)
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            _wal(cur)
            cur.execute("PRAGMA synchronous = NORMAL")
            cur.execute("PRAGMA foreign_keys = ON")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        read = conn.get_execution_options().get("gateway_read", False)
        conn.exec_driver_sql("BEGIN" if read else "BEGIN IMMEDIATE")

    return engine


def _wal(cur: Any) -> None:
    """Switch to WAL. On a new file the switch takes an exclusive lock without waiting out
    ``busy_timeout``: several stores opening one new file at once (``--workers``, two
    gateways) get "database is locked" at once; retried within the busy timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)  # a store opens in a thread of its own, never on the loop


def sqlite_path(url: str) -> str | None:
    """The file of a sqlite URL or bare path, made absolute; None for an in-memory database.
    SQLAlchemy's convention: ``sqlite:///rel/path``, ``sqlite:////abs/path``."""
    if url.startswith("sqlite:"):
        if not url.startswith(("sqlite://", "sqlite:///")) or "?" in url:
            raise StoreError("batch database: malformed sqlite URL (sqlite:////ABS/PATH)")
        path = url.removeprefix("sqlite://").removeprefix("/")
        if path in ("", ":memory:"):
            return None
    else:
        path = url
    return str(Path(path).expanduser().absolute())


def check_dir(path: str) -> None:
    parent = Path(path).parent
    if not parent.is_dir():
        raise StoreError(f"batch database {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise StoreError(f"batch database {path}: directory {parent} is not writable")
    if Path(path).is_dir():
        raise StoreError(f"batch database {path} is a directory")
