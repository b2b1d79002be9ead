"""OpenTelemetry at the HTTP shell (only when ``[telemetry]`` is configured; see
gateway/ops/telemetry.py and docs/telemetry.md).

- :func:`middleware`: a SERVER span per API request, the child of the client's W3C
  ``traceparent``/``tracestate``; the request's :class:`Telemetry` set in
  :data:`~gateway.ops.telemetry.CURRENT` for the layers below. Added to the app only when
  telemetry is on: a gateway without it runs no code of this module per request.
- :func:`reply_ended`: a Messages reply's figures on that span and in the GenAI metrics
  (composed into ``Figures.on_end`` by gateway/http/tenancy.py).
- :func:`otlp_sink`: ``POST {prefix}/v1/{metrics,logs,traces}``, the client's own OTLP
  (Claude Code's, when managed settings point ``OTEL_EXPORTER_OTLP_ENDPOINT`` here): protobuf
  or JSON, bounded by ``max_forward_bytes``, forwarded to the same collector with the
  client's name added to every resource (``gateway.client.name`` and ``enduser.id``, any
  value the client set replaced). Authenticated like every API route (the middleware).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from gateway import errors
from gateway.http.keys import EXCHANGE, ROUTE_TAGS, Exchange
from gateway.messages.from_chat.figures import Figures
from gateway.ops.telemetry import CURRENT, Telemetry

__all__ = [
    "SIGNALS",
    "SPAN",
    "TELEMETRY",
    "middleware",
    "otlp_sink",
    "passthrough_ended",
    "reply_ended",
    "telemetry_ctx",
]

TELEMETRY: web.AppKey[Telemetry] = web.AppKey("telemetry")
SPAN: web.RequestKey[Any] = web.RequestKey("otel_span")
_SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("otlp_session")

SIGNALS = ("traces", "metrics", "logs")
# the resource attributes the gateway sets on a client's OTLP (whatever the client said)
_IDENTITY = ("gateway.client.name", "enduser.id")
_PROTOBUF = "application/x-protobuf"
# (OTLP/JSON's list key, the protobuf request's field) per signal
_LISTS = {
    "traces": ("resourceSpans", "resource_spans"),
    "metrics": ("resourceMetrics", "resource_metrics"),
    "logs": ("resourceLogs", "resource_logs"),
}
# the OpenAI pass-through's operation names (gen_ai.operation.name)
_OPERATIONS = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def middleware(telemetry: Telemetry) -> Any:
    """The server span of each API request (see the module docstring)."""
    from opentelemetry import context as otel_context

    @web.middleware
    async def traced(request: web.Request, handler: Handler) -> web.StreamResponse:
        name = request.match_info.route.name or ""
        tag = request.app[ROUTE_TAGS].get(name)
        if tag is None or tag.api is None:  # operational routes and the OTLP sink: no span
            return await handler(request)
        span, context = telemetry.server_span(f"{request.method} {name}", request.headers)
        request[SPAN] = span
        token = otel_context.attach(context)
        reset = CURRENT.set(telemetry)
        t0 = time.perf_counter()
        status = 499
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            CURRENT.reset(reset)
            otel_context.detach(token)
            _ended(telemetry, request, span, tag.api, status, time.perf_counter() - t0)

    return traced


def _ended(
    telemetry: Telemetry, request: web.Request, span: Any, api: str, status: int, seconds: float
) -> None:
    exchange = request.get(EXCHANGE)
    client = exchange.client if exchange is not None else None
    span.set_attribute("http.request.method", request.method)
    resource = request.match_info.route.resource
    span.set_attribute("http.route", resource.canonical if resource is not None else "")
    span.set_attribute("http.response.status_code", status)
    span.set_attribute("gateway.request_id", exchange.request_id if exchange is not None else "")
    if client is not None:
        span.set_attribute("gateway.client", client.name)
    attributes: dict[str, Any] = {"gateway.api": api}
    model = exchange.model if exchange is not None else ""
    operation = "chat" if api == "messages" else _OPERATIONS.get(api)
    if operation is not None:
        attributes["gen_ai.operation.name"] = operation
        attributes["gen_ai.request.model"] = model
        if api != "messages":
            span.set_attribute("gen_ai.operation.name", operation)
            span.set_attribute("gen_ai.provider.name", "openai")
            span.set_attribute("gen_ai.request.model", model)
            span.update_name(f"{operation} {model}")
    if status >= 500:
        attributes["error.type"] = str(status)
        telemetry.failed(span, str(status))
    telemetry.request_ended(span, seconds, attributes)


def reply_ended(
    request: web.Request, exchange: Exchange, req: dict[str, Any]
) -> Callable[[Figures], None] | None:
    """The telemetry part of a Messages reply's ``Figures.on_end``: its request params now,
    its figures at the end; None when the request has no span."""
    span = request.get(SPAN)
    if span is None:
        return None
    telemetry = request.app[TELEMETRY]
    telemetry.request_params(span, req)
    client = exchange.client.name

    def ended(figures: Figures) -> None:
        telemetry.reply_ended(
            span,
            model=figures.model,
            client=client,
            message_id=figures.message_id,
            stop_reason=figures.stop_reason,
            usage=figures.usage,
            cache_read=figures.cache_read,
            ttft=figures.ttft,
            tpot=figures.tpot,
            streamed=figures.streamed,
        )

    return ended


def passthrough_ended(request: web.Request, usage: tuple[int, int] | None) -> None:
    """An OpenAI pass-through reply's usage on its span and in ``gen_ai.client.token.usage``."""
    span = request.get(SPAN)
    if span is None or usage is None:
        return
    span.set_attribute("gen_ai.usage.input_tokens", usage[0])
    span.set_attribute("gen_ai.usage.output_tokens", usage[1])


