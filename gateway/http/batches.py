"""The Message Batches routes (Anthropic's API, under ``{prefix}/v1/messages/batches``).

    POST   /v1/messages/batches               create: {"requests": [{custom_id, params}, ...]}
    GET    /v1/messages/batches               list, newest first (limit, before_id, after_id)
    GET    /v1/messages/batches/{id}          retrieve
    POST   /v1/messages/batches/{id}/cancel   cancel
    DELETE /v1/messages/batches/{id}          delete (an ended batch only)
    GET    /v1/messages/batches/{id}/results  results, JSON lines (an ended batch only)

Protocol facts relied on (Anthropic's API reference and both SDKs' types):

* A ``message_batch`` is ``id`` (``msgbatch_``), ``type``, ``processing_status``
  (``in_progress``, ``canceling``, ``ended``), ``request_counts`` (``processing``,
  ``succeeded``, ``errored``, ``canceled``, ``expired``), ``ended_at``, ``created_at``,
  ``expires_at``, ``archived_at``, ``cancel_initiated_at`` (RFC 3339 or null) and
  ``results_url`` (null until the batch ends). Requests count as ``processing`` until the
  whole batch ends and then move to the other counts at once; the counts always add up to
  the number of requests.
* A list page is ``{"data", "has_more", "first_id", "last_id"}``, newest first; ``limit``
  1..1000 (default 20); ``after_id`` pages towards older batches, ``before_id`` towards
  newer ones.
* Each result line is ``{"custom_id", "result"}``, ``result`` one of ``{"type":
  "succeeded", "message"}``, ``{"type": "errored", "error": <error envelope>}``,
  ``{"type": "canceled"}``, ``{"type": "expired"}``. The SDKs fetch ``results_url`` as an
  absolute URL (with the client's own headers), so it names this gateway: the configured
  ``batches.public_base_url`` behind a proxy, else the request's own scheme and host.
* Delete answers ``{"id", "type": "message_batch_deleted"}``.
* ``custom_id`` is 1 to 64 characters of ``[A-Za-z0-9_-]``, unique within the batch; each
  ``params`` is a Messages request without ``stream``, validated at creation as
  ``/v1/messages`` validates it: one bad request fails the whole create with a 400 naming
  ``requests.N.params...``.

With client keys configured (``server.api_keys_env``) a batch belongs to the key that made
it (a hash of it is stored): any other key gets a 404 for it and never sees it in a list.
The store failing is a 500 ``api_error`` on these routes; the interactive routes never touch
the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime
from typing import Any, TypeVar

import structlog
from aiohttp import web

from gateway import errors
from gateway.batches.store import BatchRow, BatchStore, StoreError, StoreFull
from gateway.http.batch_create import parse_body
from gateway.http.body import read_bytes
from gateway.http.keys import (
    BATCH_STORE,
    CONFIG,
    EXCHANGE,
    METRICS,
    ROUTE_TAGS,
    SCHEDULER,
    STATE,
    RouteTag,
)
from gateway.http.writer import StreamWriter
from gateway.tenancy.clients import owner_id
from gateway.text import ids, jsonutil

_log = structlog.get_logger("gateway.batches")
T = TypeVar("T")

_BATCH_ID = re.compile(r"msgbatch_[A-Za-z0-9]{1,64}")
_LIST_LIMIT = (1, 1000, 20)  # min, max, default


def new_batch_id() -> str:
    return "msgbatch_" + ids.b62(24)


def owner_of(request: web.Request) -> str:
    """Who a batch belongs to: a hash of the client's key (the one the middleware accepted),
    "" when keys are not in use."""
    if not request.app[STATE].tenants.keyed:
        return ""
    return owner_id(hashlib.sha256(request[EXCHANGE].client_key or b"").digest())


def rfc3339(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def status_of(row: BatchRow) -> str:
    if row.ended_at is not None:
        return "ended"
    return "canceling" if row.cancel_initiated_at is not None else "in_progress"


def render(row: BatchRow, base: str) -> dict[str, Any]:
    """The ``message_batch`` object; ``base``: the batches route's absolute URL."""
    ended = row.ended_at is not None
    counts = {"processing": row.total, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    if ended:  # requests move out of processing only once the whole batch ends
        counts = {
            "processing": 0,
            "succeeded": row.succeeded,
            "errored": row.errored,
            "canceled": row.canceled,
            "expired": row.expired,
        }
    return {
        "id": row.id,
        "type": "message_batch",
        "processing_status": status_of(row),
        "request_counts": counts,
        "ended_at": rfc3339(row.ended_at),
        "created_at": rfc3339(row.created_at),
        "expires_at": rfc3339(row.expires_at),
        "archived_at": None,
        "cancel_initiated_at": rfc3339(row.cancel_initiated_at),
        "results_url": f"{base}/{row.id}/results" if ended else None,
    }


def _base(request: web.Request) -> str:
    """Where the batches routes are, absolute: ``batches.public_base_url`` behind a proxy,
    else the request's own scheme and host; the prefix after either."""
    cfg = request.app[CONFIG]
    origin = cfg.batches.public_base_url or f"{request.scheme}://{request.host}"
    return f"{origin}{cfg.server.prefix}/v1/messages/batches"


def _json(request: web.Request, body: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=jsonutil.dumpb(body),
        status=status,
        content_type="application/json",
        headers={"request-id": request[EXCHANGE].request_id},
    )


def _store(request: web.Request) -> BatchStore:
    store = request.app.get(BATCH_STORE)
    if store is None:
        raise errors.NotFound("Message Batches are not enabled on this gateway (batches.enabled)")
    return store


async def _ask(call: Awaitable[T]) -> T:
    """A store call; the store failing is the route's 500."""
    try:
        return await call
    except StoreError as exc:
        raise _failed(exc) from None


async def _found(call: Awaitable[T | None], batch_id: str) -> T:
    """A store call about one batch of the client's; None (absent, or another's) is a 404."""
    found = await _ask(call)
    if found is None:
        raise _not_found(batch_id)
    return found


def _batch_id(request: web.Request) -> str:
    batch_id = request.match_info["batch_id"]
    if not _BATCH_ID.fullmatch(batch_id):
        raise errors.NotFound(f"message batch {errors.echo(batch_id, 80)} not found")
    return batch_id


def _not_found(batch_id: str) -> errors.GatewayError:
    return errors.NotFound(f"message batch {batch_id} not found")


class _StoreFailed(errors.GatewayError):
    status = 500


class _StoreFull(errors.GatewayError):
    status = 507
    default_message = (
        "The batch store's disk is full: cancel or delete ended batches "
        "(their results are freed), or free space on the server; creates "
        "are refused until then"
    )


def _failed(exc: StoreError) -> errors.GatewayError:
    if isinstance(exc, StoreFull):
        _log.warning("batch_store_full", detail=str(exc))
        return _StoreFull(error_type="api_error")
    _log.error("batch_store_error", detail=str(exc))
    return _StoreFailed("The batch store is unavailable; retry shortly")


# --- create ------------------------------------------------------------------------------


async def create(request: web.Request) -> web.Response:
    store = _store(request)
    cfg = request.app[CONFIG]
    # the body, then the requests made from it, count in the memory budget until stored
    with request.app[STATE].memory.lease() as lease:
        raw = await read_bytes(request, lease, cfg.batches.max_body_bytes)
        requests = await parse_body(request, cfg, raw, lease)
        size = len(raw)
        del raw
        lease.give(size)
        now = time.time()
        row = await _ask(
            store.create(
                new_batch_id(), owner_of(request), requests, now, now + cfg.batches.expire_after
            )
        )
        del requests
    request.app[METRICS].batches_created.inc()
    scheduler = request.app.get(SCHEDULER)
    if scheduler is not None:
        scheduler.wake()
    _log.info("batch_created", batch_id=row.id, requests=row.total)
    return _json(request, render(row, _base(request)))


# --- list, retrieve, cancel, delete ------------------------------------------------------


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit")
    low, high, default = _LIST_LIMIT
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise errors.InvalidRequest("limit", "Input should be a valid integer") from None
    if not low <= value <= high:
        raise errors.InvalidRequest("limit", f"must be between {low} and {high}")
    return value


async def list_batches(request: web.Request) -> web.Response:
    store = _store(request)
    limit = _limit(request)
    before, after = request.query.get("before_id"), request.query.get("after_id")
    if before is not None and after is not None:
        raise errors.InvalidRequest("before_id", "use either before_id or after_id, not both")
    for name, value in (("before_id", before), ("after_id", after)):
        if value is not None and not _BATCH_ID.fullmatch(value):
            raise errors.InvalidRequest(name, "must be a message batch id")
    rows, has_more = await _ask(store.page(owner_of(request), limit, before, after))
    base = _base(request)
    data = [render(row, base) for row in rows]
    return _json(
        request,
        {
            "data": data,
            "has_more": has_more,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        },
    )


async def retrieve(request: web.Request) -> web.Response:
    batch_id = _batch_id(request)
    row = await _found(_store(request).get(batch_id, owner_of(request)), batch_id)
    return _json(request, render(row, _base(request)))


async def cancel(request: web.Request) -> web.Response:
    batch_id = _batch_id(request)
    row = await _found(_store(request).cancel(batch_id, owner_of(request), time.time()), batch_id)
    _log.info("batch_cancel", batch_id=batch_id, status=status_of(row))
    return _json(request, render(row, _base(request)))


async def delete(request: web.Request) -> web.Response:
    batch_id = _batch_id(request)
    deleted = await _found(_store(request).delete(batch_id, owner_of(request)), batch_id)
    if not deleted:
        raise errors.InvalidRequest(
            "",
            f"message batch {batch_id} cannot be deleted while it "
            "is processing; cancel it and wait until it has ended",
        )
    return _json(request, {"id": batch_id, "type": "message_batch_deleted"})


# --- results -----------------------------------------------------------------------------

_CANCELED = b'{"type":"canceled"}'
_EXPIRED = b'{"type":"expired"}'


async def results(request: web.Request) -> web.StreamResponse:
    store = _store(request)
    batch_id = _batch_id(request)
    row = await _found(store.get(batch_id, owner_of(request)), batch_id)
    if row.ended_at is None:
        raise errors.InvalidRequest(
            "",
            f"message batch {batch_id} has not ended yet: its "
            "results are available once processing_status is ended",
        )
    pages = store.results(batch_id)
    page = await _ask(anext(pages, None))  # before the status is sent: a 500 still can be
    # the stream writer: a client that stops reading is dropped after server.write_timeout
    writer = await StreamWriter.open(
        request,
        content_type="application/binary",
        write_timeout=request.app[CONFIG].server.write_timeout,
        ping_interval=None,
    )
    try:
        while page is not None:
            lines = []
            for custom_id, kind, result in page:
                body = (
                    result
                    if result is not None
                    else (_CANCELED if kind == "canceled" else _EXPIRED)
                )
                lines.append(
                    b'{"custom_id":%s,"result":%s}\n' % (jsonutil.dumpb_str(custom_id), body)
                )
            await writer.write(b"".join(lines))
            page = await anext(pages, None)
    except StoreError as exc:  # the status is sent: end the body short; the client sees a cut
        _log.error("batch_store_error", detail=str(exc), batch_id=batch_id)
        if request.transport is not None:
            request.transport.close()
        return writer.response
    await writer.close()
    return writer.response


def add_routes(app: web.Application, prefix: str) -> None:
    base = f"{prefix}/v1/messages/batches"
    for method, path, handler, name in (
        ("POST", base, create, "batches_create"),
        ("GET", base, list_batches, "batches_list"),
        ("GET", base + "/{batch_id}", retrieve, "batches_get"),
        ("POST", base + "/{batch_id}/cancel", cancel, "batches_cancel"),
        ("DELETE", base + "/{batch_id}", delete, "batches_delete"),
        ("GET", base + "/{batch_id}/results", results, "batches_results"),
    ):
        app.router.add_route(method, path, handler, name=name)
        app[ROUTE_TAGS][name] = RouteTag("batches")


async def scheduler_ctx(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: run the scheduler while the app runs; stop it, then close the store."""
    scheduler = app[SCHEDULER]
    task = asyncio.create_task(scheduler.run())
    yield
    await scheduler.stop()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    await app[BATCH_STORE].close()
