"""The upstream client's one error map (httpcore's ``map_exceptions``): a foreign exception
from the pool or a connection becomes the GatewayError the client answers, and is logged once
(``upstream_failure``: upstream, phase, cause, request id; at most one line per upstream and
cause a second, the lines held back counted in the next). See :mod:`gateway.upstream.client`
for what each failure becomes. The web search backend (gateway/tools/web_search/searxng.py) logs its
failures through the same :class:`FailureLog`, under its own event name.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

import structlog

from gateway import errors
from gateway.upstream.exceptions import (
    BrokenResponse,
    ConnectFailed,
    Disconnected,
    HTTPClientError,
    PoolTimeout,
    ProtocolError,
    TooLarge,
)

__all__ = ["FailureLog", "Failures", "map_failure", "unreachable"]

_log = structlog.get_logger("gateway.upstream")

# failures retried once: the connection ended before the upstream saw the request, or a
# reused connection read a reply to another request (the pool closed it; the retry goes out
# on a fresh connection)
_RETRIED = frozenset(("refused", "reset", "closed", "misrouted"))
_LOG_EVERY = 1.0  # seconds between two failure lines of one upstream and cause
# What the client reads when no connection could be made, by ConnectFailed's cause: the
# cause in words, never the host, address or port (the URL is a secret: house rule 5), so
# "no engine running" reads as such instead of a bare "Overloaded". Still a 529, which the
# SDKs retry (an engine that is starting up answers a moment later).
_UNREACHABLE = {
    "refused": "connection refused",
    "reset": "connection reset",
    "tls": "TLS handshake failed",
    "dns": "host name not resolved",
    "no_replicas": "no replica address known",
}


def unreachable(cause: str) -> errors.UpstreamUnavailable:
    """The client's error when the upstream could not be reached (``cause``: a
    :class:`ConnectFailed` cause, or ``no_replicas``)."""
    return errors.UpstreamUnavailable(
        f"Upstream unreachable: {_UNREACHABLE.get(cause, 'could not connect')}"
    )


class FailureLog:
    """One warning per failure, at most one a second per cause; the rest are counted.

    The upstream client's (``upstream_failure``, keyed ``upstream=``) by default; the web
    search backend's (gateway/tools/web_search/searxng.py) names its own ``event`` and ``key``."""

    __slots__ = ("_event", "_key", "_last", "_loop", "_upstream")

    def __init__(
        self, upstream: str, *, event: str = "upstream_failure", key: str = "upstream"
    ) -> None:
        self._upstream = upstream
        self._event = event
        self._key = key
        self._last: dict[str, list[float]] = {}  # cause -> [time of last line, held back]
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, phase: str, cause: str, request_id: str | None, **fields: Any) -> None:
        self.warn(cause, phase=phase, request_id=request_id, **fields)

    def warn(self, cause: str, **fields: Any) -> None:
        """Log ``cause`` (with ``fields``) unless a line of it went out less than a second
        ago; the next line that goes out says how many were held back (``suppressed``)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        now = self._loop.time()
        seen = self._last.get(cause)
        if seen is not None and now - seen[0] < _LOG_EVERY:
            seen[1] += 1
            return
        suppressed = int(seen[1]) if seen is not None else 0
        self._last[cause] = [now, 0]
        if suppressed:
            fields["suppressed"] = suppressed
        _log.warning(self._event, **{self._key: self._upstream}, cause=cause, **fields)


def map_failure(
    exc: BaseException, phase: str, stream: bool
) -> tuple[errors.GatewayError, str, str] | None:
    """(the client's error, phase, cause) for a foreign exception; None: not ours."""
    if isinstance(exc, ConnectFailed):
        err: errors.GatewayError = (
            errors.UpstreamTimeout() if exc.cause == "timeout" else unreachable(exc.cause)
        )
        return err, "connect", exc.cause
    if isinstance(exc, PoolTimeout):
        return errors.UpstreamTimeout(), "connect", exc.cause
    if isinstance(exc, TimeoutError):
        if phase == "body" and stream:
            return errors.UpstreamTimeout("Upstream stopped sending"), phase, "timeout"
        return errors.UpstreamTimeout(), phase, "timeout"
    if isinstance(exc, Disconnected):
        return errors.UpstreamUnavailable(), phase, exc.cause
    if isinstance(exc, TooLarge):
        return errors.UpstreamError("Upstream response too large", status=500), phase, exc.cause
    if isinstance(exc, ProtocolError | BrokenResponse) and exc.cause != "reset":
        message = (
            "Upstream connection lost"
            if exc.cause == "cut"
            else "Upstream sent a malformed response"
        )
        return errors.UpstreamError(message, status=500), phase, exc.cause
    if isinstance(exc, HTTPClientError | OSError):
        if phase == "head":
            return errors.UpstreamUnavailable(), phase, "reset"
        return errors.UpstreamError("Upstream connection lost", status=500), phase, "reset"
    return None


class Failures:
    """The one error map (httpcore's ``map_exceptions``): foreign -> GatewayError, logged.

    ``retry``: a failure before the upstream saw the request is swallowed instead and
    ``retried`` set, for the caller to send again (once). Where a call runs once per
    request, it is entered only in the ``except`` clause (``with Failures(...): raise``):
    the same map, and nothing to build on the way that succeeds.
    """

    __slots__ = ("_phase", "_report", "_request_id", "_stream", "retry")

    def __init__(
        self,
        report: FailureLog,
        phase: str,
        request_id: str | None,
        stream: bool,
        *,
        retry: bool = False,
    ) -> None:
        self._report = report
        self._phase = phase
        self._request_id = request_id
        self._stream = stream
        self.retry = retry

    def __enter__(self) -> Failures:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc is None or isinstance(exc, errors.GatewayError):
            return False
        mapped = map_failure(exc, self._phase, self._stream)
        if mapped is None:
            return False  # cancellation, GeneratorExit, a bug: not the upstream's doing
        err, phase, cause = mapped
        if self.retry and cause in _RETRIED and phase != "body":
            return True
        if not isinstance(exc, ProtocolError):  # the pool has logged that one
            self._report(phase, cause, self._request_id)
        raise err from None
