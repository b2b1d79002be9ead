"""The batch store against real databases: a SQLite file and a real PostgreSQL server.

Every test that takes ``db_url`` runs on both. The guarantees under test: each request is
claimed once however many stores claim at once; a lapsed lease is claimed again and its first
worker's result is then refused; the counters and ended_at move as Anthropic's API says; and
every database failure is a StoreError whose message names the file or server but never the
password.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from gateway.batches.store import BatchRow, BatchStore, Claimed, StoreError
from tests import pg

TABLES = ("llm_gateway_batch_requests", "llm_gateway_batches")
DAY = 86400.0

Opener = Callable[..., BatchStore]


def _drop_tables(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS " + ", ".join(TABLES))  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database: a SQLite file, or the session's PostgreSQL database with
    the tables dropped (each test creates them anew)."""
    if request.param == "sqlite":
        return str(tmp_path / "batches.sqlite3")
    url: str = request.getfixturevalue("pg_url")
    _drop_tables(url)
    return url


@pytest.fixture
async def open_store(db_url: str) -> AsyncIterator[Opener]:
    """Open stores on the test's database (another URL if given); all closed at teardown."""
    opened: list[BatchStore] = []

    def opener(url: str | None = None) -> BatchStore:
        store = BatchStore.open(url or db_url)
        opened.append(store)
        return store

    yield opener
    for store in opened:
        await store.close()


@pytest.fixture
def store(open_store: Opener) -> BatchStore:
    return open_store()


def reqs(n: int, model: str = "m", prefix: str = "c") -> list[tuple[str, str, bytes]]:
    return [(f"{prefix}{i}", model, b'{"i": %d}' % i) for i in range(n)]


async def make(
    store: BatchStore,
    batch_id: str,
    n: int = 3,
    *,
    owner: str = "o",
    model: str = "m",
    now: float = 0.0,
) -> BatchRow:
    return await store.create(batch_id, owner, reqs(n, model), now, now + DAY)


def keys(claimed: list[Claimed]) -> list[tuple[str, int]]:
    return [(c.batch_id, c.idx) for c in claimed]


def counts(row: BatchRow | None) -> tuple[int, int, int, int]:
    assert row is not None
    return row.succeeded, row.errored, row.canceled, row.expired


async def results(store: BatchStore, batch_id: str) -> list[tuple[str, str, bytes | None]]:
    return [item async for page in store.results(batch_id) for item in page]


# -- batches ---------------------------------------------------------------------------------


async def test_create_and_get_honour_the_owner(store: BatchStore) -> None:
    row = await store.create("b1", "alice", reqs(2), 10.0, 10.0 + DAY)
    assert row == BatchRow("b1", "alice", 10.0, 10.0 + DAY, None, None, 2, 0, 0, 0, 0)
    assert await store.get("b1", "alice") == row
    assert await store.get("b1", None) == row
    assert await store.get("b1", "bob") is None
    assert await store.get("nope", None) is None
    assert await store.cancel("b1", "bob", 11.0) is None
    assert await store.delete("b1", "bob") is None
    assert await store.get("b1", "alice") == row


async def test_duplicate_batch_id_is_a_store_error(store: BatchStore) -> None:
    await make(store, "b1")
    with pytest.raises(StoreError, match="create"):
        await make(store, "b1")


PAGES = [
    # (limit, before_id, after_id) -> ids newest first, has_more
    ((2, None, None), (["b5", "b4"], True)),
    ((5, None, None), (["b5", "b4", "b3", "b2", "b1"], False)),
    ((9, None, None), (["b5", "b4", "b3", "b2", "b1"], False)),
    ((2, None, "b4"), (["b3", "b2"], True)),
    ((2, None, "b3"), (["b2", "b1"], False)),
    ((2, None, "b1"), ([], False)),
    ((2, "b1", None), (["b3", "b2"], True)),
    ((2, "b3", None), (["b5", "b4"], False)),
    ((9, "b2", None), (["b5", "b4", "b3"], False)),
    ((2, "b5", None), ([], False)),
    ((2, None, "unknown"), ([], False)),
    ((2, "unknown", None), ([], False)),
    ((2, None, "x2"), ([], False)),  # another owner's batch is no cursor
]


