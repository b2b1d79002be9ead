"""The app keys of Message Batches: the store and the scheduler (absent when disabled)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from gateway.batches.store import BatchStore

BATCH_STORE: web.AppKey[BatchStore] = web.AppKey("batch_store")
SCHEDULER: web.AppKey[Any] = web.AppKey("batch_scheduler")
