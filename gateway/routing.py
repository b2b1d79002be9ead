"""Model routing and the per-model concurrency gate shared by every API."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from gateway import errors
from gateway.appkeys import (
    API,
    CONFIG,
    METRICS,
    MODEL,
    REQUEST_ID,
    SECRETS,
    STATE,
    UPSTREAM,
    UPSTREAMS,
)
from gateway.config import ModelRoute, find_route
from gateway.upstream import UpstreamClient, UpstreamResponse


def resolve(request: web.Request, model: object, *, openai: bool = False) -> ModelRoute:
    """The route for a client's model name (exact, else a ``*`` pattern); unknown -> 404."""
    route = find_route(request.app[CONFIG].models, model) if isinstance(model, str) else None
    if route is None:
        request.app[METRICS].rejected.labels(request[API], "unknown_model").inc()
        shown = errors.echo(model, 256)  # client input, echoed back: short, encodable
        if openai:
            raise errors.NotFound(f"The model `{shown}` does not exist")
        raise errors.NotFound(f"model: {shown}")
    request[MODEL] = route.name
    request[UPSTREAM] = route.upstream.name
    return route


def client_for(request: web.Request, route: ModelRoute) -> UpstreamClient:
    return request.app[UPSTREAMS][route.upstream.name]


class admitted:
    """Count the request against the model's max_concurrency; past it, 529 with retry-after.

    A plain class, not a generator context manager: it runs on every request.
    """

    __slots__ = ("_in_flight", "_name")

    def __init__(self, request: web.Request, route: ModelRoute) -> None:
        in_flight = request.app[STATE].in_flight
        now = in_flight.get(route.name, 0)
        if route.max_concurrency and now >= route.max_concurrency:
            request.app[METRICS].rejected.labels(request[API], "overloaded").inc()
            raise errors.Overloaded(retry_after=1)
        in_flight[route.name] = now + 1
        self._in_flight = in_flight
        self._name = route.name

    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        self._in_flight[self._name] -= 1


async def send(
    request: web.Request,
    route: ModelRoute,
    client: UpstreamClient,
    path: str,
    payload: bytes,
    *,
    stream: bool,
    max_tokens: int | None = None,
    at_root: bool = False,
) -> UpstreamResponse:
    """Call the upstream, counting the outcome per model and upstream.

    An error reply is mapped again with every upstream's secrets (the client knows at
    most its own; one upstream's error may quote another's key behind a shared proxy).
    """
    metrics = request.app[METRICS]
    t = time.perf_counter()
    try:
        up = await client.request(path, payload, stream=stream, max_tokens=max_tokens,
                                  at_root=at_root, request_id=request.get(REQUEST_ID))
    except errors.UpstreamTimeout:
        metrics.upstream_requests.labels(route.name, client.name, "timeout").inc()
        raise
    except errors.UpstreamUnavailable:
        metrics.upstream_requests.labels(route.name, client.name, "connect_error").inc()
        raise
    except errors.GatewayError as err:
        metrics.upstream_requests.labels(route.name, client.name,
                                         str(getattr(err, "upstream_status", err.status))).inc()
        scrubbed = errors.rescrub(err, hosts=client.hosts, secrets=request.app[SECRETS])
        if scrubbed is err:
            raise
        raise scrubbed from None
    metrics.upstream_requests.labels(route.name, client.name, str(up.status)).inc()
    metrics.upstream_headers.labels(route.name, client.name).observe(time.perf_counter() - t)
    return up


class DrainHandle:
    """Lets a draining server end a stream with the failure envelope (see __main__)."""

    __slots__ = ("draining", "task")

    def __init__(self) -> None:
        self.task = asyncio.current_task()
        self.draining = False

    def drain(self) -> None:
        self.draining = True
        if self.task is not None:
            self.task.cancel("draining")


@contextmanager
def drainable(request: web.Request) -> Iterator[DrainHandle]:
    """Register the current stream so a SIGTERM drain can end it after the grace period."""
    handle = DrainHandle()
    streams = request.app[STATE].streams
    streams.add(handle)
    try:
        yield handle
    finally:
        streams.discard(handle)


DRAINING_MESSAGE = "Overloaded: the gateway is shutting down"


def stream_failure(exc: BaseException, handle: DrainHandle
                   ) -> tuple[errors.GatewayError, str] | None:
    """How an exception met while relaying a stream ends it, for both APIs.

    (the error its envelope carries, the termination reason), or None when the
    exception must propagate (a real cancellation: the client left).
    """
    if isinstance(exc, errors.UpstreamTimeout):
        return exc, "idle_timeout"
    if isinstance(exc, errors.GatewayError):
        return exc, "upstream_error"
    if isinstance(exc, ValueError):  # an SSE event past the decoder's size guard
        return errors.StreamProcessingError(), "malformed_chunk"
    if isinstance(exc, asyncio.CancelledError) and handle.draining:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()  # the drain's cancel only ends this stream, not the handler
        return errors.Overloaded(DRAINING_MESSAGE), "draining"
    return None
