"""UpstreamClient: the only place upstream connection errors and timeouts are caught.

One keep-alive pool per replica of the upstream (gateway/upstream/pool.py, opened and
closed by the app's cleanup_ctx; one replica per ``base_urls`` entry, or the one ``base_url``).
Which replica takes a request, and which are ejected, is gateway/upstream/replicas.py's call;
a request that fails before any byte of its reply on one replica (no connection, a reset
before the head, a 502/503/504/529) is sent to the next, up to ``Replicas.attempts`` replicas
and within the first attempt's head timeout: the caller sees one reply or one error. A
request that a second replica fails as the first did goes to no third: the failure is the
request's, and ejects no replica (``Replicas.failed``).

Every failure is mapped once, by :mod:`gateway.upstream.failures`, and logged
once (``upstream_failure``: upstream, phase, cause, request id; at most one line per
upstream and cause a second, the lines held back counted in the next):

* refused, reset or closed before any byte of the reply -> UpstreamUnavailable (529,
  retryable; no connection at all says "Upstream unreachable: <cause>"); retried once on
  the same replica when it is the only one (a reused connection the upstream had closed),
  else on the next replica (nothing has reached the client);
* no final head within ``header_timeout`` of the send (interim 1xx replies do not
  extend it), a buffered reply not whole within ``response_timeout``, a stream with no
  event for ``idle_timeout``, no pool slot within the head timeout -> UpstreamTimeout
  (504);
* a malformed, cut or oversized (``max_response_bytes``) reply -> UpstreamError 500
  ``api_error``: the same request would fail the same way, so it is not an overload;
* an HTTP error status -> errors.from_upstream (gateway/errors/upstream_map.py), the one
  map of an upstream's error, run here once with ``secrets`` (the app's redactor of every
  secret the process knows: gateway/upstream/known.py); at most ``errors.MAX_UPSTREAM_BODY``
  (64 KiB) of the body is read, and dropped once mapped: the error keeps its scrubbed
  message only.

A framing anomaly (gateway/upstream/connection.py) is also counted in
``llm_gateway_upstream_protocol_errors_total{upstream,kind}``, and the pool closes the
upstream's idle connections with it. A reply read on a reused connection that names another
request (or, where the echo is required, none) is one the client never sees: the request is
sent once more, on a fresh connection. Whether connections are reused at all is the pool's
:class:`~gateway.upstream.reuse.Reuse` (``llm_gateway_upstream_keepalive{upstream}``; each
change logged as ``upstream_keepalive``).

Every attempt (each replica tried, each send again on the same one) goes out with an
``X-Request-Id`` of its own, the gateway's (gateway/text/ids.py), whatever the client sent:
the echo proves a reply answers *this* attempt only if no other request carried the id.
The client's id is in the log lines (``request_id``), the attempt's beside it where the
upstream's reply broke the framing (``upstream_request_id``).

A response is used as an async context manager: leaving it early (client gone, stream
translated to its end, an error) *closes* the connection, so the upstream sees the
disconnect and stops generating; only a body read to its end goes back to the pool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import structlog

from gateway import errors
from gateway.errors import upstream_map
from gateway.ops.config import UpstreamConfig
from gateway.ops.telemetry import CURRENT, Telemetry
from gateway.text import ids
from gateway.text.redact import Redactor, secrets_of
from gateway.upstream import discovery
from gateway.upstream.exceptions import (
    BrokenResponse,
    ConnectFailed,
    Disconnected,
    HTTPClientError,
    PoolTimeout,
    ProtocolError,
)
from gateway.upstream.failures import _RETRIED, FailureLog, Failures, map_failure, unreachable
from gateway.upstream.members import Members
from gateway.upstream.pool import Counter, Pool, Response
from gateway.upstream.proof import BODY_PROOF, PROVABLE_PATH
from gateway.upstream.replicas import Replica, Replicas, request_digest

_log = structlog.get_logger("gateway.upstream")

# after [DONE]: how much more body, and how long, to wait for to keep the connection
_DRAIN_BYTES = 16 * 1024
_DRAIN_SECONDS = 0.1
# with other replicas to go to, only a connection the replica closed under us is retried on it
_RETRIED_HERE = frozenset(("closed", "misrouted"))
# statuses that say "not now, here": the request goes to the next replica (before any byte)
_RETRY_STATUSES = frozenset((502, 503, 504, 529))
# of those, the ones that say the replica is busy: never the request's fault
_BUSY_STATUSES = frozenset((503, 529))


def _attempt_id() -> bytes:
    return ids.new_upstream_request_id().encode("ascii")


class UpstreamResponse:
    """A live upstream response; read it with :meth:`chunks` or :meth:`read`."""

    __slots__ = (
        "_cap",
        "_client",
        "_done",
        "_ending",
        "_lost",
        "_replica",
        "_request_id",
        "_resp",
        "_stream",
        "_trial",
        "progress",
        "status",
        "traced",
    )

    def __init__(
        self,
        resp: Response,
        client: UpstreamClient,
        *,
        stream: bool,
        request_id: str | None,
        replica: Replica | None = None,
        trial: bool = False,
        traced: tuple[Telemetry, Any, float] | None = None,
    ) -> None:
        self._resp = resp
        self.status: int = resp.status  # the reply's final head's (fixed once it is in)
        # the attempt's span (gateway/ops/telemetry.py), ended with the reply: None when off
        self.traced = traced
        self._replica = replica  # its in-flight count is ours until the response is left
        # sent to a replica that was out: it is back in only once this reply ends whole
        self._trial = trial
        self._client = client
        self._stream = stream
        self._request_id = request_id
        self._cap = client.max_response_bytes
        self._done = False
        self._ending = False
        self._lost = False  # the replica cut or reset the connection in the body
        # A stream's reader calls this when the bytes it read carried an event (an SSE
        # payload): the stream's idle_timeout restarts from those bytes. Blank lines,
        # comments and bare framing do not count, so a trickle of them cannot keep a
        # stream open forever.
        self.progress = resp.progress

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive; timeouts and cuts raise GatewayErrors.

        On a stream, call :attr:`progress` for bytes that carried an event, else the
        stream ends ``idle_timeout`` after its head whatever arrives.
        """
        readany = self._resp.readany
        with Failures(self._client.report, "body", self._request_id, self._stream):
            while True:
                try:
                    chunk = await readany()
                except BrokenResponse as exc:
                    self._lost = _lost(exc)
                    raise
                if not chunk:
                    self._done = True
                    return
                yield chunk

    def release_if_complete(self, *, ended: bool = False) -> None:
        """Mark the response reusable if its body has been read to the end.

        ``ended``: the upstream has said its stream is over (``[DONE]``), so the rest
        of its body (the chunked terminator, usually a separate write) is due at once;
        leaving the ``async with`` then waits a moment for it instead of closing a
        connection that could be reused.
        """
        if self._resp.at_eof:
            self._done = True
        elif ended:
            self._ending = True

    def abandon(self) -> None:
        """The engine cut this stream (a mid-stream continuation goes elsewhere): its replica
        is ejected now, as a lost connection would eject it, so the retry avoids it."""
        replica, self._replica = self._replica, None
        if replica is not None:
            self._client.members.finished(replica, errors.UpstreamUnavailable())

    def read_ready(self) -> bytes | None:
        """:meth:`read` without a wait (no coroutine): the whole body when it is all in
        already (it came with the head); None: await :meth:`read`."""
        try:
            body = self._resp.read_now(self._cap)
        except BaseException as exc:
            self._lost = _lost(exc)
            with Failures(self._client.report, "body", self._request_id, self._stream):
                raise
            raise  # not reached: the map raises whatever it is given
        if body is not None:
            self._done = True
        return body

    async def read(self) -> bytes:
        """The whole body; past the upstream's ``max_response_bytes``, a 500."""
        body = self.read_ready()
        if body is not None:
            return body
        try:
            body = await self._resp.read(cap=self._cap)
        except BaseException as exc:
            self._lost = _lost(exc)
            with Failures(self._client.report, "body", self._request_id, self._stream):
                raise
            raise  # not reached: the map raises whatever it is given
        self._done = True
        return body

    async def __aenter__(self) -> UpstreamResponse:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.leave(exc)

    def leave(self, exc: BaseException | None = None) -> None:
        """What leaving the ``async with`` does (``exc``: what it was left with), for a
        holder that leaves it from its own ``__aexit__`` (no coroutine of this one)."""
        traced, self.traced = self.traced, None
        if traced is not None:
            failed = "lost" if self._lost else type(exc).__name__ if exc is not None else None
            traced[0].upstream_ended(traced[1], traced[2], failed)
        replica, self._replica = self._replica, None
        if replica is not None:
            # a connection the replica lost in the body ejects it, as one lost before the head
            failure = errors.UpstreamUnavailable() if self._lost else exc
            self._client.members.finished(replica, failure)
            if self._trial and failure is None:
                self._client.replicas.succeeded(replica)
            elif self._trial:  # failed (ejected again, for longer), or nothing learnt
                replica.trial = False
        if self._done and exc is None:
            self._resp.release()
        elif self._ending and exc is None:
            # The client's reply is complete: wait for the body's end apart from this
            # handler, which may be cancelled the moment the client hangs up.
            task = asyncio.get_running_loop().create_task(_settle(self._resp))
            _SETTLING.add(task)
            task.add_done_callback(_SETTLING.discard)
        else:
            # Not read to the end: drop the connection so the upstream stops generating.
            self._resp.close()


