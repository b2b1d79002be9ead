"""Request id, auth, body limit, draining, error rendering, access log and metrics.

Errors are raised anywhere and rendered here, once: Anthropic's envelope on
the Anthropic routes, OpenAI's shape on the pass-through. An unexpected
exception is logged with its traceback and answered as a bare 500
``Internal server error``; no ``str(exc)`` ever reaches a client. A client
that leaves (``ClientGone`` from the writer, a ``ConnectionError`` from
aiohttp, the handler's cancellation) is a normal event: status 499 on the
access line, nothing else. A body that breaks its framing is a 400, one that
misses ``server.request_body_timeout`` a 408 (gateway/http/protocol.py). The access
line's ``error`` and ``query`` pass the redactor of every upstream's secrets
(an upstream message is scrubbed already; a client may echo a key back); the
query is logged as its parameter names only.

A credential that is no configured key may be a gateway access token (Claude Code's
sign-in, gateway/auth/): only then, and only with ``[auth]`` on, is it looked up there; a key
costs nothing more.

``/metrics`` is served on the API listener only when ``server.metrics_port`` is
unset, and then asks for a client key when keys are set (it names every upstream
model); the metrics listener serves only ``/metrics``, ``/health`` and ``/ready``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from functools import partial

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

from gateway import errors
from gateway.auth.service import SIGNIN, TokenRefused
from gateway.http import charges
from gateway.http.drain import DRAINING_MESSAGE
from gateway.http.keys import EXCHANGE, AppView, Exchange, RouteTag
from gateway.http.protocol import RequestBodyTimeout
from gateway.http.writer import ClientGone, send_buffered
from gateway.ops import log
from gateway.ops.metrics import Metrics
from gateway.tenancy.clients import ANONYMOUS_CLIENT, Client, Tenants, signin_key
from gateway.tenancy.forwarding import USER_EMAIL_HEADER, USER_ID_HEADER, Forwarded
from gateway.text import ids

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_SANE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# a route added without a tag (aiohttp's own 404 for an unmatched path): Anthropic's envelope
_UNTAGGED = RouteTag(api=None, needs_key=False)
_MAX_QUERY_NAMES = 32
_log = structlog.get_logger("gateway.access")


def _request_id(request: web.Request) -> str:
    incoming = request.headers.get("x-request-id")
    if incoming and _SANE_ID.fullmatch(incoming):
        return incoming
    return ids.new_request_id()


def _route_name(request: web.Request) -> str:
    route = request.match_info.route
    return route.name or "unknown"


def _query_names(raw: str) -> str:
    """A raw (still percent-encoded) query string's parameter names: ``a&b``, no values."""
    if "&" not in raw:  # one parameter (?beta=true on every Claude Code request)
        return raw.partition("=")[0][:64]
    names = (
        part.split("=", 1)[0][:64] for part in raw.split("&", _MAX_QUERY_NAMES)[:_MAX_QUERY_NAMES]
    )
    return "&".join(name for name in names if name)


def credential(request: web.Request) -> bytes | None:
    """The client's key: ``x-api-key``, else an ``Authorization: Bearer`` token."""
    key = request.headers.get("x-api-key")
    if key is None:
        auth = request.headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            key = auth[7:].strip()
    return key.encode("utf-8", "surrogateescape") if key else None


def render_error(request: web.Request, err: errors.GatewayError, request_id: str) -> web.Response:
    exchange = request.get(EXCHANGE)
    if exchange is not None and exchange.openai:
        return web.Response(
            status=errors.openai_status(err),
            body=errors.openai_body(err),
            content_type="application/json",
            headers=err.headers,
        )
    return web.Response(
        status=err.status,
        body=errors.anthropic_body(err, request_id),
        content_type="application/json",
        headers=err.headers,
    )


def _from_http_exception(exc: web.HTTPException) -> errors.GatewayError:
    if exc.status == 413:
        return errors.RequestTooLarge()
    if exc.status == 404:
        return errors.NotFound("Not found")
    if exc.status == 405:
        return errors.GatewayError(
            "Method not allowed", status=405, error_type="invalid_request_error"
        )
    return errors.GatewayError(exc.reason, status=exc.status)


def _prepared(exchange: Exchange) -> web.StreamResponse | None:
    """A stream already started: its status is sent, so no error response can follow."""
    resp = exchange.stream_response
    return resp if resp is not None and resp.prepared else None


def _forwarded(
    request: web.Request, exchange: Exchange, tenants: Tenants, client: Client, metrics: Metrics
) -> Client:
    """The client a request is for when a trusted proxy names its developer
    (gateway/tenancy/forwarding.py); else the key's own."""
    name, outcome = tenants.forwarding.resolve(
        request.remote,
        client.name,
        request.headers.get(USER_ID_HEADER),
        request.headers.get(USER_EMAIL_HEADER),
    )
    if outcome is Forwarded.NONE:
        return client
    metrics.forwarded_identities.labels(outcome.value).inc()
    if outcome is not Forwarded.NAMED or name == client.name:
        return client
    # batches made for a named developer are that client's, as with a sign-in token's
    exchange.client_key = signin_key(name)
    return tenants.clients[name]


