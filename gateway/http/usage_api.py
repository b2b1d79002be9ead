"""Usage recorded per client and model, and served in the Admin API's shape.

Recording (:class:`UsageRecorder`): a reply's usage (a Messages reply's ``Figures.on_end``,
buffered, streamed, with web search or a batch request; the pass-through's reply) is added
to this process's :class:`~gateway.tenancy.usage.UsageAggregate` (a dict lookup), and every
``FLUSH_SECONDS`` a task writes what was added in one transaction on the usage store's own
thread (:mod:`gateway.batches.usage_store`); once more at shutdown. A failed write keeps its
rows (bounded) for the next and is logged at most once a minute.

Serving: ``GET {prefix}/v1/organizations/usage_report/messages`` (:func:`usage_report`),
for the keys of ``server.admin_keys_env`` only: no key or an unknown one is a 401
``authentication_error``; a client's key (it is known, but is not an admin key) a 403
``permission_error``. This process's rows not yet written are written first, so a report
includes every reply this process has finished; other processes' within ``FLUSH_SECONDS``.

Recording runs only with admin keys configured (there is no one to read it otherwise) and a
database: the batches' (``batches.database``, or the default file in the state directory),
opened for usage even when batches are off (gateway/__main__.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import structlog
from aiohttp import web

from gateway import errors
from gateway.http.keys import EXCHANGE, STATE
from gateway.tenancy.usage import UsageAggregate
from gateway.tenancy.usage_report import parse_query, report
from gateway.text import jsonutil

if TYPE_CHECKING:  # the SQL layer is imported only when a usage store is opened
    from gateway.batches.usage_store import UsageStore

__all__ = ["FLUSH_SECONDS", "USAGE", "UsageRecorder", "usage_ctx", "usage_report"]

FLUSH_SECONDS = 5.0
_LOG_EVERY = 60.0  # seconds between two logged write failures
_log = structlog.get_logger("gateway.usage")


class UsageRecorder:
    """This process's usage not yet written, and the store it goes to."""

    __slots__ = ("_failed_at", "_lock", "_logged_drops", "aggregate", "store")

    def __init__(self, store: UsageStore, aggregate: UsageAggregate | None = None) -> None:
        self.store = store
        self.aggregate = aggregate if aggregate is not None else UsageAggregate()
        self._lock = asyncio.Lock()
        self._failed_at = -_LOG_EVERY
        self._logged_drops = 0

    def add(
        self,
        client: str,
        model: str,
        uncached: int,
        cache_read: int,
        output: int,
        web_searches: int,
    ) -> None:
        self.aggregate.add(time.time(), client, model, uncached, cache_read, output, web_searches)

    async def flush(self) -> bool:
        """Write what was added since the last write. -> whether it was written."""
        from gateway.batches.schema import StoreError

        async with self._lock:
            rows = self.aggregate.take()
            try:
                await self.store.add(rows)
            except StoreError as exc:
                self.aggregate.give_back(rows)
                now = time.monotonic()
                if now - self._failed_at >= _LOG_EVERY:
                    self._failed_at = now
                    _log.warning(
                        "usage_write_failed",
                        detail=str(exc),
                        kept=len(self.aggregate),
                        dropped=self.aggregate.dropped,
                    )
                return False
            dropped = self.aggregate.dropped
            if dropped != self._logged_drops:
                self._logged_drops = dropped
                _log.error("usage_dropped", replies=dropped, detail="too long unwritten")
            return True


USAGE = web.AppKey("usage", UsageRecorder)


async def usage_ctx(app: web.Application) -> AsyncIterator[None]:
    """The writer's task while the app serves; at shutdown, a last write, then the store
    closed."""
    recorder = app[USAGE]

    async def writer() -> None:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            await recorder.flush()

    task = asyncio.create_task(writer())
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await recorder.flush()
    await recorder.store.close()


def _admin(request: web.Request) -> None:
    """An admin key was presented, else the 401 (no key, or one nobody has) or the 403 (a
    client's key)."""
    presented = request[EXCHANGE].client_key
    tenants = request.app[STATE].tenants
    if tenants.is_admin(presented):
        return
    if presented is not None and tenants.keyed and tenants.identify(presented) is not None:
        raise errors.PermissionDenied("this endpoint needs an admin key (server.admin_keys_env)")
    raise errors.AuthenticationFailed()


async def usage_report(request: web.Request) -> web.Response:
    _admin(request)
    recorder = request.app.get(USAGE)
    if recorder is None:
        raise errors.NotFound(
            "the usage report is off: the gateway has no usage database (see its start log)"
        )
    params: dict[str, list[str]] = {}
    for name, value in request.rel_url.query.items():
        params.setdefault(name, []).append(value)
    query = parse_query(params, time.time())
    from gateway.batches.schema import StoreError

    await recorder.flush()
    try:
        rows = await recorder.store.rows(query)
    except StoreError as exc:
        _log.warning("usage_report_failed", detail=str(exc))
        raise errors.GatewayError("The usage database failed; try again", status=503) from None
    return web.Response(body=jsonutil.dumpb(report(query, rows)), content_type="application/json")
