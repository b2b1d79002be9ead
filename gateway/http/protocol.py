"""The client connection: aiohttp's ``RequestHandler`` with the gateway's HTTP-layer rules.

aiohttp parses each request (llhttp) in ``web.RequestHandler``; :class:`GatewayProtocol`
adds what must happen before any middleware or handler runs. Protocol facts relied on
(aiohttp 3.14.0 to 3.14.5, :mod:`gateway.http.compat`; ``tests/unit/http/test_protocol.py``
fails loudly when they change):

* A request the parser refuses (a line or header over 8,190 bytes, more than 128 headers,
  a control character in a header, ``Transfer-Encoding`` with ``Content-Length``, a bad
  request line, broken chunked framing, TLS on the plain port) reaches
  ``RequestHandler.handle_error(request, 400, exc, message)`` with a placeholder request for
  ``GET /``, and its answer closes the connection. aiohttp answers text/plain quoting the
  offending bytes and logs them with a traceback; here it is a 400
  ``invalid_request_error`` envelope with a ``request-id``, counted by :func:`classify`'s
  kind and logged as one access line, never the bytes. The request line is lost with the
  placeholder, so a data chunk that begins with one records whether it names an OpenAI
  route (the answer's shape).
* ``handle_error`` also answers 500 (an exception escaped the middleware) and 504 (a
  handler's ``TimeoutError``); both are logged here without the exception's message.
* A body whose framing breaks after its head was parsed (a bad chunk size in a later
  read) is not told to the handler: llhttp drops the payload and aiohttp queues the error
  as the next request, so the handler would wait for the rest of the body. Here the
  payload gets ``web.RequestPayloadError`` (the middleware answers 400 in the route's
  shape) when the queue's last entry is aiohttp's error record (private: :mod:`gateway.http.compat`,
  pinned by its test, and without it the body deadline still answers, with a 408).
* ``Server.request_factory`` is called once per request, when its head is parsed (also for
  a refused one); ``log_access`` once per request, after its answer is written and before
  aiohttp reads what is left of an unread body (for up to 10 s), which it skips on a
  connection after ``force_close()``: a request whose body failed closes its connection then.
* The keep-alive timer (``keepalive_timeout``) runs from accept and from the end of each
  answer, and closes a connection still waiting for a head; bytes of a partial head do not
  extend it. That is ``server.idle_timeout``.

Deadlines of one connection, one timer at a time: ``request_head_timeout`` from the first
byte of a head to its parse (then the connection is closed), ``request_body_timeout``
from the parsed head to the body's last byte (then the handler's read raises
:class:`RequestBodyTimeout`, which the middleware answers as a 408 ``timeout_error``).
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import http_exceptions as hx
from aiohttp import web
from aiohttp.streams import StreamReader

from gateway import errors
from gateway.http import compat
from gateway.http.listener import Listener, bind
from gateway.ops import coalesce, log
from gateway.ops.config_schema import ServerConfig
from gateway.ops.metrics import Metrics
from gateway.text import ids

_log = structlog.get_logger("gateway.http.protocol")

# aiohttp's parser limits (its defaults, kept): a request line or header field, and headers
MAX_LINE = 8190
MAX_HEADERS = 128

_HEAD, _BODY = "head", "body"  # what the connection's deadline is for
# The start of a request line: method and path (no query); anchored at a chunk's start.
_PATH_ENDS = (b" ", b"?", b"#", b"\r", b"\n")


def request_path(data: bytes) -> bytes | None:
    """The path of the request line ``data`` opens with (``METHOD /path[?query] ...``, the
    method 1-16 capital letters), at most 512 bytes of it; None when it opens with none.
    Found with ``find``: the regular expression it replaced was the one a request ran, and
    its engine's code was cold by the next request where they come one at a time."""
    space = data.find(b" ", 1, 17)
    if space < 0:
        return None
    method = data[:space]
    if not (method.isalpha() and method.isupper()):
        return None
    path = data[space + 1 : space + 513]
    for end in _PATH_ENDS:
        at = path.find(end)
        if at >= 0:
            path = path[:at]
    return path or None