async def test_pages_go_both_ways_newest_first_per_owner(store: BatchStore) -> None:
    for i in range(1, 6):  # alice's b1..b5, bob's x1..x5 interleaved
        await make(store, f"b{i}", 1, owner="alice")
        await make(store, f"x{i}", 1, owner="bob")
    for (limit, before, after), (ids, more) in PAGES:
        rows, has_more = await store.page("alice", limit, before, after)
        assert ([r.id for r in rows], has_more) == (ids, more), (limit, before, after)
    rows, has_more = await store.page(None, 3, None, None)
    assert [r.id for r in rows] == ["x5", "b5", "x4"] and has_more


async def test_delete_only_an_ended_batch(store: BatchStore) -> None:
    await make(store, "b1", 2)
    assert await store.delete("b1", "o") is False
    assert await store.cancel("b1", "o", 5.0) is not None  # nothing running: ends at once
    assert await store.delete("b1", "o") is True
    assert await store.get("b1", None) is None
    assert await results(store, "b1") == []
    assert await store.delete("b1", "o") is None


# -- the queue -------------------------------------------------------------------------------


async def test_claim_order_models_and_eligible_batches(store: BatchStore) -> None:
    await store.create(
        "old", "o", [("a", "m1", b"{}"), ("b", "m2", b"{}"), ("c", "m1", b"{}")], 0.0, DAY
    )
    await make(store, "new", 2, model="m1", now=1.0)
    await make(store, "canceling", 1, model="m1", now=2.0)
    await make(store, "expired", 1, model="m1", now=-DAY)  # expires_at == 0.0
    first = await store.claim("w", ["m1"], 3, 5.0, 30.0)
    assert keys(first) == [("old", 0), ("old", 2), ("new", 0)]
    assert first[0] == Claimed("old", 0, "a", "m1", b"{}", 1)
    # the canceling batch must not hand out work; the expired one neither
    await store.claim("other", ["m2"], 1, 5.0, 30.0)
    canceled = await store.cancel("canceling", None, 5.0)
    assert canceled is not None and canceled.ended_at == 5.0
    assert keys(await store.claim("w", ["m1", "m2"], 10, 5.0, 30.0)) == [("new", 1)]
    assert await store.claim("w", ["m1", "m2"], 10, 5.0, 30.0) == []
    assert await store.claim("w", [], 10, 5.0, 30.0) == []
    assert await store.claim("w", ["m1"], 0, 5.0, 30.0) == []


async def test_claims_are_exactly_once_across_concurrent_stores(open_store: Opener) -> None:
    """Four stores (four connections, as four gateway processes would have) claim at once
    from the same database until nothing is left: every request is handed out once."""
    stores = [open_store() for _ in range(4)]
    await stores[0].create("b1", "o", reqs(150), 0.0, DAY)
    await stores[0].create("b2", "o", reqs(150), 0.0, DAY)

    async def drain(store: BatchStore, worker: str) -> list[tuple[str, int]]:
        got: list[tuple[str, int]] = []
        while batch := await store.claim(worker, ["m"], 7, 1.0, 600.0):
            assert all(c.attempts == 1 for c in batch)
            got += keys(batch)
            # SQLite's busy handler is not fair: a writer that never pauses can starve the
            # others (they sleep between retries); a worker runs what it claimed
            await asyncio.sleep(0.002)
        return got

    claimed = await asyncio.gather(*(drain(s, f"w{i}") for i, s in enumerate(stores)))
    every = [k for got in claimed for k in got]
    assert len(every) == 300
    assert sorted(every) == sorted({(b, i) for b in ("b1", "b2") for i in range(150)})
    assert sum(1 for got in claimed if got) >= 2  # they really did run side by side


async def test_a_lapsed_lease_is_claimed_again_and_the_first_worker_refused(
    store: BatchStore,
) -> None:
    await make(store, "b1", 1)
    await store.claim("w1", ["m"], 5, 0.0, 10.0)
    assert await store.claim("w2", ["m"], 5, 9.0, 10.0) == []  # lease still held
    (again,) = await store.claim("w2", ["m"], 5, 11.0, 10.0)  # w1 died (or stalled)
    assert (again.batch_id, again.idx, again.attempts) == ("b1", 0, 2)
    assert await store.finish("w1", "b1", 0, "succeeded", b'{"late": 1}', 12.0) is False
    await store.release("w1", "b1", 0, 0.0)  # not w1's any more: no effect
    assert await store.finish("w2", "b1", 0, "succeeded", b'{"ok": 1}', 13.0) is True
    assert await store.finish("w2", "b1", 0, "succeeded", b'{"ok": 2}', 14.0) is False
    row = await store.get("b1", None)
    assert row is not None and counts(row) == (1, 0, 0, 0) and row.ended_at == 13.0
    assert await results(store, "b1") == [("c0", "succeeded", b'{"ok": 1}')]


