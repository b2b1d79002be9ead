"""Running batch requests on the capacity interactive traffic leaves free.

One scheduler per gateway process; every process (``--workers``, replicas sharing one
PostgreSQL) claims work from the shared store, each request exactly once
(:meth:`BatchStore.claim`), under a lease this process renews while the request runs. A
process that dies stops renewing: its requests are claimed again once their lease lapses
(a request in flight is run again; one whose result was committed never is).

Interactive first, per upstream: at most ``batches.max_in_flight`` batch requests run on an
upstream at once (from this process), and new ones start only while fewer than
``batches.interactive_threshold`` interactive requests are in flight on it (a Messages or
pass-through request counted by :mod:`gateway.http.admission`). A running batch request is not
stopped when interactive traffic arrives; it is simply not followed by another. Work held
back this way is looked at again as soon as an interactive request on that upstream ends
(``AppState.on_request_end``), not only at the next poll. An upstream no interactive request
has used for ``batches.idle_after`` seconds takes up to ``batches.max_in_flight_idle`` batch
requests (when set above ``max_in_flight``): set to the server's slots, a batch fills an idle
server; the first interactive request after the idle spell may then wait for a slot (one
batch request's time), and no new batch request starts beyond ``max_in_flight`` until the
upstream has been idle again that long.

A batch request is a buffered Messages call (:mod:`gateway.messages.call`), the one an
interactive request makes, through the same upstream call (counted the same way). Its
outcome follows the interactive error model: a connect failure, a timeout, 408, 429 and
5xx are retried with a growing delay (2 s doubling to 5 minutes) until the batch expires;
any other error is the request's ``errored`` result, with the error envelope the
interactive route would have answered. Each run writes one access line (``route``
``batch_request``, with ``batch_id`` and ``custom_id``).

Waiting costs little: once an upstream's claim comes back short, the scheduler asks the
store when its next request is due (:meth:`BatchStore.next_due`: the end of a back-off, or
of a lease) and sleeps until then (at most ``_LOOK_ACROSS`` seconds, so work another process
queued on a shared database is not left waiting), or until a wake (a batch created here, a
batch request ending, an interactive request ending while work is held back): 150 batches in
back-off cost two queries per upstream every five seconds, not one per batch per poll. With
nothing queued at all it looks once per ``batches.poll_interval`` (one query), as other
processes (``--workers``, replicas on one PostgreSQL) may queue work at any time. An
upstream that cannot start work (at its limit, or held back for interactive traffic) sets no
deadline at all: the wake that frees it (a batch request ending, the interactive request
ending) brings the next round, so the scheduler's one timer is the earliest real deadline
and a round never repeats on a deadline already past.

Every ``_SWEEP`` seconds (or a tenth of ``batches.expire_after``, at least a second, when
that is shorter) the scheduler also ends expired batches (their unfinished requests
``expired``), deletes batches ended longer ago than ``batches.retention_days``, and
refreshes the queue and batch gauges from the store.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import socket
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from gateway import errors
from gateway.batches.store import BatchStore, Claimed, StoreError
from gateway.messages.call import prepare
from gateway.messages.deps import MessagesDeps
from gateway.messages.from_chat.figures import Figures
from gateway.messages.reply import Reply
from gateway.messages.request.validate import validate_messages
from gateway.ops import log
from gateway.ops.config import ModelRoute, find_route
from gateway.ops.config_schema import BatchesConfig
from gateway.text import ids, jsonutil

_log = structlog.get_logger("gateway.batches")

_SWEEP = 30.0  # seconds between expiry, retention and gauge sweeps
_LOOK_ACROSS = 5.0  # seconds between looks for other processes' work while ours backs off
_BACKOFF = (2.0, 300.0)  # first retry delay, longest
_RETRY_STATUSES = frozenset({408, 429})


def retryable(err: errors.GatewayError) -> bool:
    if isinstance(err, errors.UpstreamUnavailable | errors.UpstreamTimeout):
        return True
    status = err.upstream_status or err.status
    return status >= 500 or status in _RETRY_STATUSES


def backoff(attempts: int) -> float:
    first, longest = _BACKOFF
    delay = min(longest, first * 2 ** max(0, attempts - 1))
    return delay * random.uniform(0.8, 1.2)


class Scheduler:
    def __init__(
        self,
        cfg: BatchesConfig,
        deps: MessagesDeps,
        store: BatchStore,
        *,
        routes: Mapping[str, ModelRoute],
        in_flight: Mapping[str, int],
        draining: Callable[[], bool],
        reply_ended: Callable[[str], Callable[[Figures], None] | None] | None = None,
        spend: Callable[[str, tuple[int, int]], Awaitable[None]] | None = None,
    ) -> None:
        """``routes``: the configured models; ``in_flight``: interactive requests now per
        model (kept by the HTTP shell's admission); ``draining``: whether the process is
        shutting down (no new work is claimed then); ``reply_ended``: a batch owner -> its
        requests' ``Figures.on_end`` (their usage recorded against the owner's client);
        ``spend``: given a batch's owner and a request's (input, output) tokens once it ran,
        takes them from the owner's limits."""
        self._reply_ended = reply_ended
        self._deps = deps
        self._spend = spend
        self._store = store
        self._cfg = cfg
        self._models = routes
        self._in_flight = in_flight
        self._draining = draining
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{ids.b62(8)}"
        # upstream name -> the route names that go to it
        by_upstream: dict[str, list[str]] = defaultdict(list)
        for route in routes.values():
            by_upstream[route.upstream.name].append(route.name)
        self._routes = dict(by_upstream)
        self._upstream_of = {route: up for up, routes in self._routes.items() for route in routes}
        self._deferred: set[str] = set()  # upstreams whose batch work waits for interactive
        # whether the upstream may have batch work queued (its last claim was filled)
        self._has_work = dict.fromkeys(self._routes, True)
        # when each upstream last had an interactive request (monotonic; start counts as one)
        self._last_interactive = dict.fromkeys(self._routes, time.monotonic())
        self._running: dict[str, int] = dict.fromkeys(self._routes, 0)
        self._leases: dict[tuple[str, int], str] = {}  # (batch id, idx) -> upstream
        self._tasks: set[asyncio.Task[None]] = set()
        # upstreams whose last claim was short: when their next request is due (epoch
        # seconds; inf: none queued); no look at them before then unless woken
        self._due = dict.fromkeys(self._routes, 0.0)
        self._wake = asyncio.Event()
        self._last_sweep = 0.0
        self._last_failure = 0.0
        self._stopping = False

    def wake(self) -> None:
        """Look for work now (a batch was created, or a request ended)."""
        for upstream in self._has_work:
            self._has_work[upstream] = True
        self._wake.set()

    def interactive_ended(self, route: str) -> None:
        """An interactive request of ``route`` ended (``AppState.on_request_end``): if batch
        work was held back on its upstream and the upstream is now under the threshold,
        look again at once rather than at the next poll."""
        upstream = self._upstream_of.get(route)
        if upstream is not None:
            self._last_interactive[upstream] = time.monotonic()
        if (
            upstream in self._deferred
            and self._interactive(self._routes[upstream]) < self._cfg.interactive_threshold
        ):
            self._wake.set()

    # --- the loop ----------------------------------------------------------------------

    async def run(self) -> None:
        heartbeat = asyncio.create_task(self._heartbeat())
        try:
            while not self._stopping:
                self._wake.clear()  # before the round: a wake during it starts another
                try:
                    await self._round()
                except StoreError as exc:
                    self._store_failed(exc)
                try:
                    await asyncio.wait_for(self._wake.wait(), self._sleep(time.time()))
                except TimeoutError:
                    pass
        finally:
            heartbeat.cancel()

    def _sleep(self, now: float) -> float:
        """Seconds until the next round is needed without a wake: the earliest of the next
        sweep and each upstream's own deadline (:meth:`_deadline`). One timer: the wait on
        the wake event is bounded by it."""
        until = self._last_sweep + self._sweep_every()
        if not self._draining():
            clock = time.monotonic()
            for upstream in self._routes:
                until = min(until, self._deadline(upstream, now, clock))
        return max(0.0, until - now)

    def _deadline(self, upstream: str, now: float, clock: float) -> float:
        """When ``upstream`` needs a round that no wake brings (epoch seconds; inf: never).

        An upstream that cannot start work now has no deadline of its own: at its limit, a
        batch request ending wakes the scheduler; at the interactive threshold, it is held
        back (``_deferred``) and the interactive request ending wakes it. Giving such an
        upstream the deadline it had (a due request, a poll) made every round find it still
        blocked and the deadline still past: a busy loop for as long as one interactive
        request was in flight (a 6 s stream cost the gateway 5 CPU seconds). Otherwise: its
        next due request (or look for other processes' work) once its claim came back short;
        at its limit, the moment it turns idle and takes ``max_in_flight_idle``."""
        cfg = self._cfg
        limit = self._limit(upstream, clock)
        if self._running[upstream] >= limit:
            if limit < cfg.max_in_flight_idle:  # it may turn idle and take more
                return now + max(0.0, self._last_interactive[upstream] + cfg.idle_after - clock)
            return math.inf
        if self._interactive(self._routes[upstream]) >= cfg.interactive_threshold:
            # held back (deferred): the interactive request ending wakes it; work not yet
            # due gets one round when it is (which holds it back)
            if self._has_work[upstream] or upstream in self._deferred:
                return math.inf
            return self._due[upstream]
        # work queued and room for it: only after a round that failed (the store down, or
        # the first round) is this not already running; look again at the next poll
        return now + cfg.poll_interval if self._has_work[upstream] else self._due[upstream]

    def _sweep_every(self) -> float:
        return min(_SWEEP, max(1.0, self._cfg.expire_after / 10))

    async def stop(self) -> None:
        """Stop claiming; requests in flight are cancelled and handed back at once, for
        another process (or this one after a restart) to run again; a process that dies
        instead leaves them to their lease."""
        self._stopping = True
        self._wake.set()
        held = list(self._leases)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        now = time.time()
        for batch_id, idx in held:
            try:
                await self._store.release(self.worker, batch_id, idx, now)
            except StoreError as exc:
                self._store_failed(exc)
                break

    async def _round(self) -> None:
        now = time.time()
        if now - self._last_sweep >= self._sweep_every():
            self._last_sweep = now
            await self._sweep(now)
            # look at every upstream once a sweep: work another process queued or dropped
            for upstream in self._due:
                self._due[upstream] = 0.0
        if self._draining():
            return
        clock = time.monotonic()
        for upstream, routes in self._routes.items():
            interactive = self._interactive(routes)
            if interactive:
                self._last_interactive[upstream] = clock
            free = self._limit(upstream, clock) - self._running[upstream]
            if free <= 0:
                continue
            if interactive >= self._cfg.interactive_threshold:
                if self._has_work[upstream] or now >= self._due[upstream]:
                    self._deferred.add(upstream)  # look again when one of them ends
                continue
            self._deferred.discard(upstream)
            if not self._has_work[upstream] and now < self._due[upstream]:
                continue  # nothing due here yet (all of it in back-off, or none queued)
            claimed = await self._store.claim(self.worker, routes, free, now, self._cfg.lease)
            # fewer than asked for: nothing more is due, and an interactive request ending
            # needs no look until a batch is created here or the next request falls due
            self._has_work[upstream] = len(claimed) >= free
            if not self._has_work[upstream]:
                due = await self._store.next_due(routes, now)
                # never sooner than a poll: a due request the claim could not take (another
                # process holds its row) must not make this a busy loop
                # nothing queued: look again at the next poll (another process, --workers or
                # a replica on the same database, may queue work; one query a poll); work
                # in back-off: sleep until it is due, looking across processes every
                # _LOOK_ACROSS seconds at least
                poll = self._cfg.poll_interval
                self._due[upstream] = (
                    now + poll
                    if due is None
                    else min(max(due, now + poll), now + max(_LOOK_ACROSS, poll))
                )
            for item in claimed:
                self._start(upstream, item)

    def _limit(self, upstream: str, clock: float) -> int:
        """``max_in_flight``, or ``max_in_flight_idle`` once the upstream has had no
        interactive request for ``idle_after`` seconds."""
        cfg = self._cfg
        if (
            cfg.max_in_flight_idle > cfg.max_in_flight
            and clock - self._last_interactive[upstream] >= cfg.idle_after
        ):
            return cfg.max_in_flight_idle
        return cfg.max_in_flight

    def _interactive(self, routes: list[str]) -> int:
        in_flight = self._in_flight
        return sum(in_flight.get(name, 0) for name in routes)

    async def _sweep(self, now: float) -> None:
        store = self._store
        ended = await store.expire(now)
        if ended:
            _log.info("batches_expired", batches=ended)
        purged = await store.purge(now, self._cfg.retention_days * 86400.0)
        if purged:
            _log.info("batches_purged", batches=purged)
        stats = await store.stats()
        metrics = self._deps.metrics
        for status, count in stats.get("batches", {}).items():
            metrics.batches.labels(status).set(count)
        queued = stats.get("queued", {})
        for route in self._models:
            metrics.batch_queue.labels(route).set(queued.get(route, 0))

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self._cfg.lease / 3)
            if not self._leases:
                continue
            try:
                await self._store.renew(
                    self.worker, list(self._leases), time.time() + self._cfg.lease
                )
            except StoreError as exc:
                self._store_failed(exc)

    def _store_failed(self, exc: StoreError) -> None:
        now = time.monotonic()
        if now - self._last_failure >= 10.0:  # one warning per 10 s while the store is down
            self._last_failure = now
            _log.warning("batch_store_unavailable", detail=str(exc))

    # --- one request -------------------------------------------------------------------

    def _start(self, upstream: str, item: Claimed) -> None:
        self._running[upstream] += 1
        self._leases[(item.batch_id, item.idx)] = upstream
        self._deps.metrics.batch_in_flight.labels(upstream).inc()
        task = asyncio.create_task(self._run_one(upstream, item))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_one(self, upstream: str, item: Claimed) -> None:
        metrics = self._deps.metrics
        request_id = ids.new_request_id()
        t0 = time.perf_counter()
        status = 200
        error: errors.GatewayError | None = None
        route_name = item.model
        try:
            result: dict[str, Any]
            try:
                message, route_name = await self._call(item, request_id)
                result = {"type": "succeeded", "message": message}
            except errors.GatewayError as err:
                error = err
                status = err.status
                if retryable(err):
                    retry_at = time.time() + backoff(item.attempts)
                    await self._store.release(self.worker, item.batch_id, item.idx, retry_at)
                    self._due[upstream] = min(self._due[upstream], retry_at)
                    metrics.batch_requests.labels(route_name, "retried").inc()
                    return
                inner: dict[str, Any] = {"type": err.error_type, "message": err.message}
                if err.details is not None:
                    inner["details"] = err.details
                result = {
                    "type": "errored",
                    "error": {"type": "error", "error": inner, "request_id": request_id},
                }
            kind: str = result["type"]
            committed = await self._store.finish(
                self.worker, item.batch_id, item.idx, kind, jsonutil.dumpb(result), time.time()
            )
            metrics.batch_requests.labels(route_name, kind if committed else "superseded").inc()
        except StoreError as exc:  # the lease lapses: the request runs again later
            self._store_failed(exc)
        except asyncio.CancelledError:
            status, error = 499, None  # stopped with the process: handed back, run again
            raise
        except Exception:
            _log.exception("batch_request_failed", batch_id=item.batch_id, custom_id=item.custom_id)
        finally:
            self._running[upstream] -= 1
            self._leases.pop((item.batch_id, item.idx), None)
            metrics.batch_in_flight.labels(upstream).dec()
            self._access(
                item, route_name, upstream, request_id, status, error, time.perf_counter() - t0
            )
            self._wake.set()

    async def _call(self, item: Claimed, request_id: str) -> tuple[dict[str, Any], str]:
        """Run one batch request: (its message, its route's name); failures raise. The same
        Messages call an interactive request makes (:mod:`gateway.messages.call`)."""
        req = validate_messages(jsonutil.loads(item.params))
        route = find_route(self._models, req["model"])
        if route is None:  # the config changed since the batch was created
            raise errors.NotFound(f"model: {errors.echo(req['model'], 256)}")
        with self._deps.memory.lease() as lease:  # restored reasoning, until the reply ends
            # the same reply as an interactive one, its figures (a fallback's, if one answered)
            # written once; not timed: no client waits on its overhead
            reply = Reply(
                await prepare(self._deps, req, route, lease), stream=False, request_id=request_id
            )
            if self._reply_ended is not None:
                reply.figures.on_end = self._reply_ended(item.owner)
            await reply.send()
            async with reply:
                message = await reply.buffered()
        usage = reply.figures.usage
        if self._spend is not None and usage is not None:
            await self._spend(item.owner, usage)
        return message, route.name

    def _access(
        self,
        item: Claimed,
        model: str,
        upstream: str,
        request_id: str,
        status: int,
        error: errors.GatewayError | None,
        duration: float,
    ) -> None:
        log.access(
            log.Access(
                request_id,
                "batch_request",
                status,
                model=model,
                upstream=upstream,
                duration_ms=round(duration * 1000, 3),
                error_type=error.error_type if error is not None else None,
                error=error.message if error is not None and error.status < 500 else None,
                extra={
                    "batch_id": item.batch_id,
                    "custom_id": item.custom_id,
                    "attempt": item.attempts,
                },
            )
        )