class RequestBodyTimeout(Exception):
    """The body did not arrive within ``server.request_body_timeout``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"request body not received within {seconds:g} s")
        self.seconds = seconds


# --- what the parser refused -----------------------------------------------------------

# (a fragment of llhttp's or aiohttp's static description, kind), first match wins
_DESCRIPTIONS = (
    ("too many headers", "too_many_headers"),
    ("transfer-encoding can't be present with content-length", "length_and_chunked"),
    ("content-length", "bad_content_length"),
    ("transfer-encoding", "bad_transfer_encoding"),
    ("chunk", "bad_body"),
    ("https traffic", "tls"),
    ("header", "bad_header"),
    ("method", "bad_request_line"),
    ("url", "bad_request_line"),
    ("version", "bad_request_line"),
    ("status line", "bad_request_line"),
    ("pri/upgrade", "bad_request_line"),
)

_MESSAGES = {
    "line_too_long": f"A request line or header is longer than {MAX_LINE} bytes",
    "too_many_headers": f"More than {MAX_HEADERS} request headers",
    "bad_header": "A request header is malformed or missing (a name must be a token, a "
    "value holds no control character, HTTP/1.1 needs Host)",
    "bad_request_line": "Malformed request line",
    "length_and_chunked": "Transfer-Encoding and Content-Length must not both be present",
    "bad_content_length": "Invalid Content-Length",
    "bad_transfer_encoding": "Unsupported Transfer-Encoding (only chunked is accepted)",
    "bad_body": "Malformed request body framing",
    "tls": "TLS sent to a plain HTTP port (use http://)",
    "malformed": "Malformed HTTP request",
}


def classify(exc: BaseException | None) -> str:
    """The kind (a ``metrics.CLIENT_HTTP_ERRORS`` value) of a parser's refusal."""
    if isinstance(exc, hx.LineTooLong):
        return "line_too_long"
    if isinstance(exc, hx.TransferEncodingError | hx.ContentLengthError):
        return "bad_body"
    if isinstance(exc, hx.InvalidHeader):
        return "bad_header"
    if not isinstance(exc, hx.HttpProcessingError):
        return "malformed"
    # llhttp's message is "<description>:\n\n  <the bytes>\n  ^": only the description
    description = exc.message.split(":\n", 1)[0].lower()
    for fragment, kind in _DESCRIPTIONS:
        if fragment in description:
            return kind
    if isinstance(exc, hx.BadStatusLine | hx.InvalidURLError):
        return "bad_request_line"
    return "malformed"


def message_for(kind: str) -> str:
    return _MESSAGES.get(kind, _MESSAGES["malformed"])


# --- the connection --------------------------------------------------------------------


@dataclass(eq=False)
class ConnectionPolicy:
    """What every connection of one listener shares."""

    server: ServerConfig
    metrics: Metrics
    # the request paths whose errors take OpenAI's shape (app[OPENAI_PATHS])
    openai_paths: frozenset[bytes] = frozenset()
    # called once when a connection opens and once when it ends (the listener's count)
    on_open: Callable[[], None] = lambda: None
    on_close: Callable[[], None] = lambda: None


class GatewayProtocol(web.RequestHandler):
    """One client connection (see the module docstring)."""

    __slots__ = (
        "_body",
        "_busy",
        "_clock",
        "_counted",
        "_deadline",
        "_failed",
        "_openai",
        "_out",
        "_phase",
        "_policy",
        "_timer",
        "_timer_at",
    )

    def __init__(self, manager: web.Server, policy: ConnectionPolicy) -> None:
        loop = asyncio.get_running_loop()
        super().__init__(
            manager,
            loop=loop,
            keepalive_timeout=policy.server.idle_timeout,
            access_log=None,  # type: ignore[arg-type]  # ours: the middleware's
            max_line_size=MAX_LINE,
            max_field_size=MAX_LINE,
            max_headers=MAX_HEADERS,
        )
        self._policy = policy
        self._clock = loop
        self._busy = False  # a request's head is parsed and its answer not yet written
        self._openai = False  # the last request line seen named an OpenAI route
        # One lazy timer: arming a deadline sets _deadline (0.0: none); the timer, when it
        # fires, re-arms itself if the deadline moved on, so a request costs no timer calls.
        self._deadline = 0.0
        self._phase = _HEAD
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._body: StreamReader | None = None  # the body being received
        self._failed = False  # the body broke or timed out: close after the answer
        self._counted = False
        self._out = coalesce.for_loop(loop)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._counted = True
        self._policy.metrics.client_connections.inc()
        self._policy.on_open()
        # every byte aiohttp writes for an answer leaves at the end of the loop's pass,
        # with the pass's other writes (gateway/ops/coalesce.py)
        held = coalesce.HeldTransport(transport, self._out)  # type: ignore[arg-type]
        super().connection_made(held)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._deadline = 0.0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)
        if self._counted:
            self._counted = False
            self._policy.metrics.client_connections.dec()
            self._policy.on_close()

    def data_received(self, data: bytes) -> None:
        if not self._busy and data:
            path = request_path(data)
            if path is not None:
                self._openai = path in self._policy.openai_paths
            if not self._deadline:
                self._arm(_HEAD, self._policy.server.request_head_timeout)
        super().data_received(data)
        body = self._body
        if body is not None and not body.is_eof() and compat.parser_refused(self):
            self._body = None
            self._failed = True
            self._policy.metrics.client_http_errors.labels("bad_body").inc()
            body.set_exception(web.RequestPayloadError("Malformed request body framing"))

    def request_started(self, payload: StreamReader) -> None:
        """A head is parsed: its deadline ends, the body's (if one is coming) starts."""
        self._deadline = 0.0
        self._busy = True
        if not payload.is_eof():
            self._body = payload
            self._arm(_BODY, self._policy.server.request_body_timeout)
            payload.on_eof(self._body_received)

    def _body_received(self) -> None:
        if self._body is not None and self._body.is_eof():
            self._body = None
            self._deadline = 0.0

    def log_access(
        self, request: web.BaseRequest, response: web.StreamResponse, time: float | None
    ) -> None:
        # the answer is written: the access line is the middleware's (or handle_error's)
        self._busy = False
        self._body = None
        self._deadline = 0.0
        if self._failed:
            self.force_close()

    def log_debug(self, *args: Any, **kw: Any) -> None:
        pass  # aiohttp's debug lines quote requests; they are only emitted in its debug mode

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        _log.error(
            "connection_error",
            **log.exception_fields(exc if isinstance(exc, BaseException) else None),
        )

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        self._deadline = 0.0
        if request.writer.output_size > 0:  # as aiohttp: an answer has begun, none can follow
            raise ConnectionError("Response is sent already")
        kind: str | None = None
        if status == 400:
            kind = classify(exc)
            err: errors.GatewayError = errors.InvalidRequest("", message_for(kind))
            self._policy.metrics.client_http_errors.labels(kind).inc()
        else:
            _log.error("unhandled_error", status=status, **log.exception_fields(exc))
            err = errors.GatewayError(status=504 if status == 504 else 500)
        request_id = ids.new_request_id()
        if self._openai:
            status, body = errors.openai_status(err), errors.openai_body(err)
        else:
            status, body = err.status, errors.anthropic_body(err, request_id)
        resp = web.Response(
            status=status,
            body=body,
            content_type="application/json",
            headers={"request-id": request_id, **err.headers},
        )
        resp.force_close()
        compat.answer_as_http11(request)  # the placeholder request is HTTP/1.0
        log.access(
            log.Access(
                request_id,
                "http_error",
                status,
                error_type=err.error_type,
                error=err.message,
                extra={"kind": kind},
            )
        )
        return resp

    def _arm(self, phase: str, seconds: float) -> None:
        deadline = self._clock.time() + seconds
        self._deadline, self._phase = deadline, phase
        timer = self._timer
        if timer is None or deadline < self._timer_at:
            if timer is not None:
                timer.cancel()
            self._timer_at = deadline
            self._timer = self._clock.call_at(deadline, self._expired)

    def _expired(self) -> None:
        self._timer = None
        deadline = self._deadline
        if not deadline:
            return
        if self._clock.time() < deadline:  # the deadline moved on since this timer was set
            self._timer_at = deadline
            self._timer = self._clock.call_at(deadline, self._expired)
            return
        self._deadline = 0.0
        if self._phase is _HEAD:
            self._head_expired()
        elif self._body is not None:
            self._body_expired(self._body)

    def _head_expired(self) -> None:
        self._policy.metrics.client_http_errors.labels("head_timeout").inc()
        _log.info("client_timeout", phase="head", seconds=self._policy.server.request_head_timeout)
        self.force_close()

    def _body_expired(self, payload: StreamReader) -> None:
        if payload.is_eof():
            return
        seconds = self._policy.server.request_body_timeout
        self._policy.metrics.client_http_errors.labels("body_timeout").inc()
        self._body = None
        self._failed = True
        payload.set_exception(RequestBodyTimeout(seconds))