async def test_renew_extends_only_the_workers_own_leases(store: BatchStore) -> None:
    await make(store, "b1", 2)
    await store.claim("w1", ["m"], 1, 0.0, 10.0)
    await store.claim("w2", ["m"], 1, 0.0, 10.0)
    await store.renew("w1", [("b1", 0), ("b1", 1)], 100.0)  # (b1, 1) is w2's
    assert keys(await store.claim("w3", ["m"], 5, 50.0, 10.0)) == [("b1", 1)]
    # w1's renewed lease lapses at 100, w3's own (taken at 50) at 60
    assert keys(await store.claim("w4", ["m"], 5, 101.0, 10.0)) == [("b1", 0), ("b1", 1)]
    await store.renew("w1", [], 200.0)


async def test_release_requeues_after_not_before(store: BatchStore) -> None:
    await make(store, "b1", 1)
    await store.claim("w1", ["m"], 1, 0.0, 10.0)
    await store.release("w1", "b1", 0, 5.0)
    assert await store.finish("w1", "b1", 0, "errored", b"{}", 1.0) is False  # not running
    assert await store.claim("w2", ["m"], 1, 4.0, 10.0) == []
    (c,) = await store.claim("w2", ["m"], 1, 5.0, 10.0)
    assert c.attempts == 2
    assert await store.finish("w2", "b1", 0, "errored", b'{"e": 1}', 6.0) is True
    assert counts(await store.get("b1", None)) == (0, 1, 0, 0)


async def test_a_batch_ends_when_its_last_request_finishes(store: BatchStore) -> None:
    await make(store, "b1", 3)
    claimed = await store.claim("w", ["m"], 3, 0.0, 10.0)
    outcomes = ["succeeded", "errored", "succeeded"]
    for c, outcome in zip(claimed, outcomes, strict=True):
        row = await store.get("b1", None)
        assert row is not None and row.ended_at is None
        assert await store.finish("w", "b1", c.idx, outcome, b'{"n": %d}' % c.idx, 1.0 + c.idx)
    row = await store.get("b1", None)
    assert row is not None and counts(row) == (2, 1, 0, 0) and row.ended_at == 3.0


async def test_cancel(store: BatchStore) -> None:
    await make(store, "b1", 4)
    await store.claim("w", ["m"], 1, 0.0, 10.0)  # idx 0 running
    row = await store.cancel("b1", "o", 1.0)
    assert row is not None
    assert (row.cancel_initiated_at, row.ended_at, counts(row)) == (1.0, None, (0, 0, 3, 0))
    assert await store.cancel("b1", "o", 2.0) == row  # idempotent
    assert await store.claim("w2", ["m"], 9, 100.0, 10.0) == []  # canceling: no new work
    stats = await store.stats()
    assert stats["batches"] == {"in_progress": 0, "canceling": 1, "ended": 0}
    assert await store.finish("w", "b1", 0, "succeeded", b"{}", 3.0) is True
    ended = await store.get("b1", None)
    assert ended is not None and ended.ended_at == 3.0 and counts(ended) == (1, 0, 3, 0)
    assert await store.cancel("b1", "o", 4.0) == ended  # an ended batch stays as it is
    assert await results(store, "b1") == [
        ("c0", "succeeded", b"{}"),
        ("c1", "canceled", None),
        ("c2", "canceled", None),
        ("c3", "canceled", None),
    ]


async def test_cancel_with_nothing_running_ends_at_once(store: BatchStore) -> None:
    await make(store, "b1", 2)
    row = await store.cancel("b1", None, 7.0)
    assert row is not None and row.ended_at == 7.0 and counts(row) == (0, 0, 2, 0)


async def test_expire_ends_overdue_batches(store: BatchStore) -> None:
    await store.create("due", "o", reqs(3), 0.0, 100.0)
    await store.create("later", "o", reqs(1), 0.0, 1000.0)
    await store.claim("w", ["m"], 2, 1.0, 500.0)  # due 0 and 1 running
    assert await store.finish("w", "due", 0, "succeeded", b"{}", 2.0)
    assert await store.expire(99.0) == 0
    assert await store.expire(100.0) == 1
    row = await store.get("due", None)
    assert row is not None and row.ended_at == 100.0 and counts(row) == (1, 0, 0, 2)
    assert await store.finish("w", "due", 1, "succeeded", b"{}", 101.0) is False
    assert await store.expire(200.0) == 0
    assert [r[1] for r in await results(store, "due")] == ["succeeded", "expired", "expired"]
    later = await store.get("later", None)
    assert later is not None and later.ended_at is None