_SETTLING: set[asyncio.Task[None]] = set()  # strong references to the tasks below


async def _settle(resp: Response) -> None:
    """Pool the connection if the rest of the body comes soon, else close it."""
    done = False
    try:
        done = await resp.drain(_DRAIN_BYTES, _DRAIN_SECONDS)
    finally:
        if done:
            resp.release()
        else:
            resp.close()


class UpstreamClient:
    """Pooled HTTP client for one upstream: a pool per replica.

    Its replicas, their pools, series, probes and DNS discovery are :attr:`members`
    (gateway/upstream/members.py); this class is the request path over them. ``hosts`` and
    ``secrets`` are what the scrubber removes from upstream text: every replica's host names
    and base URL, and the upstream's key in every form (the key, ``Bearer <key>``, the key
    URL-encoded). ``redactor`` is what an error reply is scrubbed with: the app's, of every
    secret the process knows (else this upstream's key alone). ``metrics``
    (gateway/ops/metrics.py), when given, gets the per-replica series; ``resolve`` replaces
    the system resolver under ``discover = "dns"``, for tests.
    """

    def __init__(
        self,
        cfg: UpstreamConfig,
        *,
        connections: Counter | None = None,
        protocol_errors: Any = None,
        keepalive: Any = None,
        metrics: Any = None,
        resolve: discovery.Resolve | None = None,
        secrets: Redactor | None = None,
    ) -> None:
        self.cfg = cfg
        self._connections = connections
        self._keepalive = keepalive  # a gauge's child: 1 while connections are reused
        self._protocol_errors = protocol_errors  # a labelled counter: (upstream, kind)
        self._metrics = metrics
        self.name = cfg.name
        self.secrets = secrets_of(cfg)
        self.redactor = secrets if secrets is not None else Redactor(self.secrets)
        self.report = FailureLog(cfg.name)
        # (head, body) timeouts. A stream: the head within both timeouts, then no event for
        # idle_timeout. Buffered: the head, then the whole reply, each due from the send.
        self._stream_timeouts = (min(cfg.header_timeout, cfg.idle_timeout), cfg.idle_timeout)
        self._buffered_timeouts = (
            min(cfg.header_timeout, cfg.response_timeout),
            cfg.response_timeout,
        )
        self.max_response_bytes = cfg.max_response_bytes
        self._headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        if cfg.api_key:
            self._headers["Authorization"] = f"Bearer {cfg.api_key}"
        self.members = Members(cfg, make_pool=self._pool, metrics=metrics, resolve=resolve)
        self.discover = self.members.discover
        # the members' replicas (made once with them; a plain attribute: read per request)
        self.replicas: Replicas = self.members.replicas

    @property
    def hosts(self) -> tuple[str, ...]:
        """Every replica's host names and base URL (those that joined by DNS too)."""
        return self.members.hosts

    @property
    def _retried_here(self) -> frozenset[str]:
        # with other replicas to go to, only a connection the replica closed under us is
        # retried on it
        return _RETRIED if len(self.members.replicas.all) == 1 else _RETRIED_HERE

    def _pool(self, replica: Replica, address: str | None = None) -> Pool:
        cfg = self.cfg
        return Pool(
            cfg.base_url if address else replica.base_url,
            limit=cfg.pool_size,
            connect_timeout=cfg.connect_timeout,
            extra_headers=self._headers,
            gauge=self._connections,
            keepalive=cfg.keepalive,
            on_protocol_error=self._protocol_error,
            on_keepalive=self._keepalive_changed,
            address=address,
            body_proof=BODY_PROOF.get(cfg.kind),
        )

    async def start(self) -> None:
        """Open a pool per replica (:meth:`Members.start`: under ``discover = "dns"`` the
        name resolved first, with ``health_interval`` one probe round)."""
        await self.members.start()
        if self._keepalive is not None:
            self._keepalive.set(1 if self.keepalive else 0)

    async def close(self) -> None:
        await self.members.close()

    @property
    def open_connections(self) -> int:
        return sum(pool.open_connections for pool in self.members.pools.values())

    def _keepalive_changed(self, on: bool) -> None:
        if self._keepalive is not None:
            self._keepalive.set(1 if self.keepalive else 0)
        _log.info("upstream_keepalive", upstream=self.name, on=on)

    @property
    def keepalive(self) -> bool:
        """Requests now reuse connections to this upstream (to any of its replicas)."""
        return any(pool.reuse.keepalive for pool in self.members.pools.values())

    def _protocol_error(
        self, kind: str, phase: str, request_id: str | None, upstream_id: str | None
    ) -> None:
        if self._protocol_errors is not None:
            self._protocol_errors.labels(self.name, kind).inc()
        if upstream_id is None:
            self.report(phase, "protocol_error", request_id, kind=kind)
        else:
            self.report(
                phase, "protocol_error", request_id, kind=kind, upstream_request_id=upstream_id
            )

    async def request(
        self,
        path: str,
        body: bytes,
        *,
        stream: bool,
        max_tokens: int | None = None,
        method: str = "POST",
        at_root: bool = False,
        request_id: str | None = None,
        session: str | None = None,
        model: str | None = None,
    ) -> UpstreamResponse:
        """Send and wait for a 2xx response's head; anything else raises a GatewayError.

        ``request_id`` (the client's) is for log lines only: each attempt goes upstream with
        an ``X-Request-Id`` of its own (module docstring).
        ``session`` (opaque) keeps a session's requests on one replica; None: the least
        busy one. A failure before the reply's head is sent to the next replica, at most
        ``replicas.attempts`` in all, within the head timeout of the first.
        With telemetry on, each attempt is a span (``model``: the upstream's, its name) whose
        context goes to the replica as ``traceparent``.
        """
        assert self.members.started_up, "UpstreamClient used before start()"
        head_timeout, body_timeout = self._stream_timeouts if stream else self._buffered_timeouts
        data = body if method == "POST" else None
        replicas = self.replicas
        order = replicas.order(session)
        attempts = order[: replicas.attempts]
        if not attempts:  # discover = "dns" and no address yet: nowhere to send it
            self.report("connect", "no_replicas", request_id)
            raise unreachable("no_replicas")
        # the later attempts' deadline (the first has all of it); the monotonic clock, as the
        # loop's: no get_running_loop (a getpid system call per request on CPython 3.11)
        deadline = time.monotonic() + head_timeout
        failing: _Failing | None = None  # made at the first failure
        telemetry = CURRENT.get()
        traced: tuple[Telemetry, Any, float] | None = None
        trace = b""
        for n, replica in enumerate(attempts):
            last = n == len(attempts) - 1
            remaining = deadline - time.monotonic() if n else head_timeout
            if n and remaining <= 0:
                break
            pool = self.members.pools.get(replica.index)
            if pool is None:  # it left (DNS) while an earlier attempt was out
                if last:
                    raise unreachable("no_replicas")
                continue
            paths = self.members.targets[replica.index]
            target = (paths[1] if at_root else paths[0]) + path
            trial = replica.failures > 0  # judged by its whole reply, not by its head
            self.members.started(replica)
            if telemetry is not None:
                span, trace = telemetry.upstream_span(
                    model, self.name, self.cfg.kind, replica.base_url, n
                )
                traced = (telemetry, span, time.perf_counter())
            provable = method == "POST" and path == PROVABLE_PATH
            try:
                try:  # the first send on this replica (see _send_again for the second)
                    resp = await pool.request(
                        method,
                        target,
                        data,
                        head_timeout=remaining,
                        body_timeout=body_timeout,
                        stream=stream,
                        request_id=ids.new_upstream_request_id().encode("ascii"),
                        log_id=request_id,
                        provable=provable,
                        headers=trace,
                    )
                except BaseException as first:
                    resp = await self._send_again(
                        first,
                        pool,
                        method,
                        target,
                        data,
                        head_timeout=remaining,
                        body_timeout=body_timeout,
                        stream=stream,
                        log_id=request_id,
                        provable=provable,
                        trace=trace,
                    )
            except BaseException as exc:
                self.members.finished(replica)
                mapped = map_failure(exc, "head", stream)
                if traced is not None:
                    traced[0].upstream_ended(
                        traced[1], traced[2], mapped[2] if mapped else "cancelled"
                    )
                if mapped is None:  # cancelled: nothing learnt about the replica
                    replica.trial = False
                    raise
                err, phase, cause = mapped
                if failing is None:
                    failing = _Failing(path, body)
                poison = cause != "pool_timeout" and failing.on(replicas, replica, phase)
                self.members.count(replica, _outcome(err))
                if not isinstance(exc, ProtocolError):  # the pool has logged that one
                    self.report(phase, cause, request_id, **self._where(replica))
                if last or poison or not _retryable(exc, phase):
                    raise err from None
                self._retried()
                continue
            if resp.status < 300:
                if not trial:
                    replicas.succeeded(replica)
                self.members.count(replica, "ok")
                return UpstreamResponse(
                    resp,
                    self,
                    stream=stream,
                    request_id=request_id,
                    replica=replica,
                    trial=trial,
                    traced=traced,
                )
            self.members.finished(replica)
            if traced is not None:
                traced[0].upstream_ended(traced[1], traced[2], str(resp.status))
            poison = False
            if resp.status >= 500:
                if failing is None:
                    failing = _Failing(path, body)
                poison = failing.on(replicas, replica, "head", resp.status)
                self.members.count(replica, "status_5xx")
            else:  # it answered: alive, whatever it thought of the request
                replicas.succeeded(replica)
                self.members.count(replica, "ok")
            if resp.status in _RETRY_STATUSES and not last and not poison:
                resp.close()
                self.report(
                    "head", "status", request_id, status=resp.status, **self._where(replica)
                )
                self._retried()
                continue
            raise await self._error_status(resp, request_id, max_tokens)
        raise errors.UpstreamTimeout()  # the time budget ran out between two attempts

    def _where(self, replica: Replica) -> dict[str, str]:
        """The replica's log field, where there is more than one."""
        return {"replica": replica.label} if len(self.members.pools) > 1 or self.discover else {}

    def _retried(self) -> None:
        if self._metrics is not None:
            self._metrics.upstream_retries.labels(self.name).inc()

    async def _send_again(
        self,
        first: BaseException,
        pool: Pool,
        method: str,
        target: str,
        data: bytes | None,
        *,
        head_timeout: float,
        body_timeout: float,
        stream: bool,
        log_id: str | None,
        provable: bool = False,
        trace: bytes = b"",
    ) -> Response:
        """After a replica's first send failed with ``first``: a connection that ended before
        the upstream saw the request (``_retried_here``) is tried once more on the same pool, a
        reply refused as another request's on a fresh connection; anything else raises
        ``first``. Each send is an attempt with an id of its own. ``provable``: a chat
        completion, whose body may name its request."""
        mapped = map_failure(first, "head", stream)
        if mapped is None or mapped[2] not in self._retried_here:
            raise first
        return await pool.request(
            method,
            target,
            data,
            head_timeout=head_timeout,
            body_timeout=body_timeout,
            stream=stream,
            request_id=_attempt_id(),
            log_id=log_id,
            provable=provable,
            fresh=mapped[2] == "misrouted",
            headers=trace,
        )

    async def _error_status(
        self, resp: Response, request_id: str | None, max_tokens: int | None
    ) -> errors.UpstreamError:
        status = resp.status
        try:
            raw = await resp.read(errors.MAX_UPSTREAM_BODY)
        except (HTTPClientError, TimeoutError, OSError):
            raw = b""
        finally:
            resp.close()
        if status < 400:  # a redirect: the upstream is misconfigured, not the client
            self.report("head", "redirect", request_id, status=status)
            err = errors.UpstreamError(status=500)
            err.upstream_status = status  # counted as what the upstream answered
            return err
        if status >= 500:
            self.report("head", "status", request_id, status=status)
        err = upstream_map.from_upstream(
            status, raw, hosts=self.hosts, secrets=self.redactor, max_tokens=max_tokens
        )
        if err.retry_after is not None:  # a 429 or 529: the engine's own wait, passed on
            hinted = upstream_map.retry_after_hint(resp.headers.get(b"retry-after"))
            if hinted is not None:
                err.retry_after = hinted
        return err