def track_request_starts(server: web.Server) -> None:
    """Tell each :class:`GatewayProtocol` when a request's head is parsed (wraps the server's
    request factory, which aiohttp calls then; the protocols copy it when they are made)."""

    def started(protocol: web.RequestHandler, payload: StreamReader) -> None:
        if isinstance(protocol, GatewayProtocol):
            protocol.request_started(payload)

    compat.wrap_request_factory(server, started)


def listen(
    server: web.Server,
    config: ServerConfig,
    metrics: Metrics,
    *,
    ops_server: web.Server | None = None,
    openai_paths: frozenset[bytes] = frozenset(),
    reuse_port: bool = False,
    tls: ssl.SSLContext | None = None,
) -> list[Listener]:
    """Bind and start the API listener (``server``) and, when ``metrics_port`` is set, the
    metrics one (``ops_server``: the metrics application's ``/metrics``, ``/health`` and
    ``/ready`` only; ``/metrics`` then leaves the API's). ``tls``: the API listener serves
    https with it, its handshakes bounded by ``request_head_timeout``; the metrics listener
    stays plain (scraped on an internal address)."""
    listeners: list[Listener] = []
    roles = [("api", server, config.host, config.port, openai_paths, config.max_connections)]
    if config.metrics_apart:
        assert ops_server is not None, "metrics_port set: the metrics application is needed"
        roles.append(
            (
                "metrics",
                ops_server,
                config.metrics_host or config.host,
                config.metrics_port,
                frozenset(),
                0,
            )
        )
    try:
        for name, srv, host, port, paths, cap in roles:
            track_request_starts(srv)
            policy = ConnectionPolicy(config, metrics, paths)
            listener = Listener(
                name,
                bind(host, port, reuse_port=reuse_port),
                functools.partial(GatewayProtocol, srv, policy),
                max_connections=cap,
                metrics=metrics,
                tls=tls if name == "api" else None,
                handshake_timeout=config.request_head_timeout,
            )
            policy.on_open, policy.on_close = listener.opened, listener.closed
            listeners.append(listener)
    except OSError:
        for listener in listeners:
            listener.close()
        raise
    for listener in listeners:
        listener.start()
    return listeners