async def test_expire_ends_a_canceling_batch_whose_worker_died(store: BatchStore) -> None:
    await make(store, "b1", 2)
    await store.claim("dead", ["m"], 1, 0.0, 10.0)
    row = await store.cancel("b1", None, 1.0)
    assert row is not None and row.ended_at is None
    assert await store.expire(5.0) == 0  # lease still held
    assert await store.expire(11.0) == 1
    row = await store.get("b1", None)
    assert row is not None and row.ended_at == 11.0 and counts(row) == (0, 0, 2, 0)


async def test_purge_deletes_batches_ended_before_the_retention(store: BatchStore) -> None:
    for name, ended in (("old", 10.0), ("recent", 500.0), ("open", None)):
        await make(store, name, 2)
        if ended is not None:
            await store.cancel(name, None, ended)
    assert await store.purge(1000.0, 600.0) == 1
    assert await store.get("old", None) is None and await results(store, "old") == []
    assert await store.get("recent", None) is not None
    assert await store.get("open", None) is not None
    assert await store.purge(1000.0, 600.0) == 0


async def test_results_come_in_pages_in_idx_order(store: BatchStore) -> None:
    await make(store, "b1", 2500)
    claimed = await store.claim("w", ["m"], 3, 0.0, 60.0)
    for c in claimed:
        assert await store.finish("w", "b1", c.idx, "succeeded", b'{"r": %d}' % c.idx, 1.0)
    await store.cancel("b1", None, 2.0)
    pages = [page async for page in store.results("b1")]
    assert [len(p) for p in pages] == [1000, 1000, 500]
    flat = [item for page in pages for item in page]
    assert [cid for cid, _, _ in flat] == [f"c{i}" for i in range(2500)]
    assert flat[:4] == [
        ("c0", "succeeded", b'{"r": 0}'),
        ("c1", "succeeded", b'{"r": 1}'),
        ("c2", "succeeded", b'{"r": 2}'),
        ("c3", "canceled", None),
    ]


async def test_stats(store: BatchStore) -> None:
    assert await store.stats() == {
        "batches": {"in_progress": 0, "canceling": 0, "ended": 0},
        "queued": {},
    }
    await make(store, "a", 3, model="m1")
    await make(store, "b", 2, model="m2")
    await make(store, "c", 1, model="m2")
    await store.claim("w", ["m1"], 1, 0.0, 10.0)
    await store.claim("w", ["m2"], 1, 0.0, 10.0)  # b's first: b is canceling after
    await store.cancel("b", None, 1.0)
    await store.cancel("c", None, 1.0)
    assert await store.stats() == {
        "batches": {"in_progress": 1, "canceling": 1, "ended": 1},
        "queued": {"m1": 3, "m2": 1},
    }


async def test_data_survives_reopening(open_store: Opener, db_url: str) -> None:
    first = open_store()
    await make(first, "b1", 2)
    await first.claim("w", ["m"], 1, 0.0, 10.0)
    await first.finish("w", "b1", 0, "succeeded", b'{"kept": true}', 1.0)
    await first.close()
    again = open_store()
    assert counts(await again.get("b1", None)) == (1, 0, 0, 0)
    assert (await results(again, "b1"))[0] == ("c0", "succeeded", b'{"kept": true}')


async def test_many_stores_create_the_schema_at_once(db_url: str) -> None:
    stores = await asyncio.gather(*(asyncio.to_thread(BatchStore.open, db_url) for _ in range(6)))
    try:
        await make(stores[0], "b1", 1)
        assert all([await s.get("b1", None) for s in stores])
    finally:
        for s in stores:
            await s.close()


async def test_a_closed_store_raises_store_error(db_url: str) -> None:
    store = BatchStore.open(db_url)
    await store.close()
    await store.close()  # twice is fine
    with pytest.raises(StoreError, match="closed"):
        await store.get("b1", None)


# -- failures --------------------------------------------------------------------------------


def _corrupt(tmp: Path) -> str:
    path = tmp / "corrupt.sqlite3"
    path.write_bytes(b"this is not a database file, just some bytes" * 200)
    return str(path)


def _no_dir(tmp: Path) -> str:
    return str(tmp / "missing" / "batches.sqlite3")


def _parent_is_a_file(tmp: Path) -> str:
    (tmp / "file").write_text("x")
    return f"sqlite:///{tmp}/file/batches.sqlite3"