def _lost(exc: BaseException) -> bool:
    """The connection was cut or reset in the reply's body (not a malformed or too large
    body: the same request would fail the same way anywhere)."""
    return type(exc) is BrokenResponse and exc.cause in ("cut", "reset")


def _outcome(err: errors.GatewayError) -> str:
    if isinstance(err, errors.UpstreamTimeout):
        return "timeout"
    if isinstance(err, errors.UpstreamUnavailable):
        return "connect_error"
    return "bad_response"


class _Failing:
    """One request's failures on replicas: no connection, a 503 or a 529 (the replica says
    it is busy) is the replica's; any other failure after it took the request is weighed
    against the request (its digest, computed at its first such failure:
    gateway/upstream/replicas.py)."""

    __slots__ = ("_body", "_digest", "_path")

    def __init__(self, path: str, body: bytes) -> None:
        self._path = path
        self._body = body
        self._digest: bytes | None = None

    def on(self, replicas: Replicas, replica: Replica, phase: str, status: int = 0) -> bool:
        """-> True when the failure is the request's (send it to no other replica)."""
        if phase == "connect":
            return replicas.failed(replica, "connect")
        if status in _BUSY_STATUSES:
            return replicas.failed(replica, "request")
        if self._digest is None:
            self._digest = request_digest(self._path, self._body)
        return replicas.failed(replica, "request", request=self._digest)


def _retryable(exc: BaseException, phase: str) -> bool:
    """Whether a failure left the request unseen by the replica: no connection, or the
    connection lost before any byte of the reply (a timeout may have been seen: not)."""
    if isinstance(exc, ConnectFailed):
        return exc.cause != "timeout" or phase == "connect"
    if isinstance(exc, Disconnected):
        return True
    if isinstance(exc, ProtocolError):
        return exc.cause == "misrouted"
    return (
        isinstance(exc, OSError | HTTPClientError)
        and not isinstance(exc, BrokenResponse | PoolTimeout)
        and phase == "head"
    )
