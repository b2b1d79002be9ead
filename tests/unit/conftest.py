"""Unit-test fixtures: the upstream tests' pools (every pool a test makes is closed)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.upstream.pool import Pool


@pytest.fixture
async def pools() -> Any:
    """Creates pools; every one is closed at teardown."""
    made: list[Pool] = []

    def make(url: str, **kwargs: Any) -> Pool:
        # the pool's mechanics (reuse, limits, sweeps) with keep-alive on from the start;
        # "auto" (the config's default) is tests/unit/upstream/test_reuse.py's subject
        kwargs.setdefault("keepalive", "always")
        pool = Pool(url, **kwargs)
        made.append(pool)
        return pool

    yield make
    for pool in made:
        await pool.close()
    await asyncio.sleep(0)