def _read_only_dir(tmp: Path) -> str:
    if os.geteuid() == 0:  # root writes through mode bits; /proc refuses everyone
        return "/proc/batches.sqlite3"
    ro = tmp / "ro"
    ro.mkdir(mode=0o555)
    return str(ro / "batches.sqlite3")


OPEN_FAILURES: list[tuple[Callable[[Path], str], str]] = [
    (_corrupt, r"corrupt\.sqlite3.*file is not a database"),
    (_no_dir, r"missing/batches\.sqlite3: directory .*missing does not exist"),
    (_parent_is_a_file, r"file/batches\.sqlite3: directory .*file does not exist"),
    (
        _read_only_dir,
        r"batches\.sqlite3: directory .* is not writable|batches\.sqlite3.*"
        r"unable to open",
    ),
    (lambda tmp: str(tmp), r"is a directory"),
    (lambda tmp: "mysql://u:p@h/db", r"unsupported URL scheme 'mysql'"),
]


@pytest.mark.parametrize(
    ("make_url", "message"),
    OPEN_FAILURES,
    ids=["corrupt", "no-dir", "parent-file", "read-only-dir", "a-dir", "scheme"],
)
def test_open_fails_with_a_clear_store_error(
    tmp_path: Path, make_url: Callable[[Path], str], message: str
) -> None:
    with pytest.raises(StoreError, match=message):
        BatchStore.open(make_url(tmp_path))


async def test_sqlite_url_forms(tmp_path: Path) -> None:
    path = tmp_path / "abs.sqlite3"
    for url in (f"sqlite:///{path}", str(path)):  # sqlite:////abs (SQLAlchemy's form), bare
        store = BatchStore.open(url)
        await store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        conn.close()
    memory = BatchStore.open("sqlite://")
    try:
        await make(memory, "b1", 1)
        assert await memory.get("b1", None) is not None
    finally:
        await memory.close()


def test_unreachable_postgresql_is_a_store_error_without_the_password(
    pg_server: pg.PgServer,
) -> None:
    from tests.procs import free_port

    url = pg_server.url("nope", port=free_port())
    with pytest.raises(StoreError) as info:
        BatchStore.open(url)
    text = str(info.value)
    assert "postgresql database nope at 127.0.0.1" in text
    assert pg.PASSWORD not in text and pg.USER + ":" not in text


def test_a_wrong_postgresql_password_is_a_store_error_without_it(
    pg_server: pg.PgServer, pg_url: str
) -> None:
    url = pg_url.replace(pg.PASSWORD, "not-the-password")
    with pytest.raises(StoreError, match="gateway_test") as info:
        BatchStore.open(url)
    assert "not-the-password" not in str(info.value)


@pytest.fixture
def own_pg_server() -> Iterator[pg.PgServer]:
    """A server of this test's own, to stop under a store that uses it."""
    with pg.running_server() as server:
        yield server


async def test_postgresql_going_away_is_a_store_error_from_a_call(
    own_pg_server: pg.PgServer,
) -> None:
    store = BatchStore.open(own_pg_server.create_db("gone"))
    try:
        await make(store, "b1", 2)
        own_pg_server.stop()
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.get("b1", None),
            lambda: store.claim("w", ["m"], 1, 0.0, 10.0),
            lambda: store.stats(),
        ]
        for call in calls:
            with pytest.raises(
                StoreError, match=r"postgresql database gone at 127\.0\.0\.1"
            ) as info:
                await call()
            assert pg.PASSWORD not in str(info.value)
    finally:
        await store.close()


async def test_postgresql_waits_are_bounded(pg_url: str) -> None:
    """The store's connections carry a statement and lock timeout and TCP keepalives, so a
    blocked lock or a silent server ends in a StoreError instead of holding the store's one
    thread (and the batch routes behind it) forever."""
    import sqlalchemy as sa

    _drop_tables(pg_url)
    store = BatchStore.open(pg_url)
    try:
        with store._engine.connect() as conn:
            shown = {
                name: conn.execute(sa.text(f"SHOW {name}")).scalar()
                for name in ("statement_timeout", "lock_timeout")
            }
            client = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
    finally:
        await store.close()
    assert shown == {"statement_timeout": "30s", "lock_timeout": "30s"}
    assert {k: client.get(k) for k in ("keepalives", "keepalives_idle", "tcp_user_timeout")} == {
        "keepalives": "1",
        "keepalives_idle": "10",
        "tcp_user_timeout": "30000",
    }
