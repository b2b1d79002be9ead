"""Model routing and the per-model concurrency gate shared by every API."""

from __future__ import annotations

import asyncio
import time

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
    Drainable,
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

    __slots__ = ("_streams", "draining", "task")

    def __init__(self, streams: set[Drainable]) -> None:
        self.task = asyncio.current_task()
        self.draining = False
        self._streams = streams

    def drain(self) -> None:
        self.draining = True
        if self.task is not None:
            self.task.cancel("draining")

    def release(self) -> None:
        """The stream ended: the drain has nothing more to end."""
        self._streams.discard(self)


def drainable(request: web.Request) -> DrainHandle:
    """Register the current stream so a SIGTERM drain can end it after the grace period;
    the stream calls ``release()`` when it ends."""
    streams = request.app[STATE].streams
    handle = DrainHandle(streams)
    streams.add(handle)
    return handle


DRAINING_MESSAGE = "Overloaded: the gateway is shutting down"
