"""Model routing shared by every API: a client's model name to its route and upstream
client (:func:`resolve`, :func:`client_for`), and the upstream call counted per model and
upstream (:func:`send`).

The concurrency gate is :mod:`gateway.admission`, the SIGTERM drain of live streams
:mod:`gateway.drain`, a stream's lifecycle :mod:`gateway.streaming`.
"""

from __future__ import annotations

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
