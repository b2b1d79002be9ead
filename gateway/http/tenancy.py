"""What happens when a client's reply ends: its limits' charge settled (gateway/http/charges.py),
its usage recorded (the usage report's rows, gateway/http/usage_api.py) and counted in the
per-client metrics.

:func:`reply_ended` is a Messages reply's ``Figures.on_end`` (buffered, streamed, web
search rounds); :func:`batch_reply_ended` a batch request's, for the batch's owner;
:func:`record_passthrough` the OpenAI pass-through's. Each returns or does nothing when
there is nothing to do (no admin key configured, so no usage recorded, and no
``[[clients]]``, so no per-client series): a gateway without either pays nothing here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from gateway.http import charges, otel
from gateway.http.keys import METRICS, STATE, AppState, Exchange
from gateway.http.usage_api import USAGE, UsageRecorder
from gateway.messages.from_chat.figures import Figures
from gateway.ops.metrics import Metrics
from gateway.tenancy.clients import Client

__all__ = ["batch_reply_ended", "per_client", "record_passthrough", "reply_ended"]

# (model, uncached input, cache read, output, web searches)
Record = Callable[[str, int, int, int, int], None]


def per_client(state: AppState) -> bool:
    """Whether named clients are configured (the per-client series are counted then)."""
    return len(state.tenants.clients) > 1


def _record(
    recorder: UsageRecorder | None, metrics: Metrics, state: AppState, client: Client
) -> Record | None:
    metrics_or_none = metrics if per_client(state) else None
    if recorder is None and metrics_or_none is None:
        return None
    name = client.name

    def record(model: str, uncached: int, cache_read: int, output: int, searches: int) -> None:
        if recorder is not None:
            recorder.add(name, model, uncached, cache_read, output, searches)
        if metrics_or_none is not None:
            tokens = metrics_or_none.client_tokens
            tokens.labels(name, model, "input").inc(uncached)
            tokens.labels(name, model, "output").inc(output)
            if cache_read:
                tokens.labels(name, model, "cache_read").inc(cache_read)

    return record


def _record_of(exchange: Exchange) -> Record | None:
    app = exchange.app
    return _record(app.usage, app.metrics, app.state, exchange.client)


def _on_end(record: Record | None) -> Callable[[Figures], None] | None:
    if record is None:
        return None

    def ended(figures: Figures) -> None:
        usage = figures.usage
        if usage is not None:
            cached = figures.cache_read
            record(figures.model, usage[0] - cached, cached, usage[1], figures.web_searches)

    return ended


def reply_ended(
    request: web.Request, exchange: Exchange, req: dict[str, Any] | None = None
) -> Callable[[Figures], None] | None:
    """The ``Figures.on_end`` of the request's Messages reply (its charge settled, its usage
    recorded, its span and GenAI metrics written when telemetry is on: ``req``, the
    validated request, gives the span its request params), or None when there is nothing
    to do."""
    app = exchange.app
    if (  # the usual request: nothing to settle, record or trace
        exchange.charge is None
        and app.usage is None
        and not app.telemetry
        and not per_client(app.state)
    ):
        return None
    ends = [
        end
        for end in (
            charges.settle(exchange),
            _on_end(_record_of(exchange)),
            otel.reply_ended(request, exchange, req)
            if req is not None and exchange.app.telemetry
            else None,
        )
        if end is not None
    ]
    if len(ends) < 2:
        return ends[0] if ends else None

    def every(figures: Figures) -> None:
        for end in ends:
            end(figures)

    return every


def batch_reply_ended(app: web.Application) -> Callable[[str], Callable[[Figures], None] | None]:
    """For the batch scheduler: a batch owner -> its requests' ``Figures.on_end``."""

    def ended(owner: str) -> Callable[[Figures], None] | None:
        state = app[STATE]
        client = state.tenants.by_owner(owner)
        return _on_end(_record(app.get(USAGE), app[METRICS], state, client))

    return ended


def record_passthrough(
    request: web.Request, exchange: Exchange, model: str, usage: tuple[int, int] | None
) -> None:
    """An OpenAI pass-through reply's (prompt, completion) tokens, as the upstream reported
    them (its prompt counted as uncached input: the pass-through does not read the cached
    part)."""
    if exchange.app.telemetry:
        otel.passthrough_ended(request, usage)
    if usage is None:
        return
    record = _record_of(exchange)
    if record is not None:
        record(model, usage[0], 0, usage[1], 0)
