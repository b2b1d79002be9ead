"""The batch store: one SQL layer (SQLAlchemy Core) over SQLite (default) or PostgreSQL.

Times are UNIX epoch seconds (float). ``owner`` is an opaque string ("" when the gateway has
no API keys). A request's ``params`` and ``result`` are JSON bytes.

Facts the code relies on:

- Every method runs its SQL on one worker thread the store owns, so the event loop never
  blocks on the database; each call is one transaction. A caller cancelled while its call runs
  does not cancel the transaction: a claim it never sees is leased anyway, and run again when
  its lease lapses.
- Exactly-once claims. SQLite: every write transaction is ``BEGIN IMMEDIATE`` (pysqlite's own
  transaction handling is turned off), so writers in all threads and processes sharing the file
  serialize, and a claim's select and update are one step. WAL with ``synchronous=NORMAL``:
  a committed transaction survives a SIGKILL of the process (not a power cut). PostgreSQL: a
  claim selects ``FOR UPDATE SKIP LOCKED``; under READ COMMITTED a row another claim took
  meanwhile is re-checked against the WHERE clause once locked, and dropped.
- Lock order on PostgreSQL is always batch row, then its request rows (``finish``, ``cancel``,
  ``expire``, ``delete``), so two transactions never wait on each other in a cycle. ``finish``
  locks the batch row before it looks for unfinished requests: of two requests finishing at
  once, the second to commit sees the first done and ends the batch.
- A request whose lease lapsed in a canceling batch (its worker died) is never claimed again;
  ``expire`` counts it canceled, so the batch ends instead of waiting for its expiry.
- Database failures become ``StoreError`` with the driver's first line; the password, if any,
  is scrubbed out of it, and the URL is never quoted.
- A full disk. In WAL mode every write, even one that shrinks rows (a cancel drops its
  requests' params) or deletes them, first appends pages to the ``-wal`` file, so on a full
  disk cancel and delete failed like creates, and nothing could free space. A SQLite file
  store keeps a reserve file beside it (``<database>.reserve``, ``RESERVE_BYTES``): an
  operation that ends or removes work (cancel, delete, and the sweep's expire and purge)
  that fails on a full disk spends the reserve (deletes the file) and runs again; a create
  is refused (``StoreFull``) while the reserve is spent and cannot be made again, so creates
  never eat the space cancel and delete need. (PostgreSQL manages its own disk.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from gateway.batches.engines import open_engine, sqlite_path
from gateway.batches.one_thread import OneThreadStore
from gateway.batches.reserve import RESERVE_BYTES, Reserve, disk_full
from gateway.batches.schema import (
    BATCH_COLS,
    BATCHES,
    METADATA,
    REQUESTS,
    UNFINISHED,
    BatchRow,
    Claimed,
    StoreError,
    StoreFull,
    batch_row,
)

__all__ = ["BatchRow", "BatchStore", "Claimed", "StoreError", "StoreFull"]

T = TypeVar("T")

_RESULTS_PAGE = 1000
_SCHEMA_LOCK = 0x6C6C6D67  # PostgreSQL advisory lock taken while creating the tables
# the operations that end or remove work: run on the reserve when the disk is full
_FREEING = frozenset({"cancel", "delete", "expire", "purge"})
_INSERT_SLICE = 1000  # request rows per INSERT of a create
_b, _r = BATCHES.c, REQUESTS.c


# -- the store ------------------------------------------------------------------------------


class BatchStore(OneThreadStore):
    """Batches and their requests in one database; see the module docstring."""

    NAME = "batch store"

    def __init__(self, engine: Engine, where: str, password: str | None) -> None:
        super().__init__(engine, where, password)
        self._reserve: Reserve | None = None

    @classmethod
    def open(cls, url: str, reserve_bytes: int = RESERVE_BYTES) -> BatchStore:
        """Open (and create if absent) the store at ``url``: ``sqlite:///ABS/PATH``, a bare
        file path (SQLite), or ``postgresql://user:pw@host:port/db`` (psycopg 3). Creates
        the tables if absent (several processes may do so at once), checks the schema with
        a cheap query, and raises StoreError naming the file or server on any failure."""
        store = cls(*open_engine(url))
        path = None if store._pg else sqlite_path(url)
        if path is not None and reserve_bytes > 0:
            store._reserve = Reserve(path + ".reserve", reserve_bytes)
            store._executor.submit(store._reserve.keep)  # best effort: creates retry it
        store._start()
        return store

    def _setup(self, conn: Connection) -> None:
        if self._pg:  # two replicas starting at once: one creates, the other then sees it
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SCHEMA_LOCK})
        METADATA.create_all(conn, checkfirst=True)
        conn.execute(sa.select(*BATCHES.c).limit(0)).all()
        conn.execute(sa.select(*REQUESTS.c).limit(0)).all()

    # -- plumbing --

    def _call(self, op: str, fn: Callable[[Connection], T], write: bool) -> T:
        """Run ``fn`` in one transaction (on the worker thread); failures become StoreError.
        The reserve (see the module docstring): a create needs it in place; an operation
        that ends or removes work spends it when the disk is full."""
        reserve = self._reserve
        if op == "create" and reserve is not None and not reserve.keep():
            raise StoreFull(
                f"batch store {op} refused ({self._where}): the disk is full "
                "(no room for the reserve that cancel and delete need)"
            )
        try:
            return self._transaction(op, fn, write)
        except StoreFull:
            if op not in _FREEING or reserve is None or not reserve.spend():
                raise
            return self._transaction(op, fn, write)

    def _failure(self, op: str, e: BaseException) -> StoreError:
        kind = StoreFull if disk_full(e) else StoreError
        return kind(self._describe(op, e))

    def _owned(self, batch_id: str, owner: str | None) -> Any:
        cond = _b.id == batch_id
        return cond if owner is None else sa.and_(cond, _b.owner == owner)

    def _lock_batch(self, conn: Connection, where: Any) -> Any:
        q = sa.select(*BATCH_COLS).where(where)
        return conn.execute(q.with_for_update() if self._pg else q).first()

    # -- batches --

    async def create(
        self,
        batch_id: str,
        owner: str,
        requests: Sequence[tuple[str, str, bytes]],
        now: float,
        expires_at: float,
    ) -> BatchRow:
        """Insert the batch and all its ``(custom_id, model, params)`` requests (idx in
        order, all queued) in one transaction. -> the new batch."""
        row = BatchRow(batch_id, owner, now, expires_at, None, None, len(requests), 0, 0, 0, 0)

        def tx(conn: Connection) -> BatchRow:
            conn.execute(
                BATCHES.insert().values(
                    id=batch_id,
                    owner=owner,
                    created_at=now,
                    expires_at=expires_at,
                    total=len(requests),
                    succeeded=0,
                    errored=0,
                    canceled=0,
                    expired=0,
                )
            )
            # in slices: the row dicts of one slice at a time, not of the whole batch
            for start in range(0, len(requests), _INSERT_SLICE):
                conn.execute(
                    REQUESTS.insert(),
                    [
                        {
                            "batch_id": batch_id,
                            "idx": i,
                            "custom_id": cid,
                            "model": model,
                            "params": params,
                            "state": "queued",
                            "attempts": 0,
                            "not_before": 0.0,
                        }
                        for i, (cid, model, params) in enumerate(
                            requests[start : start + _INSERT_SLICE], start
                        )
                    ],
                )
            return row

        return await self._run("create", tx)

    async def get(self, batch_id: str, owner: str | None) -> BatchRow | None:
        """The batch, or None if absent or (``owner`` not None) another owner's."""

        def tx(conn: Connection) -> BatchRow | None:
            r = conn.execute(sa.select(*BATCH_COLS).where(self._owned(batch_id, owner))).first()
            return None if r is None else batch_row(r)

        return await self._run("get", tx, write=False)

    async def page(
        self, owner: str | None, limit: int, before_id: str | None, after_id: str | None
    ) -> tuple[list[BatchRow], bool]:
        """A page of ``owner``'s batches (any owner's if None), newest first. ``after_id``:
        the ``limit`` batches that follow it in that order (older); ``before_id``: the
        ``limit`` that precede it (newer), still newest first. -> (rows, has_more: more exist
        beyond the page in the direction of travel). An unknown cursor (or another owner's)
        gives an empty page with has_more False."""

        def cursor_seq(conn: Connection, cursor: str) -> int | None:
            r = conn.execute(sa.select(_b.seq).where(self._owned(cursor, owner))).first()
            return None if r is None else int(r.seq)

        def tx(conn: Connection) -> tuple[list[BatchRow], bool]:
            q = sa.select(*BATCH_COLS)
            if owner is not None:
                q = q.where(_b.owner == owner)
            newer = False
            for cursor, older in ((after_id, True), (before_id, False)):
                if cursor is None:
                    continue
                seq = cursor_seq(conn, cursor)
                if seq is None:
                    return [], False
                q = q.where(_b.seq < seq if older else _b.seq > seq)
                newer = newer or not older
            if newer and after_id is None:  # walk up from the cursor, then reverse
                rows = conn.execute(q.order_by(_b.seq.asc()).limit(limit + 1)).all()
                return [batch_row(r) for r in reversed(rows[:limit])], len(rows) > limit
            rows = conn.execute(q.order_by(_b.seq.desc()).limit(limit + 1)).all()
            return [batch_row(r) for r in rows[:limit]], len(rows) > limit

        return await self._run("page", tx, write=False)

    async def cancel(self, batch_id: str, owner: str | None, now: float) -> BatchRow | None:
        """Begin canceling: None if absent or not owned. If not ended and not already
        canceling: set cancel_initiated_at, every queued request becomes done/canceled
        (counted), and the batch ends now if none is running. Idempotent; an ended batch is
        returned unchanged. -> the batch as it is after."""

        def tx(conn: Connection) -> BatchRow | None:
            r = self._lock_batch(conn, self._owned(batch_id, owner))
            if r is None:
                return None
            if r.ended_at is not None or r.cancel_initiated_at is not None:
                return batch_row(r)
            # a canceled request never runs: its params go, so the update shrinks the rows
            # and a cancel works on a full disk (it frees space instead of needing it)
            n = conn.execute(
                REQUESTS.update()
                .where(_r.batch_id == batch_id, _r.state == "queued")
                .values(
                    state="done",
                    result_type="canceled",
                    result=None,
                    params=b"",
                    lease_owner=None,
                    lease_until=None,
                )
            ).rowcount
            running = conn.execute(
                sa.select(_r.idx).where(_r.batch_id == batch_id, _r.state.in_(UNFINISHED)).limit(1)
            ).first()
            conn.execute(
                BATCHES.update()
                .where(_b.id == batch_id)
                .values(
                    cancel_initiated_at=now,
                    canceled=_b.canceled + n,
                    ended_at=None if running else now,
                )
            )
            return batch_row(conn.execute(sa.select(*BATCH_COLS).where(_b.id == batch_id)).one())

        return await self._run("cancel", tx)

    async def delete(self, batch_id: str, owner: str | None) -> bool | None:
        """Delete an ended batch and its requests. -> None if absent or not owned, False
        (nothing done) if it has not ended, True once deleted."""

        def tx(conn: Connection) -> bool | None:
            r = self._lock_batch(conn, self._owned(batch_id, owner))
            if r is None:
                return None
            if r.ended_at is None:
                return False
            conn.execute(REQUESTS.delete().where(_r.batch_id == batch_id))
            conn.execute(BATCHES.delete().where(_b.id == batch_id))
            return True

        return await self._run("delete", tx)

    # -- the queue --

    async def claim(
        self, worker: str, models: Sequence[str], limit: int, now: float, lease: float
    ) -> list[Claimed]:
        """Lease up to ``limit`` requests for ``worker``: those whose model is in ``models``
        that are queued with not_before <= now, or running with a lapsed lease (their worker
        died: run again), in batches not ended, not canceling, not expired; oldest batch
        first, then by idx. Each becomes running, leased to ``worker`` until now + lease,
        attempts + 1. Exactly once across threads, processes and replicas (see the module
        docstring)."""
        if limit <= 0 or not models:
            return []
        models = list(models)

        due = sa.or_(
            sa.and_(_r.state == "queued", _r.not_before <= now),
            sa.and_(_r.state == "running", _r.lease_until < now),
        )

        def tx(conn: Connection) -> list[Claimed]:
            # only the batches with due work: 150 batches whose requests all wait in back-off
            # cost one query a look, not one per batch (an idle gateway spent a third of a
            # core looking)
            batch_ids = conn.execute(
                sa.select(_b.id, _b.owner)
                .where(
                    _b.ended_at.is_(None),
                    _b.cancel_initiated_at.is_(None),
                    _b.expires_at > now,
                    sa.exists().where(_r.batch_id == _b.id, _r.model.in_(models), due),
                )
                .order_by(_b.seq)
            ).all()
            claimed: list[Claimed] = []
            for batch_id, owner in batch_ids:
                q = (
                    sa.select(_r.idx, _r.custom_id, _r.model, _r.params, _r.attempts)
                    .where(
                        _r.batch_id == batch_id,
                        _r.model.in_(models),
                        sa.or_(
                            sa.and_(_r.state == "queued", _r.not_before <= now),
                            sa.and_(_r.state == "running", _r.lease_until < now),
                        ),
                    )
                    .order_by(_r.idx)
                    .limit(limit - len(claimed))
                )
                if self._pg:
                    q = q.with_for_update(skip_locked=True)
                rows = conn.execute(q).all()
                if not rows:
                    continue
                conn.execute(
                    REQUESTS.update()
                    .where(_r.batch_id == batch_id, _r.idx.in_([r.idx for r in rows]))
                    .values(
                        state="running",
                        lease_owner=worker,
                        lease_until=now + lease,
                        attempts=_r.attempts + 1,
                    )
                )
                claimed += [
                    Claimed(
                        batch_id,
                        r.idx,
                        r.custom_id,
                        r.model,
                        bytes(r.params),
                        r.attempts + 1,
                        owner,
                    )
                    for r in rows
                ]
                if len(claimed) >= limit:
                    break
            return claimed

        return await self._run("claim", tx)

    async def next_due(self, models: Sequence[str], now: float) -> float | None:
        """When the first request of ``models`` becomes claimable: the earliest ``not_before``
        of a queued request or ``lease_until`` of a running one (its worker may die), in
        batches not ended, not canceling, not expired at ``now`` (as :meth:`claim`); None
        when there is none. One query: the scheduler sleeps until then instead of polling
        batches in back-off."""
        if not models:
            return None
        models = list(models)

        def tx(conn: Connection) -> float | None:
            active = sa.select(_b.id).where(
                _b.ended_at.is_(None), _b.cancel_initiated_at.is_(None), _b.expires_at > now
            )
            when = sa.case((_r.state == "queued", _r.not_before), else_=_r.lease_until)
            value = conn.execute(
                sa.select(sa.func.min(when)).where(
                    _r.batch_id.in_(active),
                    _r.model.in_(models),
                    _r.state.in_(("queued", "running")),
                )
            ).scalar()
            return None if value is None else float(value)

        return await self._run("next_due", tx, write=False)

    async def renew(self, worker: str, keys: Sequence[tuple[str, int]], lease_until: float) -> None:
        """Extend to ``lease_until`` the leases of those (batch_id, idx) still running under
        ``worker``; the others are left alone."""
        if not keys:
            return

        def tx(conn: Connection) -> None:
            conn.execute(
                REQUESTS.update()
                .where(
                    _r.batch_id == sa.bindparam("b_id"),
                    _r.idx == sa.bindparam("b_idx"),
                    _r.state == "running",
                    _r.lease_owner == worker,
                )
                .values(lease_until=lease_until),
                [{"b_id": b, "b_idx": i} for b, i in keys],
            )

        await self._run("renew", tx)

    async def finish(
        self,
        worker: str,
        batch_id: str,
        idx: int,
        result_type: str,
        result: bytes | None,
        now: float,
    ) -> bool:
        """Commit a request's result (``result_type`` succeeded or errored) only if it is
        still running under ``worker``: otherwise (expired, canceled, or re-claimed after
        our lease lapsed) nothing changes and -> False. In the same transaction, count it on
        the batch, and end the batch (ended_at = now) if no request is left queued or
        running. -> True once committed."""
        if result_type not in ("succeeded", "errored"):
            raise ValueError(f"finish: result_type {result_type!r}")

        def tx(conn: Connection) -> bool:
            self._lock_batch(conn, _b.id == batch_id)
            done = conn.execute(
                REQUESTS.update()
                .where(
                    _r.batch_id == batch_id,
                    _r.idx == idx,
                    _r.state == "running",
                    _r.lease_owner == worker,
                )
                .values(
                    state="done",
                    result_type=result_type,
                    result=result,
                    lease_owner=None,
                    lease_until=None,
                )
            ).rowcount
            if not done:
                return False
            left = conn.execute(
                sa.select(_r.idx).where(_r.batch_id == batch_id, _r.state.in_(UNFINISHED)).limit(1)
            ).first()
            values: dict[str, Any] = {result_type: _b[result_type] + 1}
            if left is None:
                values["ended_at"] = now
            conn.execute(BATCHES.update().where(_b.id == batch_id).values(**values))
            return True

        return await self._run("finish", tx)

    async def release(self, worker: str, batch_id: str, idx: int, not_before: float) -> None:
        """A retryable failure: the request goes back to queued, claimable from
        ``not_before``, its lease cleared (only if still running under ``worker``)."""

        def tx(conn: Connection) -> None:
            conn.execute(
                REQUESTS.update()
                .where(
                    _r.batch_id == batch_id,
                    _r.idx == idx,
                    _r.state == "running",
                    _r.lease_owner == worker,
                )
                .values(state="queued", not_before=not_before, lease_owner=None, lease_until=None)
            )

        await self._run("release", tx)

    async def expire(self, now: float) -> int:
        """End every batch not ended whose expires_at <= now: its requests not done (queued
        or running) become done/expired (counted), ended_at = now. Also end a canceling
        batch whose running requests all have lapsed leases (their workers died): those
        become canceled. -> the number of batches ended."""

        def tx(conn: Connection) -> int:
            ended = 0
            due = conn.execute(
                sa.select(_b.id, _b.expires_at, _b.cancel_initiated_at)
                .where(
                    _b.ended_at.is_(None),
                    sa.or_(_b.expires_at <= now, _b.cancel_initiated_at.is_not(None)),
                )
                .order_by(_b.seq)
            ).all()
            for d in due:
                r = self._lock_batch(conn, _b.id == d.id)
                if r is None or r.ended_at is not None:
                    continue
                mine = _r.batch_id == d.id
                if r.expires_at <= now:
                    n = conn.execute(
                        REQUESTS.update()
                        .where(mine, _r.state.in_(UNFINISHED))
                        .values(
                            state="done",
                            result_type="expired",
                            result=None,
                            lease_owner=None,
                            lease_until=None,
                        )
                    ).rowcount
                    values: dict[str, Any] = {"expired": _b.expired + n, "ended_at": now}
                else:  # canceling
                    n = conn.execute(
                        REQUESTS.update()
                        .where(mine, _r.state == "running", _r.lease_until < now)
                        .values(
                            state="done",
                            result_type="canceled",
                            result=None,
                            lease_owner=None,
                            lease_until=None,
                        )
                    ).rowcount
                    left = conn.execute(
                        sa.select(_r.idx).where(mine, _r.state.in_(UNFINISHED)).limit(1)
                    ).first()
                    values = {"canceled": _b.canceled + n}
                    if left is None:
                        values["ended_at"] = now
                    elif not n:
                        continue
                conn.execute(BATCHES.update().where(_b.id == d.id).values(**values))
                ended += "ended_at" in values
            return ended

        return await self._run("expire", tx)

    async def purge(self, now: float, retention: float) -> int:
        """Delete the batches (and their requests) that ended before now - retention.
        -> how many batches."""

        def tx(conn: Connection) -> int:
            old = _b.ended_at < now - retention
            conn.execute(
                REQUESTS.delete().where(
                    _r.batch_id.in_(sa.select(_b.id).where(old).scalar_subquery())
                )
            )
            return int(conn.execute(BATCHES.delete().where(old)).rowcount)

        return await self._run("purge", tx)

    async def results(self, batch_id: str) -> AsyncIterator[list[tuple[str, str, bytes | None]]]:
        """The batch's results in idx order, in pages of at most 1000 ``(custom_id,
        result_type, result JSON bytes or None for canceled/expired)``; each page is one
        keyset query (idx > the last one seen) on the worker thread."""
        last = -1
        while True:

            def tx(conn: Connection, after: int = last) -> list[Any]:
                return list(
                    conn.execute(
                        sa.select(_r.idx, _r.custom_id, _r.result_type, _r.result)
                        .where(_r.batch_id == batch_id, _r.idx > after)
                        .order_by(_r.idx)
                        .limit(_RESULTS_PAGE)
                    ).all()
                )

            rows = await self._run("results", tx, write=False)
            if not rows:
                return
            yield [
                (r.custom_id, r.result_type, None if r.result is None else bytes(r.result))
                for r in rows
            ]
            if len(rows) < _RESULTS_PAGE:
                return
            last = rows[-1].idx

    async def stats(self) -> dict[str, dict[str, int]]:
        """``{"batches": {"in_progress", "canceling", "ended"}, "queued": {model: requests
        queued or running}}``."""
        status = sa.case(
            (_b.ended_at.is_not(None), "ended"),
            (_b.cancel_initiated_at.is_not(None), "canceling"),
            else_="in_progress",
        )

        def tx(conn: Connection) -> dict[str, dict[str, int]]:
            batches = {"in_progress": 0, "canceling": 0, "ended": 0}
            for name, n in conn.execute(sa.select(status, sa.func.count()).group_by(status)):
                batches[name] = int(n)
            queued = {
                m: int(n)
                for m, n in conn.execute(
                    sa.select(_r.model, sa.func.count())
                    .where(_r.state.in_(UNFINISHED))
                    .group_by(_r.model)
                )
            }
            return {"batches": batches, "queued": queued}

        return await self._run("stats", tx, write=False)
