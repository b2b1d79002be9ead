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
from gateway.http.body import decode_json, read_bytes
from gateway.http.keys import (
    BATCH_STORE,
    CLIENT,
    CLIENT_KEY,
    CONFIG,
    METRICS,
    REQUEST_ID,
    ROUTE_TAGS,
    SCHEDULER,
    STATE,
    RouteTag,
)
from gateway.http.writer import StreamWriter
from gateway.messages.request.validate import validate_messages
from gateway.messages.search_blocks import TOOL_TYPES as WEB_SEARCH_TYPES
from gateway.ops.budget import Lease
from gateway.ops.config import Config, find_route
from gateway.tenancy.clients import ANONYMOUS_CLIENT, Client, owner_id
from gateway.text import ids, jsonutil
from gateway.text.json_items import ArrayItems, NotPlain

_log = structlog.get_logger("gateway.batches")
T = TypeVar("T")

_CUSTOM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_BATCH_ID = re.compile(r"msgbatch_[A-Za-z0-9]{1,64}")
# values a batch body may decode to (each request's params are a few dozen): bounds the
# Python objects a 256 MB body builds
MAX_BATCH_VALUES = 1 << 23
_LIST_LIMIT = (1, 1000, 20)  # min, max, default


def new_batch_id() -> str:
    return "msgbatch_" + ids.b62(24)


def owner_of(request: web.Request) -> str:
    """Who a batch belongs to: a hash of the client's key (the one the middleware accepted),
    "" when keys are not in use."""
    if not request.app[STATE].tenants.keyed:
        return ""
    return owner_id(hashlib.sha256(request[CLIENT_KEY] or b"").digest())


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
        headers={"request-id": request[REQUEST_ID]},
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

# requests parsed between two turns of the event loop: a 20,000-request create parsed in one
# go held the loop 0.74 s (100,000: /health waited 19 s); slices of 256 still held it 25-50 ms
# each on a busy machine. Read from the bytes, a slice also ends past PARSE_SLICE_BYTES of
# request JSON (a request's cost grows with its size: validated, then encoded)
PARSE_SLICE = 32
PARSE_SLICE_BYTES = 256 * 1024


def parse_create(
    cfg: Config, body: Any, client: Client = ANONYMOUS_CLIENT
) -> list[tuple[str, str, bytes]]:
    """(custom_id, route name, params JSON) per request; raises the 400 naming what is
    wrong (a 403 for a model outside ``client``'s list). The route's configured name is what
    the scheduler claims work by."""
    parser = CreateParser(cfg, body, client)
    while not parser.done:
        parser.step(PARSE_SLICE)
    return parser.out


class CreateParser:
    """:func:`parse_create` in slices (pure): ``step(n)`` parses the next ``n`` requests, so
    the handler can give the event loop a turn between slices. Each request's decoded
    params are dropped from the body once encoded, so a request is held once, as JSON."""

    __slots__ = ("_next", "_reader", "_reqs", "out")

    def __init__(self, cfg: Config, body: Any, client: Client = ANONYMOUS_CLIENT) -> None:
        if not isinstance(body, dict):
            raise errors.InvalidRequest("", "request body must be a JSON object")
        for key in body:
            if key != "requests":
                raise errors.InvalidRequest(key, "Extra inputs are not permitted")
        reqs = body.get("requests")
        if not isinstance(reqs, list):
            raise errors.InvalidRequest("requests", "Field required: a list of requests")
        if not reqs:
            raise errors.InvalidRequest("requests", "List should have at least 1 item")
        if len(reqs) > cfg.batches.max_requests:
            raise errors.InvalidRequest(
                "requests",
                f"List should have at most {cfg.batches.max_requests} items, not {len(reqs)}",
            )
        self._reqs: list[Any] = reqs
        self._next = 0
        self._reader = RequestReader(cfg, client)
        self.out: list[tuple[str, str, bytes]] = []

    @property
    def done(self) -> bool:
        return self._next >= len(self._reqs)

    def step(self, count: int) -> None:
        stop = min(self._next + count, len(self._reqs))
        for i in range(self._next, stop):
            self.out.append(self._reader.read(i, self._reqs[i]))
            self._reqs[i] = None  # its objects go now; the JSON bytes stay
        self._next = stop


