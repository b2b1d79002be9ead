"""The batch store's schema and the values it hands out (see :mod:`gateway.batches.store`).

Two tables: ``llm_gateway_batches`` (one row per batch, its counters) and
``llm_gateway_batch_requests`` (one row per request: its params, state, lease and result).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa


class StoreError(Exception):
    """The database failed: unreachable, full, corrupt, locked for too long. Its message is
    safe to log (no password); the routes answer it as a 5xx envelope."""


class StoreFull(StoreError):
    """The database's disk (or its size cap) is full: SQLite's SQLITE_FULL, PostgreSQL's
    ``53100 disk_full``, ENOSPC. Answered 507, with what frees space."""


@dataclass(frozen=True)
class BatchRow:
    id: str
    owner: str
    created_at: float
    expires_at: float
    ended_at: float | None
    cancel_initiated_at: float | None
    total: int
    succeeded: int
    errored: int
    canceled: int
    expired: int


@dataclass(frozen=True)
class Claimed:
    batch_id: str
    idx: int
    custom_id: str
    model: str
    params: bytes
    attempts: int  # including this one
    owner: str = field(default="", compare=False)  # its batch's: whose usage and limits


METADATA = sa.MetaData()
# ``seq`` orders batches; it is the integer primary key because SQLite autoincrements only
# that (a rowid alias). ``id`` is unique and what requests refer to.
BATCHES = sa.Table(
    "llm_gateway_batches",
    METADATA,
    sa.Column(
        "seq",
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("id", sa.String(64), nullable=False, unique=True),
    sa.Column("owner", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("ended_at", sa.Float),
    sa.Column("cancel_initiated_at", sa.Float),
    sa.Column("total", sa.Integer, nullable=False),
    sa.Column("succeeded", sa.Integer, nullable=False, server_default="0"),
    sa.Column("errored", sa.Integer, nullable=False, server_default="0"),
    sa.Column("canceled", sa.Integer, nullable=False, server_default="0"),
    sa.Column("expired", sa.Integer, nullable=False, server_default="0"),
)
REQUESTS = sa.Table(
    "llm_gateway_batch_requests",
    METADATA,
    sa.Column(
        "batch_id",
        sa.String(64),
        sa.ForeignKey("llm_gateway_batches.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("idx", sa.Integer, primary_key=True),
    sa.Column("custom_id", sa.String(64), nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("params", sa.LargeBinary, nullable=False),
    sa.Column("state", sa.String(8), nullable=False),  # queued | running | done
    sa.Column("result_type", sa.String(10)),  # succeeded | errored | canceled | expired
    sa.Column("result", sa.LargeBinary),
    sa.Column("lease_owner", sa.Text),
    sa.Column("lease_until", sa.Float),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("not_before", sa.Float, nullable=False, server_default="0"),
    # a claim walks one batch's queued (or running) requests in idx order; finish asks
    # whether any is left; stats counts unfinished requests per model
    sa.Index("llm_gateway_batch_requests_work", "batch_id", "state", "idx"),
    sa.Index("llm_gateway_batch_requests_state_model", "state", "model"),
)
_b = BATCHES.c
BATCH_COLS = (
    _b.id,
    _b.owner,
    _b.created_at,
    _b.expires_at,
    _b.ended_at,
    _b.cancel_initiated_at,
    _b.total,
    _b.succeeded,
    _b.errored,
    _b.canceled,
    _b.expired,
)
UNFINISHED = ("queued", "running")


def batch_row(r: Any) -> BatchRow:
    """A result row of BATCH_COLS as a BatchRow."""
    return BatchRow(
        r.id,
        r.owner,
        r.created_at,
        r.expires_at,
        r.ended_at,
        r.cancel_initiated_at,
        r.total,
        r.succeeded,
        r.errored,
        r.canceled,
        r.expired,
    )