def gateway_middleware(view: AppView) -> Middleware:
    """The middleware of an application whose :class:`AppView` is ``view`` (a partial: no
    frame of its own between aiohttp and the request's)."""
    return web.middleware(partial(_handle, view))  # type: ignore[arg-type]


async def _handle(view: AppView, request: web.Request, handler: Handler) -> web.StreamResponse:
    start = time.perf_counter()
    request_id = _request_id(request)
    route = _route_name(request)
    tag = view.tags.get(route, _UNTAGGED)
    api = tag.api
    request[EXCHANGE] = exchange = Exchange(view, request_id, api or "", tag.openai)
    presented = exchange.client_key = credential(request)
    # request_id is the only context variable bound anywhere, and every request binds it
    # first: requests on one keep-alive connection share a task, and the new id replaces
    # the old one, so nothing needs clearing
    structlog.contextvars.bind_contextvars(request_id=request_id)
    metrics = view.metrics
    status = 500
    response: web.StreamResponse | None = None
    config = view.config
    state = view.state
    try:
        server = config.server
        tenants = state.tenants
        client = tenants.identify(presented)
        if client is not None and tenants.forwarding.active:
            client = _forwarded(request, exchange, tenants, client, metrics)
        if client is None:
            refused: TokenRefused | None = None
            if presented is not None and (signin := request.app.get(SIGNIN)) is not None:
                try:  # no key: perhaps a signed-in developer's bearer
                    client = await signin.identify(presented, tenants)
                    # a named client's token owns batches as that client (one key each);
                    # server.api_keys_env's keys are many: such a token owns its own
                    if client is not None and client is not ANONYMOUS_CLIENT:
                        exchange.client_key = signin_key(client.name)
                except TokenRefused as exc:
                    refused = exc
            if client is None:
                if tag.needs_key:
                    if api is not None:
                        metrics.rejected.labels(api, "auth").inc()
                    raise refused or errors.AuthenticationFailed()
                client = ANONYMOUS_CLIENT  # an operational route: nobody in particular
        exchange.client = client
        if api is not None:
            if state.draining:
                metrics.rejected.labels(api, "draining").inc()
                raise errors.Overloaded(DRAINING_MESSAGE)
            length = request.content_length
            limit = (
                server.max_body_bytes
                if route != "batches_create"
                else config.batches.max_body_bytes
            )
            if length is not None and length > limit:
                metrics.rejected.labels(api, "body_too_large").inc()
                raise errors.RequestTooLarge(f"Request exceeds the maximum size of {limit} bytes")
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            raise _from_http_exception(exc) from None
        except RequestBodyTimeout as exc:
            raise errors.GatewayError(
                f"Request body not received within {exc.seconds:g} seconds", status=408
            ) from None
        except web.RequestPayloadError:
            raise errors.InvalidRequest("", "Malformed request body framing") from None
        status = response.status
    except errors.GatewayError as err:
        response = _prepared(exchange)
        if response is None:
            if api is not None and exchange.client.limited:  # its limits' headers
                await charges.standing(exchange, err)
            response = render_error(request, err, request_id)
        status = response.status
        exchange.error = (err.error_type, err.message if err.status < 500 else None)
        if api is not None and err.status == 400 and not isinstance(err, errors.UpstreamError):
            metrics.rejected.labels(api, "invalid_request").inc()
    except web.HTTPException as exc:  # a redirect, answered by aiohttp as it is
        response = exc
        status = exc.status
        raise
    except (ClientGone, ConnectionError):  # the client left: its access line says 499
        response = _prepared(exchange) or web.Response(status=499)
        status = response.status if response.prepared else 499
    except Exception:
        _log.exception("unhandled_error", route=route)
        response = _prepared(exchange) or render_error(request, errors.GatewayError(), request_id)
        status = response.status
    finally:
        if response is None:  # cancelled: the client went away
            prepared = _prepared(exchange)
            status = prepared.status if prepared is not None else 499
        elif (
            not response.prepared and status != 499 and not isinstance(response, web.HTTPException)
        ):
            # a buffered reply: sent here, bounded by write_timeout, so that a client that
            # stops reading is dropped (and its access line says so) as a stream's would be
            response.headers["request-id"] = request_id
            if not await send_buffered(request, response, config.server.write_timeout):
                status = 499
        duration = time.perf_counter() - start
        model = exchange.model
        stream = "true" if exchange.stream else "false"
        if api is not None:
            metrics.requests.labels(api, model, str(status), stream).inc()
            metrics.request_duration.labels(api, model, stream).observe(duration)
            if len(state.tenants.clients) > 1:  # named clients: their own series
                metrics.client_requests.labels(exchange.client.name, model, str(status)).inc()
        if tag.logged and log.logs_access():
            error = exchange.error
            raw_query = request.rel_url.raw_query_string
            query = view.secrets(_query_names(raw_query)) or None if raw_query else None
            log.access_line(
                request_id,
                route,
                status,
                request.method,
                model or None,
                exchange.upstream,
                duration * 1000,  # written to the microsecond
                exchange.stream,
                query,
                error[0] if error else None,
                view.secrets(error[1]) if error and error[1] is not None else None,
            )
    if not response.prepared:
        response.headers["request-id"] = request_id
    return response
