"""The per-model concurrency gate: ``max_concurrency`` requests of a model at once.

Past it, with ``queue_timeout`` 0 (the default), a request is refused before it goes
upstream: 529 ``overloaded_error`` with ``retry-after: 1`` (503 on the OpenAI
pass-through), counted in ``llm_gateway_rejected_requests_total{reason="overloaded"}``.
The count is per process (``AppState.in_flight``, read by the drain to wait for requests
to finish).

With ``queue_timeout`` > 0 it waits up to that long for a slot instead, in the model's
:class:`~gateway.tenancy.fair.FairQueue` (weighted fair order across clients, at most
``fair.DEFAULT_CAP`` waiting, past it 529 at once). A waiter is a future and nothing
else: a request that ends hands its slot to the next waiter (``in_flight`` does not go
down), so no request arriving meanwhile takes it and nothing polls. Past the deadline:
529 with ``retry-after`` (reason ``queue_timeout``).

A Messages stream still waiting after ``server.ping_interval`` opens its response (the
one :class:`~gateway.http.writer.StreamWriter`, which pings every ping_interval, as it
does while an upstream is silent: clients drop pings); the handler's stream then goes on
in that writer. Timed out after that, the stream ends with the reply's failure envelope
(the ``StreamTranslator``'s: ``message_start``, ``error`` overloaded_error,
``message_stop``); before it, the 529 is a plain JSON response.

A client that leaves cancels its handler (the runner's ``handler_cancellation``): its
waiter leaves the queue, and a slot handed to it in the meantime (the cancel arrives
after the hand-over and before the task resumes) goes on to the next waiter at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiohttp import web

from gateway import errors
from gateway.http.drain import DRAINING_MESSAGE, DrainHandle, drainable
from gateway.http.keys import Exchange
from gateway.http.writer import PING, StreamWriter
from gateway.ops.config import ModelRoute
from gateway.tenancy.fair import FairQueue, Waiter

_SSE = "text/event-stream; charset=utf-8"

# a waiting stream's failure envelope (the reply's source: gateway/http/streaming.py Source)
Fail = Callable[[errors.GatewayError], bytes]


class admitted:
    """Count the request against the model's max_concurrency: ``async with admitted(...)``.

    Past it: 529 with retry-after at once, or (``queue_timeout``) a wait in fair order.
    ``fail``: the request is a Messages stream, and this makes its failure envelope
    (it then gets pings while it waits, see the module docstring). A plain class, not a
    generator context manager: it runs on every request.
    """

    __slots__ = (
        "_exchange",
        "_fail",
        "_name",
        "_request",
        "_state",
        "_timeout",
        "_waiter",
        "writer",
    )

    def __init__(
        self,
        request: web.Request,
        exchange: Exchange,
        route: ModelRoute,
        fail: Fail | None = None,
    ) -> None:
        state = exchange.app.state
        in_flight = state.in_flight
        now = in_flight.get(route.name, 0)
        self._state = state
        self._request = request
        self._exchange = exchange
        self._name = route.name
        # the stream opened while waiting (the handler's stream goes on in it); None: not
        self.writer: StreamWriter | None = None
        self._waiter: Waiter[asyncio.Future[None]] | None = None
        if route.max_concurrency and now >= route.max_concurrency:
            if not route.queue_timeout:
                exchange.app.metrics.rejected.labels(exchange.api, "overloaded").inc()
                raise errors.Overloaded(retry_after=1)
            self._fail = fail
            self._timeout = route.queue_timeout
            self._join(route)
            return
        in_flight[route.name] = now + 1

    def _join(self, route: ModelRoute) -> None:
        exchange = self._exchange
        queue = self._state.queues.get(route.name)
        if queue is None:
            queue = self._state.queues[route.name] = FairQueue()
        client = exchange.client
        waiter = queue.join(client.name, client.weight, asyncio.get_running_loop().create_future())
        metrics = exchange.app.metrics
        if waiter is None:  # the queue is full
            metrics.rejected.labels(exchange.api, "overloaded").inc()
            raise errors.Overloaded(retry_after=1)
        self._waiter = waiter
        metrics.queue_length.labels(route.name).set(len(queue))

    async def __aenter__(self) -> admitted:
        if self._waiter is not None:
            await self._wait()
        return self

    async def __aexit__(self, *_: object) -> None:
        self._release()
        on_end = self._state.on_request_end
        if on_end is not None:
            on_end(self._name)

    def _release(self) -> None:
        """The slot goes to the next waiter, or back to the model."""
        queue = self._state.queues.get(self._name)
        if queue:  # someone waits: the slot is handed over, in_flight stays
            waiter = queue.next()
            while waiter is not None and waiter.item.done():
                waiter = queue.next()
            self._exchange.app.metrics.queue_length.labels(self._name).set(len(queue))
            if waiter is not None:
                waiter.item.set_result(None)
                return
        self._state.in_flight[self._name] -= 1

    async def _wait(self) -> None:
        waiter = self._waiter
        assert waiter is not None
        request = self._request
        exchange = self._exchange
        route_timeout = self._timeout
        server = exchange.app.config.server
        queue = self._state.queues[self._name]
        future = waiter.item
        t0 = time.monotonic()
        deadline = t0 + route_timeout
        handle: DrainHandle | None = None
        try:
            if self._fail is not None and server.ping_interval < route_timeout:
                await asyncio.wait((future,), timeout=server.ping_interval)
                if not future.done():
                    self.writer = await _open(
                        request, exchange, server.write_timeout, server.ping_interval
                    )
                    handle = drainable(request)
            if not future.done():
                await asyncio.wait((future,), timeout=max(deadline - time.monotonic(), 0.0))
        except BaseException as exc:
            if handle is not None and handle.draining and isinstance(exc, asyncio.CancelledError):
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()  # the drain's cancel ends this stream, not the handler
                self._leave(queue, "left")
                await self._end_stream(errors.Overloaded(DRAINING_MESSAGE))
                raise errors.Overloaded(DRAINING_MESSAGE) from None
            self._leave(queue, "left")
            raise
        finally:
            if handle is not None:
                handle.release()
        metrics = exchange.app.metrics
        waited = time.monotonic() - t0
        if not future.done():
            self._leave(queue, "timed_out")
            metrics.rejected.labels(exchange.api, "queue_timeout").inc()
            err = errors.Overloaded(retry_after=1)
            await self._end_stream(err)
            raise err
        self._waiter = None  # admitted: the slot was handed over
        metrics.queue_outcomes.labels(self._name, "admitted").inc()
        metrics.queue_wait.labels(self._name, exchange.client.name).observe(waited)

    def _leave(self, queue: FairQueue[asyncio.Future[None]], outcome: str) -> None:
        """Leave the queue; a slot handed over in the meantime goes on to the next."""
        waiter = self._waiter
        assert waiter is not None
        self._waiter = None
        metrics = self._exchange.app.metrics
        metrics.queue_outcomes.labels(self._name, outcome).inc()
        if waiter.item.done():  # handed a slot it will not use
            self._release()
            return
        waiter.item.cancel()
        queue.leave(waiter)
        metrics.queue_length.labels(self._name).set(len(queue))

    async def _end_stream(self, err: errors.GatewayError) -> None:
        """A stream opened while waiting ends with the failure envelope (the middleware
        renders nothing once a stream has begun)."""
        writer = self.writer
        if writer is None or self._fail is None:
            return
        writer.stop_pinging()
        try:
            await writer.write(self._fail(err))
        finally:
            await writer.close()

    async def failed(self, err: errors.GatewayError) -> None:
        """The call failed before its stream began: a stream opened while waiting ends
        with ``err``'s envelope (the caller then raises ``err``)."""
        await self._end_stream(err)


async def _open(
    request: web.Request, exchange: Exchange, write_timeout: float, ping_interval: float
) -> StreamWriter:
    charge = exchange.charge  # a limited client's: its ratelimit headers on the stream
    writer = await StreamWriter.open(
        request,
        content_type=_SSE,
        write_timeout=write_timeout,
        ping_interval=ping_interval,
        headers=None if charge is None else charge.headers,
    )
    await writer.write(PING)  # the stream has been silent for ping_interval already
    return writer
