"""The batch store at its edges. On a full disk (SQLite's ``max_page_count`` stands in for
the disk): a create is refused as 507 ``The batch store's disk is full``, not an opaque
500, and cancel and delete still work, so a client can free space and batches still end.
In back-off: a look for work costs one query, whatever the number of waiting batches."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from gateway.batches.store import BatchStore, StoreError, StoreFull
from gateway.http import batches as api


def _cap(store: BatchStore, pages: int) -> None:
    """Every connection of the store may grow the file to ``pages`` pages, no more."""
    engine = store._engine
    engine.dispose()

    @event.listens_for(engine, "connect")
    def _limit(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute(f"PRAGMA max_page_count = {pages}")


def _requests(n: int, size: int) -> list[tuple[str, str, bytes]]:
    return [(f"r{i}", "m", b'{"pad":"' + b"x" * size + b'"}') for i in range(n)]


async def test_a_full_disk_is_a_507_and_cancel_and_delete_still_work(tmp_path: Path) -> None:
    store = BatchStore.open(f"sqlite:///{tmp_path / 'b.sqlite3'}")
    try:
        now = time.time()
        await store.create("msgbatch_a", "o", _requests(200, 100), now, now + 3600)
        await store.create("msgbatch_b", "o", _requests(200, 100), now, now + 3600)
        pages = (tmp_path / "b.sqlite3").stat().st_size // 4096 + 8
        _cap(store, pages)
        with pytest.raises(StoreFull) as full:
            for i in range(100):
                await store.create(f"msgbatch_x{i}", "o", _requests(50, 2000), now, now + 3600)
        assert isinstance(full.value, StoreError)
        err = api._failed(full.value)
        assert err.status == 507 and "disk is full" in err.message
        # a client can still end and remove batches, freeing space
        row = await store.cancel("msgbatch_a", "o", time.time())
        assert row is not None and row.ended_at is not None and row.canceled == 200
        assert await store.delete("msgbatch_a", "o") is True
        row = await store.cancel("msgbatch_b", "o", time.time())
        assert row is not None and row.canceled == 200
    finally:
        await store.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB filesystem (tmpfs): the disk itself fills, not a page cap. Needs the
    right to mount (root); skipped elsewhere."""
    where = tmp_path / "disk"
    where.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)],
            capture_output=True,
            timeout=10,
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=10)


async def test_cancel_and_delete_work_when_the_disk_itself_is_full(small_disk: Path) -> None:
    """In WAL mode every write appends pages to the -wal file first, a cancel and a delete
    too: on a really full disk (not a page cap) both failed like creates, so nothing could
    free space. The reserve file beside the database is spent for them; creates stay
    refused while it cannot be made again."""
    store = BatchStore.open(f"sqlite:///{small_disk / 'b.sqlite3'}", reserve_bytes=256 * 1024)
    try:
        now = time.time()
        for name in ("msgbatch_a", "msgbatch_b", "msgbatch_c"):
            await store.create(name, "o", _requests(50, 100), now, now + 3600)
        assert (small_disk / "b.sqlite3.reserve").stat().st_size == 256 * 1024
        with pytest.raises(StoreFull):
            for i in range(1000):  # big ones, then small ones: to the last block
                await store.create(f"msgbatch_x{i}", "o", _requests(5, 2000), now, now + 3600)
        with pytest.raises(StoreFull):
            for i in range(1000):
                await store.create(f"msgbatch_y{i}", "o", _requests(1, 10), now, now + 3600)
        assert os.statvfs(small_disk).f_bavail == 0
        row = await store.cancel("msgbatch_a", "o", time.time())
        assert row is not None and row.ended_at is not None and row.canceled == 50
        assert await store.delete("msgbatch_a", "o") is True
        row = await store.cancel("msgbatch_b", "o", time.time())
        assert row is not None and row.canceled == 50
        assert not (small_disk / "b.sqlite3.reserve").exists()  # spent on them
        with pytest.raises(StoreFull) as refused:  # no room to make it again: refused
            await store.create("msgbatch_z", "o", _requests(1, 10), now, now + 3600)
        assert api._failed(refused.value).status == 507
        assert await store.get("msgbatch_c", "o") is not None  # the rest is intact
    finally:
        await store.close()


async def test_a_look_for_work_while_every_request_waits_in_back_off_is_one_query(
    tmp_path: Path,
) -> None:
    """150 batches whose requests all wait out a 503's back-off: each look (every poll, and
    after every request that ends) queried every batch in turn, which kept an idle gateway
    at a third of a core. Only batches with due work are looked into now."""
    store = BatchStore.open(f"sqlite:///{tmp_path / 'b.sqlite3'}")
    try:
        now = time.time()
        for i in range(150):
            await store.create(f"msgbatch_{i:03}", "o", _requests(2, 10), now, now + 3600)
        claimed = await store.claim("w", ["m"], 1000, now, 60.0)
        assert len(claimed) == 300
        for item in claimed:
            await store.release("w", item.batch_id, item.idx, now + 300)  # in back-off
        statements: list[str] = []
        event.listen(store._engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
        assert await store.claim("w", ["m"], 1000, time.time(), 60.0) == []
        selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
        assert len(selects) <= 2, len(selects)
        # the scheduler sleeps until the first retry is due (one query), then claims them all
        assert await store.next_due(["m"], time.time()) == pytest.approx(now + 300)
        assert await store.next_due(["other"], time.time()) is None
        assert len(await store.claim("w", ["m"], 1000, now + 301, 60.0)) == 300
        # running: due when the lease lapses (its worker may die)
        assert await store.next_due(["m"], now + 301) == pytest.approx(now + 361)
    finally:
        await store.close()
