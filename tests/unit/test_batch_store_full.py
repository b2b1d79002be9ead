"""The batch store on a full disk (SQLite's ``max_page_count`` stands in for the disk): a
create is refused as 507 ``The batch store's disk is full``, not an opaque 500, and cancel
and delete still work, so a client can free space and batches still end."""

from __future__ import annotations

import time
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
