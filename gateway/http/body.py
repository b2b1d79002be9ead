"""Reading a JSON request body, bounded in bytes, values and time, on every JSON route.

The body arrives in chunks, each counted as it comes against:

* ``server.max_body_bytes``: past it 413 ``request_too_large`` (the middleware refuses a
  ``Content-Length`` over it before a byte is read; a chunked or compressed body is
  measured here, as it decodes);
* ``server.max_decoding_bytes``: the bytes of every request body being received and
  decoded in this process at once. Past it 529 ``overloaded_error`` with ``retry-after``
  (503 on the pass-through), unless no other body holds any: a body of any size is taken
  alone. Only bytes that arrived count, so a client that declares 32 MiB and sends slowly
  holds what it sent, not what it declared.

Then, before decoding, :func:`gateway.text.jsonutil.too_many_values` (413: a body whose values
would build hundreds of MB of Python objects), and the strict decode (400 naming the
path of a lone surrogate, a NaN or an overflowing number, nesting past 128 levels).

A body past ``server.decode_offload_bytes`` (1 MiB) is counted and decoded in a child
process (:mod:`gateway.http.decoder`): ujson holds the GIL for the whole call, so a thread
would stop the loop as long (measured: a 186 ms gap for a 193 ms decode), while in the child
a 32 MiB prompt costs the loop the 7 ms of loading its ``marshal`` form instead of
0.3-0.5 s, and a body over the value bound costs it nothing. Smaller bodies decode on the
loop (a Claude Code request: 0.24 ms). The budget is released once the body is decoded;
what a valid request holds after that is its own, except the reasoning a Messages request
restores from signatures, which counts in the process-wide memory budget (which holds the
decoding budget) until its reply has ended (:mod:`gateway.ops.budget`).

:func:`read_bytes` reads a body undecoded into one buffer counted in the caller's lease (a
Message Batches create, whose requests are decoded one at a time).
"""

from __future__ import annotations

import marshal
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gateway import errors
from gateway.http.decoder import DECODER, Decoder
from gateway.http.keys import CONFIG, EXCHANGE, METRICS, Exchange
from gateway.ops.budget import Lease
from gateway.ops.config import Config
from gateway.ops.metrics import Metrics
from gateway.text import jsonutil

__all__ = ["decode_json", "read_bytes", "read_json"]

BUSY_MESSAGE = "Overloaded: too many large request bodies are being received at once; retry shortly"


async def read_json(
    request: web.Request,
    exchange: Exchange,
    *,
    max_bytes: int | None = None,
    max_values: int = jsonutil.MAX_VALUES,
    keep: list[bytes] | None = None,
) -> Any:
    """The request's body, decoded strictly; raises the error to answer instead.

    ``max_bytes`` (default ``server.max_body_bytes``) and ``max_values`` are the route's own
    bounds where it has larger ones (a message batch). The body's bytes are appended to
    ``keep`` when given (the pass-through forwards them rather than encode the body again)."""
    app = exchange.app
    config = app.config
    limit = config.server.max_body_bytes if max_bytes is None else max_bytes
    chunks: list[bytes] = []
    with app.state.decoding.lease() as held:  # this body's bytes, counted in the budget
        await _receive(request, held, limit, chunks.append, app.metrics, exchange.api)
        raw = b"".join(chunks)
        chunks.clear()
        if keep is not None:
            keep.append(raw)
        return await _decode(config, app.decoder, app.metrics, exchange.api, raw, max_values)


async def read_bytes(request: web.Request, lease: Lease, max_bytes: int) -> bytearray:
    """The request's body, undecoded, counted in ``lease`` (which the caller holds as long
    as it keeps the bytes); the same 413 and 529 as :func:`read_json`. One buffer grown in
    place (no list of chunks joined into a second copy)."""
    buf = bytearray()
    exchange = request[EXCHANGE]
    await _receive(request, lease, max_bytes, buf.extend, exchange.app.metrics, exchange.api)
    return buf


async def _receive(
    request: web.Request,
    held: Lease,
    limit: int,
    keep: Callable[[bytes], object],
    metrics: Metrics,
    api: str,
) -> None:
    while chunk := await request.content.readany():
        size = len(chunk)
        if held.held + size > limit:
            _reject(metrics, api, "body_too_large")
            raise errors.RequestTooLarge(f"Request exceeds the maximum size of {limit} bytes")
        if not held.take(size):
            _reject(metrics, api, "overloaded")
            raise errors.Overloaded(BUSY_MESSAGE)
        keep(chunk)


async def decode_json(request: web.Request, raw: bytes | bytearray, max_values: int) -> Any:
    """``raw`` decoded strictly (in the child past ``server.decode_offload_bytes``); raises
    the error to answer instead."""
    app = request.app
    exchange = request.get(EXCHANGE)
    api = exchange.api if exchange is not None else ""
    return await _decode(app[CONFIG], app.get(DECODER), app.get(METRICS), api, raw, max_values)


async def _decode(
    config: Config,
    decoder: Decoder | None,
    metrics: Metrics | None,
    api: str,
    raw: bytes | bytearray,
    max_values: int,
) -> Any:
    offload = config.server.decode_offload_bytes
    if offload and len(raw) > offload and decoder is not None:
        return await _decode_in_child(decoder, metrics, api, raw, max_values)
    if jsonutil.too_many_values(raw, max_values):
        _reject(metrics, api, "body_too_large")
        raise errors.RequestTooLarge(f"Request body holds more than {max_values} JSON values")
    try:
        return jsonutil.loads(raw)
    except jsonutil.JSONInputError as exc:
        raise errors.InvalidRequest(exc.path, exc.why) from None
    except ValueError:
        raise errors.InvalidRequest("", "request body is not valid JSON") from None


async def _decode_in_child(
    decoder: Decoder, metrics: Metrics | None, api: str, raw: bytes | bytearray, max_values: int
) -> Any:
    outcome = await decoder.decode(raw, max_values)
    del raw
    match outcome:
        case ("ok", bytes() as packed):
            return marshal.loads(packed)
        case ("too_many",):
            _reject(metrics, api, "body_too_large")
            raise errors.RequestTooLarge(f"Request body holds more than {max_values} JSON values")
        case ("invalid", str() as path, str() as why):
            raise errors.InvalidRequest(path, why)
    raise errors.InvalidRequest("", "request body is not valid JSON")


def _reject(metrics: Metrics | None, api: str, reason: str) -> None:
    if metrics is not None:
        metrics.rejected.labels(api, reason).inc()