# ---------------------------------------------------------------- the client's own OTLP


async def otlp_sink(request: web.Request) -> web.Response:
    """``POST {prefix}/v1/{signal}``: the client's OTLP, forwarded with its identity."""
    telemetry = request.app[TELEMETRY]
    signal = request.match_info["signal"]
    limit = telemetry.cfg.max_forward_bytes
    if request.content_length is not None and request.content_length > limit:
        raise errors.RequestTooLarge(f"Request exceeds the maximum size of {limit} bytes")
    body = await request.content.read(limit + 1)
    if len(body) > limit:
        raise errors.RequestTooLarge(f"Request exceeds the maximum size of {limit} bytes")
    kind = request.content_type
    name = request[EXCHANGE].client.name
    if kind == _PROTOBUF:
        out = with_identity_protobuf(signal, body, name)
        reply = b""  # an empty Export*ServiceResponse
    elif kind == "application/json":
        out = with_identity_json(signal, body, name)
        reply = b"{}"
    else:
        raise errors.GatewayError(
            "OTLP bodies are application/x-protobuf or application/json", status=415
        )
    headers = {**telemetry.headers, "Content-Type": kind}
    session = request.app[_SESSION]
    try:
        async with session.post(
            f"{telemetry.endpoint}/v1/{signal}",
            data=out,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=telemetry.cfg.export_timeout),
        ) as resp:
            await resp.read()
            ok = resp.status < 300
    except (aiohttp.ClientError, TimeoutError):
        ok = False
    if not ok:
        raise errors.GatewayError("The telemetry collector did not take the data", status=502)
    return web.Response(body=reply, content_type=kind)


def with_identity_protobuf(signal: str, body: bytes, client: str) -> bytes:
    """An OTLP protobuf export request with the client's name on each of its resources;
    a body that does not decode is a 400."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    message = _request_type(signal)()
    try:
        message.ParseFromString(body)
    except DecodeError:
        raise errors.InvalidRequest("", "The OTLP body does not decode") from None
    for item in getattr(message, _LISTS[signal][1]):
        attributes = item.resource.attributes
        kept = [kv for kv in attributes if kv.key not in _IDENTITY]
        del attributes[:]
        attributes.extend(kept)
        for key in _IDENTITY:
            attributes.append(KeyValue(key=key, value=AnyValue(string_value=client)))
    out: bytes = message.SerializeToString()
    return out


def with_identity_json(signal: str, body: bytes, client: str) -> bytes:
    """The same for OTLP/JSON."""
    try:
        data = json.loads(body)
    except ValueError:
        raise errors.InvalidRequest("", "The OTLP body is not JSON") from None
    items = data.get(_LISTS[signal][0]) if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise errors.InvalidRequest(_LISTS[signal][0], "An OTLP export request was expected")
    for item in items:
        if not isinstance(item, dict):
            raise errors.InvalidRequest(_LISTS[signal][0], "An OTLP export request was expected")
        resource = item.setdefault("resource", {})
        if not isinstance(resource, dict):
            raise errors.InvalidRequest("resource", "An OTLP resource was expected")
        attributes = [
            kv
            for kv in resource.get("attributes") or []
            if not (isinstance(kv, dict) and kv.get("key") in _IDENTITY)
        ]
        attributes += [{"key": key, "value": {"stringValue": client}} for key in _IDENTITY]
        resource["attributes"] = attributes
    return json.dumps(data, separators=(",", ":")).encode()


def _request_type(signal: str) -> Any:
    if signal == "traces":
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        return trace_service_pb2.ExportTraceServiceRequest
    if signal == "metrics":
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

        return metrics_service_pb2.ExportMetricsServiceRequest
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

    return logs_service_pb2.ExportLogsServiceRequest


async def telemetry_ctx(app: web.Application) -> AsyncIterator[None]:
    """The forwarder's client session; at shutdown the SDK's queues flushed (bounded)."""
    app[_SESSION] = aiohttp.ClientSession()
    try:
        yield
    finally:
        await app[_SESSION].close()
        await asyncio.to_thread(app[TELEMETRY].shutdown)
