"""The per-model concurrency gate: ``max_concurrency`` requests of a model at once.

Past it a request is refused before it goes upstream: 529 ``overloaded_error`` with
``retry-after: 1`` (503 on the OpenAI pass-through), counted in
``llm_gateway_rejected_requests_total{reason="overloaded"}``. The count is per process
(``AppState.in_flight``, read by the drain to wait for requests to finish).
"""

from __future__ import annotations

from aiohttp import web

from gateway import errors
from gateway.http.keys import API, METRICS, STATE
from gateway.ops.config import ModelRoute


class admitted:
    """Count the request against the model's max_concurrency; past it, 529 with retry-after.

    A plain class, not a generator context manager: it runs on every request.
    """

    __slots__ = ("_in_flight", "_name", "_on_end")

    def __init__(self, request: web.Request, route: ModelRoute) -> None:
        state = request.app[STATE]
        in_flight = state.in_flight
        now = in_flight.get(route.name, 0)
        if route.max_concurrency and now >= route.max_concurrency:
            request.app[METRICS].rejected.labels(request[API], "overloaded").inc()
            raise errors.Overloaded(retry_after=1)
        in_flight[route.name] = now + 1
        self._in_flight = in_flight
        self._name = route.name
        self._on_end = state.on_request_end

    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        self._in_flight[self._name] -= 1
        if self._on_end is not None:
            self._on_end(self._name)
