"""The clients' limits in the HTTP layer: a request of a client with limits is charged
(:func:`admit`) before its upstream is called, its answer carries the ``anthropic-ratelimit-*``
headers (:func:`charged`), and its reply's usage settles the charge (:func:`settle`, called
from the Messages reply's ``Figures.on_end``: gateway/http/tenancy.py). The arithmetic is
gateway/tenancy/limits.py.

An error answered before the charge (a 400 of validation, a 403 or 404 of routing, a
concurrency refusal) carries the meters' standing too (:func:`standing`, one take of
nothing), so that every answer of a client with limits reports them.

A request of a client without limits (``Client.metered`` False, every request of a gateway
without ``[[clients]]``) reads that one attribute and nothing else happens.

A store that fails (``CountersUnavailable``: Redis down or slow) is ``[limits]
on_store_error``'s: ``open`` lets the request through uncounted, ``closed`` refuses it with
529 ``overloaded_error`` and ``retry-after`` (metric reason ``limits_unavailable``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway import errors
from gateway.http.keys import COUNTERS, STATE, Exchange
from gateway.messages.from_chat.figures import Figures
from gateway.tenancy import limits
from gateway.tenancy.counters import CountersUnavailable
from gateway.text import ids

__all__ = ["admit", "batch_spender", "charged", "settle", "standing"]

UNAVAILABLE_MESSAGE = "Overloaded: the rate limit counters are unavailable; retry shortly"
# a concurrency lease's name: this process's random prefix and a sequence (unique across
# the replicas sharing a store, without a random draw per request)
_LEASES = ids.b62(12) + ":"
_SEQUENCE = itertools.count()


async def admit(exchange: Exchange, body_bytes: int, max_tokens: int) -> limits.Charge | None:
    """Charge the request to its client (``exchange.client.metered``); None when the store
    failed and ``on_store_error`` is ``open``. Raises the 429 (or the 529) to answer. The
    charge is kept as the exchange's (``exchange.charge``)."""
    app = exchange.app
    plan = limits.Plan.of(exchange.client)
    counters = app.counters
    assert counters is not None  # the API application's
    try:
        charge = await limits.admit(
            counters,
            plan,
            limits.input_estimate(body_bytes),
            max_tokens,
            lease=f"{_LEASES}{next(_SEQUENCE)}",
        )
    except errors.RateLimited:
        app.metrics.rejected.labels(exchange.api, "rate_limited").inc()
        raise
    except errors.BudgetSpent:
        app.metrics.rejected.labels(exchange.api, "budget_spent").inc()
        raise
    except CountersUnavailable:
        if app.config.limits.on_store_error == "closed":
            app.metrics.rejected.labels(exchange.api, "limits_unavailable").inc()
            raise errors.Overloaded(UNAVAILABLE_MESSAGE, retry_after=1) from None
        return None
    exchange.charge = charge
    return charge


async def charged(
    charge: limits.Charge, answer: Awaitable[web.StreamResponse]
) -> web.StreamResponse:
    """``answer`` with the charge's headers (an error's too), the charge settled and its
    lease returned when it is done. A stream must have put the headers on before its first
    byte (``charge.headers``)."""
    try:
        response = await answer
    except errors.GatewayError as err:
        if err.extra_headers is None:
            err.extra_headers = charge.error_headers
        raise
    finally:
        await charge.close()
    if not response.prepared:
        response.headers.update(charge.headers)
    return response


async def standing(exchange: Exchange, err: errors.GatewayError) -> None:
    """A client error answered before the charge (``err``, 4xx, without headers of its
    own) gets the limits' headers of the client's meters as they stand; nothing when the
    client has no rate limit or the store fails."""
    client = exchange.client
    counters = exchange.app.counters
    if not client.limited or err.extra_headers or not 400 <= err.status < 500:
        return
    if counters is None:
        return
    try:
        err.extra_headers = await limits.standing(counters, limits.Plan.of(client))
    except CountersUnavailable:
        pass


def settle(exchange: Exchange) -> Callable[[Figures], None] | None:
    """What a Messages reply's ``Figures.on_end`` calls for this request's charge; None: the
    request has none."""
    charge = exchange.charge
    if charge is None:
        return None

    def ended(figures: Figures) -> None:
        charge.ended(figures.usage)

    return ended


def batch_spender(app: web.Application) -> Callable[[str, tuple[int, int]], Awaitable[None]]:
    """The batch scheduler's hook: a batch request's tokens, spent from its owner's token
    meters (``Tenants.by_owner``) after it ran; never a refusal."""

    async def spend(owner: str, usage: tuple[int, int]) -> None:
        client = app[STATE].tenants.by_owner(owner)
        if not client.limited:
            return
        try:
            await limits.spend(app[COUNTERS], limits.Plan.of(client), usage, time.time())
        except CountersUnavailable:
            pass

    return spend
