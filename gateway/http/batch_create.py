"""A Message Batches create's body made into its requests (the create route is
gateway/http/batches.py): each request checked as ``/v1/messages`` checks it, in order
(``custom_id`` unique), encoded once and counted in the memory budget, parsed in slices with a
turn of the event loop between them, so a 100,000-request create never holds the loop.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from aiohttp import web

from gateway import errors
from gateway.http.body import decode_json
from gateway.http.keys import EXCHANGE
from gateway.messages.request.validate import validate_messages
from gateway.messages.search_blocks import TOOL_TYPES as WEB_SEARCH_TYPES
from gateway.ops.budget import Lease
from gateway.ops.config import Config, find_route
from gateway.tenancy.clients import ANONYMOUS_CLIENT, Client
from gateway.text import jsonutil
from gateway.text.json_items import ArrayItems, NotPlain

__all__ = [
    "BATCH_BUSY",
    "MAX_BATCH_VALUES",
    "PARSE_SLICE",
    "PARSE_SLICE_BYTES",
    "CreateParser",
    "RequestReader",
    "parse_body",
    "parse_create",
    "parse_create_async",
]

_CUSTOM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
# values a batch body may decode to (each request's params are a few dozen): bounds the
# Python objects a 256 MB body builds
MAX_BATCH_VALUES = 1 << 23

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


async def parse_create_async(
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


async def parse_body(
    request: web.Request, cfg: Config, raw: bytearray, lease: Lease
) -> list[tuple[str, str, bytes]]:
    """The create's requests, each read from the body alone (:class:`ArrayItems`) and
    counted in ``lease`` as it is encoded; a body of another shape is decoded whole, as
    it always was, and answered as it always was."""
    held = lease.held
    exchange = request.get(EXCHANGE)  # set by the middleware
    client = exchange.client if exchange is not None else ANONYMOUS_CLIENT
    try:
        items = ArrayItems(
            raw, "requests", max_values=MAX_BATCH_VALUES, max_item_values=jsonutil.MAX_VALUES
        )
        return await _parse_items(cfg, items, lease, client)
    except NotPlain:
        lease.give(lease.held - held)  # what was parsed is dropped
    body = await decode_json(request, raw, MAX_BATCH_VALUES)
    return await parse_create_async(cfg, body, client)


async def _parse_items(
    cfg: Config, items: ArrayItems, lease: Lease, client: Client = ANONYMOUS_CLIENT
) -> list[tuple[str, str, bytes]]:
    """:func:`parse_create_async` of the body's items, one at a time, giving the event loop a
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
