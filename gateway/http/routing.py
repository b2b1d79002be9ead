"""Model routing shared by every API: a client's model name to its route (:func:`resolve`),
noted on the request for the access line and metrics. The upstream call itself is
:func:`gateway.upstream.send.send`.

The concurrency gate is :mod:`gateway.http.admission`, the SIGTERM drain of live streams
:mod:`gateway.http.drain`, a stream's lifecycle :mod:`gateway.http.streaming`.
"""

from __future__ import annotations

from gateway import errors
from gateway.http.keys import Exchange
from gateway.ops.config import ModelRoute, find_route


def resolve(exchange: Exchange, model: object, *, openai: bool = False) -> ModelRoute:
    """The route for a client's model name (exact, else a ``*`` pattern); unknown -> 404,
    outside the client's ``models`` list -> 403 ``permission_error``."""
    app = exchange.app
    route = find_route(app.config.models, model) if isinstance(model, str) else None
    if route is None:
        app.metrics.rejected.labels(exchange.api, "unknown_model").inc()
        shown = errors.echo(model, 256)  # client input, echoed back: short, encodable
        if openai:
            raise errors.NotFound(f"The model `{shown}` does not exist")
        raise errors.NotFound(f"model: {shown}")
    if not exchange.client.may_use(model, route.name):  # type: ignore[arg-type]
        app.metrics.rejected.labels(exchange.api, "model_denied").inc()
        shown = errors.echo(model, 256)
        raise errors.PermissionDenied(f"This API key may not use the model {shown}")
    exchange.model = route.name
    exchange.upstream = route.upstream.name
    return route