class RequestReader:
    """Each request of a create checked, in order (``custom_id`` unique in the batch), and
    made ``(custom_id, route name, params JSON)``."""

    __slots__ = ("_cfg", "_client", "_seen")

    def __init__(self, cfg: Config, client: Client = ANONYMOUS_CLIENT) -> None:
        self._cfg = cfg
        self._client = client
        self._seen: set[str] = set()

    def read(self, i: int, item: Any) -> tuple[str, str, bytes]:
        where = f"requests.{i}"
        if not isinstance(item, dict):
            raise errors.InvalidRequest(where, "Input should be an object")
        for key in item:
            if key not in ("custom_id", "params"):
                raise errors.InvalidRequest(f"{where}.{key}", "Extra inputs are not permitted")
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not _CUSTOM_ID.fullmatch(custom_id):
            raise errors.InvalidRequest(
                f"{where}.custom_id",
                "must be a string of 1 to 64 characters from a-z, A-Z, 0-9, '-' and '_'",
            )
        if custom_id in self._seen:
            raise errors.InvalidRequest(
                f"{where}.custom_id",
                f"duplicate custom_id {custom_id!r}: each must be unique in the batch",
            )
        self._seen.add(custom_id)
        params = item.get("params")
        if "params" not in item:
            raise errors.InvalidRequest(f"{where}.params", "Field required")
        if isinstance(params, dict) and params.get("stream") not in (None, False):
            raise errors.InvalidRequest(
                f"{where}.params.stream", "streaming is not supported in message batches"
            )
        _no_web_search(params, where)
        try:
            req = validate_messages(params)
        except errors.InvalidRequest as exc:
            path = f"{where}.params" + (f".{exc.path}" if exc.path else "")
            why = exc.message[len(exc.path) + 2 :] if exc.path else exc.message
            raise errors.InvalidRequest(path, why, details=exc.details) from None
        route = find_route(self._cfg.models, req["model"])
        if route is None:
            raise errors.InvalidRequest(
                f"{where}.params.model", f"model {errors.echo(req['model'], 256)} not found"
            )
        if not self._client.may_use(req["model"], route.name):
            # as /v1/messages answers it: a batch is no way round a client's models list
            raise errors.PermissionDenied(
                f"{where}.params.model: This API key may not use the model "
                f"{errors.echo(req['model'], 256)}"
            )
        return (custom_id, route.name, jsonutil.dumpb(params))


def _no_web_search(params: Any, where: str) -> None:
    """Web search runs in interactive requests only (gateway/tools/): a batch request
    carrying the tool is refused by name, whether or not [web_search] is configured."""
    tools = params.get("tools") if isinstance(params, dict) else None
    if not isinstance(tools, list):
        return
    for i, tool in enumerate(tools):
        if isinstance(tool, dict) and tool.get("type") in WEB_SEARCH_TYPES:
            raise errors.InvalidRequest(
                f"{where}.params.tools.{i}.type",
                "web search is not available in message batches on "
                "this gateway; send the request to /v1/messages",
            )


async def _parse_create(
    cfg: Config, body: Any, client: Client = ANONYMOUS_CLIENT
) -> list[tuple[str, str, bytes]]:
    """:func:`parse_create`, giving the event loop a turn between slices."""
    parser = CreateParser(cfg, body, client)
    del body
    while not parser.done:
        parser.step(PARSE_SLICE)
        await asyncio.sleep(0)
    return parser.out


# what one parsed request holds beyond its params JSON: its tuple, the bytes' and the
# custom_id's headers, its slot in the list
_ENTRY_BYTES = 200
BATCH_BUSY = "Overloaded: too many large requests are being held at once; retry shortly"


async def _parse_body(
    request: web.Request, cfg: Config, raw: bytearray, lease: Lease
) -> list[tuple[str, str, bytes]]:
    """The create's requests, each read from the body alone (:class:`ArrayItems`) and
    counted in ``lease`` as it is encoded; a body of another shape is decoded whole, as
    it always was, and answered as it always was."""
    held = lease.held
    client = request.get(CLIENT, ANONYMOUS_CLIENT)  # set by the middleware
    try:
        items = ArrayItems(
            raw, "requests", max_values=MAX_BATCH_VALUES, max_item_values=jsonutil.MAX_VALUES
        )
        return await _parse_items(cfg, items, lease, client)
    except NotPlain:
        lease.give(lease.held - held)  # what was parsed is dropped
    body = await decode_json(request, raw, MAX_BATCH_VALUES)
    return await _parse_create(cfg, body, client)


async def _parse_items(
    cfg: Config, items: ArrayItems, lease: Lease, client: Client = ANONYMOUS_CLIENT
) -> list[tuple[str, str, bytes]]:
    """:func:`_parse_create` of the body's items, one at a time, giving the event loop a
    turn between slices; a request that does not decode is :class:`NotPlain` (the whole
    decode names what is wrong as it always did). A create of more than
    ``batches.max_requests`` is refused once the count passes it (the rest only counted)."""
    reader = RequestReader(cfg, client)
    out: list[tuple[str, str, bytes]] = []
    limit = cfg.batches.max_requests
    turn = _Turns()
    while not items.done:
        text = items.next()
        if len(out) == limit:
            rest = 1
            while not items.done:
                rest += 1
                await turn.after(items.next())
            raise errors.InvalidRequest(
                "requests", f"List should have at most {limit} items, not {limit + rest}"
            )
        try:
            item = jsonutil.loads(text)
        except ValueError:
            raise NotPlain from None
        entry = reader.read(len(out), item)
        if not lease.take(len(entry[2]) + _ENTRY_BYTES):
            raise errors.Overloaded(BATCH_BUSY)
        out.append(entry)
        await turn.after(text)
    return out


class _Turns:
    """A turn of the event loop after every PARSE_SLICE requests or PARSE_SLICE_BYTES of
    their JSON, whichever comes first."""

    __slots__ = ("_count", "_size")

    def __init__(self) -> None:
        self._count = 0
        self._size = 0

    async def after(self, text: str) -> None:
        self._count += 1
        self._size += len(text)
        if self._count >= PARSE_SLICE or self._size >= PARSE_SLICE_BYTES:
            self._count = self._size = 0
            await asyncio.sleep(0)


async def create(request: web.Request) -> web.Response:
    store = _store(request)
    cfg = request.app[CONFIG]
    # the body, then the requests made from it, count in the memory budget until stored
    with request.app[STATE].memory.lease() as lease:
        raw = await read_bytes(request, lease, cfg.batches.max_body_bytes)
        requests = await _parse_body(request, cfg, raw, lease)
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
