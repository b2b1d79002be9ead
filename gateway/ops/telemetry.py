"""The gateway's own OpenTelemetry: spans and metrics after the GenAI semantic conventions
(pinned: semantic conventions **v1.37.0**, the first with ``gen_ai.provider.name``; see
docs/telemetry.md), exported by the OpenTelemetry SDK over OTLP/HTTP (protobuf).

Built only when ``[telemetry] otlp_endpoint`` is set (:func:`start`): the SDK is imported
here and nowhere else, so a gateway without ``[telemetry]`` never loads it. The request's
:class:`Telemetry` travels in the :data:`CURRENT` context variable, set by the telemetry
middleware (gateway/http/telemetry.py) for the request's task; the layers below read it
(``CURRENT.get()``: one context-variable read where a span may start, None when off) and
never import the SDK.

What is sent, and where it is made:

- a SERVER span per API request (the middleware), child of the client's ``traceparent``;
  its GenAI attributes are set once, when the reply's figures are written
  (:meth:`Telemetry.reply_ended`, from ``Figures.on_end``);
- an INTERNAL ``translate`` span per request translation (gateway/messages/call.py), one per
  fallback attempt and per mid-stream continuation;
- a CLIENT span per upstream attempt (one per replica tried, gateway/upstream/client.py),
  whose context goes to the engine as ``traceparent``;
- the metrics ``gen_ai.client.token.usage``, ``gen_ai.client.operation.duration``,
  ``gen_ai.server.request.duration``, ``gen_ai.server.time_to_first_token`` and
  ``gen_ai.server.time_per_output_token``.

Export never blocks the event loop: spans wait in the SDK's bounded batch queue
(``max_queue_spans``; past it they are dropped) and a worker thread sends them; a failed
export is logged by the SDK and counted by it, never raised here. Cost per request when on:
see docs/telemetry.md (measured).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import structlog

from gateway.ops.config_schema import TelemetryConfig

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

__all__ = ["CURRENT", "SEMCONV_VERSION", "Telemetry", "start"]

SEMCONV_VERSION = "1.37.0"
# the Messages API the gateway serves is Anthropic's: its server spans say so (the Anthropic
# flavour of the conventions: input tokens count cache reads)
SERVER_PROVIDER = "anthropic"

_log = structlog.get_logger("gateway.telemetry")

CURRENT: contextvars.ContextVar[Telemetry | None] = contextvars.ContextVar(
    "gateway_telemetry", default=None
)

# seconds between two exports of the span queue, at most (the metrics' is export_interval)
_SPAN_DELAY = 5.0


class Telemetry:
    """The SDK's providers, tracer, instruments and propagator, for one process."""

    def __init__(self, cfg: TelemetryConfig, *, version: str = "") -> None:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.cfg = cfg
        base = cfg.otlp_endpoint.rstrip("/")
        self.endpoint = base
        headers = dict(cfg.headers)
        self.headers = headers
        resource = Resource.create(
            {"service.name": cfg.service_name, "service.version": version or "unknown"}
        )
        self._traces = TracerProvider(
            resource=resource, sampler=ParentBased(TraceIdRatioBased(cfg.sample_ratio))
        )
        self._traces.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(
                    endpoint=f"{base}/v1/traces", headers=headers, timeout=cfg.export_timeout
                ),
                max_queue_size=cfg.max_queue_spans,
                max_export_batch_size=min(512, cfg.max_queue_spans),
                schedule_delay_millis=1000 * min(_SPAN_DELAY, cfg.export_interval),
                export_timeout_millis=1000 * cfg.export_timeout,
            )
        )
        self._meters = MeterProvider(
            resource=resource,
            metric_readers=[
                PeriodicExportingMetricReader(
                    OTLPMetricExporter(
                        endpoint=f"{base}/v1/metrics", headers=headers, timeout=cfg.export_timeout
                    ),
                    export_interval_millis=1000 * cfg.export_interval,
                    export_timeout_millis=1000 * cfg.export_timeout,
                )
            ],
        )
        self.tracer = self._traces.get_tracer("llm-gateway", version or None)
        meter = self._meters.get_meter("llm-gateway", version or None)
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Tokens used per call"
        )
        self.operation_duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="Upstream call duration"
        )
        self.server_duration = meter.create_histogram(
            "gen_ai.server.request.duration", unit="s", description="Request duration"
        )
        self.ttft = meter.create_histogram(
            "gen_ai.server.time_to_first_token", unit="s", description="Time to first token"
        )
        self.tpot = meter.create_histogram(
            "gen_ai.server.time_per_output_token",
            unit="s",
            description="Time per output token after the first",
        )
        self._propagator = TraceContextTextMapPropagator()
        self._trace = trace
        self._server_kind = trace.SpanKind.SERVER
        self._client_kind = trace.SpanKind.CLIENT

    # ------------------------------------------------------------------ spans

    def server_span(self, name: str, headers: Mapping[str, str]) -> tuple[Span, Context]:
        """A SERVER span for an API request, the child of the client's ``traceparent``
        (and ``tracestate``) when it sent one; with the context that holds it."""
        parent = self._propagator.extract(headers) if "traceparent" in headers else None
        span = self.tracer.start_span(name, context=parent, kind=self._server_kind)
        return span, self._trace.set_span_in_context(span, parent)

    @contextmanager
    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Span]:
        """An INTERNAL span around the block, the child of the current one."""
        with self.tracer.start_as_current_span(name, attributes=attributes) as span:
            yield span

    def annotate(self, attributes: Mapping[str, Any]) -> None:
        """Attributes on the current span (the request's server span, or the one open)."""
        span = self._trace.get_current_span()
        for key, value in attributes.items():
            if value is not None:
                span.set_attribute(key, value)

    def upstream_span(
        self,
        model: str | None,
        upstream: str,
        kind: str,
        base_url: str,
        attempt: int,
    ) -> tuple[Span, bytes]:
        """A CLIENT span for one upstream attempt, and the ``traceparent`` (and
        ``tracestate``) header lines that make the engine's work its child."""
        parts = urlsplit(base_url)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": kind,
            "server.address": parts.hostname or "",
            "server.port": parts.port or (443 if parts.scheme == "https" else 80),
            "gateway.upstream": upstream,
            "gateway.replica": parts.netloc.rpartition("@")[2],
            "gateway.attempt": attempt,
        }
        if model:
            attributes["gen_ai.request.model"] = model
        span = self.tracer.start_span(
            f"chat {model}" if model else "chat", kind=self._client_kind, attributes=attributes
        )
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, self._trace.set_span_in_context(span))
        lines = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in carrier.items())
        return span, lines

    def upstream_ended(self, span: Span, started: float, error: str | None = None) -> None:
        """An upstream attempt's span ended (``error``: its failure's type), and timed in
        ``gen_ai.client.operation.duration``."""
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": _attr(span, "gen_ai.provider.name"),
            "gen_ai.request.model": _attr(span, "gen_ai.request.model"),
            "server.address": _attr(span, "server.address"),
        }
        if error is not None:
            attributes["error.type"] = error
            span.set_attribute("error.type", error)
            span.set_status(self._trace.StatusCode.ERROR)
        self.operation_duration.record(time.perf_counter() - started, attributes)
        span.end()

    def failed(self, span: Span, error: str) -> None:
        span.set_attribute("error.type", error)
        span.set_status(self._trace.StatusCode.ERROR)

    # ------------------------------------------------------------------ a reply's figures

    def request_params(self, span: Span, req: Mapping[str, Any]) -> None:
        """The request's GenAI attributes (set when the request is validated)."""
        span.set_attribute("gen_ai.operation.name", "chat")
        span.set_attribute("gen_ai.provider.name", SERVER_PROVIDER)
        span.set_attribute("gen_ai.system", SERVER_PROVIDER)  # the name before v1.37.0
        span.set_attribute("gen_ai.request.model", str(req.get("model", "")))
        for key, attr in _PARAMS:
            value = req.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                span.set_attribute(attr, value)
        stops = req.get("stop_sequences")
        if isinstance(stops, list) and stops:
            span.set_attribute("gen_ai.request.stop_sequences", [str(s) for s in stops])
        span.update_name(f"chat {req.get('model', '')}")

    def reply_ended(
        self,
        span: Span,
        *,
        model: str,
        client: str,
        message_id: str | None,
        stop_reason: str | None,
        usage: tuple[int, int] | None,
        cache_read: int,
        ttft: float | None,
        tpot: float | None,
        streamed: bool,
    ) -> None:
        """A Messages reply's figures on its server span and in the GenAI metrics (once,
        from ``Figures.on_end``). ``usage``'s input counts cache reads (the Anthropic
        flavour's ``gen_ai.usage.input_tokens``)."""
        span.set_attribute("gen_ai.response.model", model)
        if message_id:
            span.set_attribute("gen_ai.response.id", message_id)
        if stop_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [stop_reason])
        metric = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": SERVER_PROVIDER,
            "gen_ai.request.model": _attr(span, "gen_ai.request.model"),
            "gen_ai.response.model": model,
            "gateway.client": client,
        }
        if usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", usage[0])
            span.set_attribute("gen_ai.usage.output_tokens", usage[1])
            span.set_attribute("gen_ai.usage.cache_read.input_tokens", cache_read)
            self.token_usage.record(usage[0], {**metric, "gen_ai.token.type": "input"})
            self.token_usage.record(usage[1], {**metric, "gen_ai.token.type": "output"})
        if streamed and ttft is not None:
            self.ttft.record(ttft, metric)
        if tpot is not None:
            self.tpot.record(tpot, metric)

    def request_ended(self, span: Span, seconds: float, attributes: Mapping[str, Any]) -> None:
        """The server span's end, timed in ``gen_ai.server.request.duration``."""
        self.server_duration.record(seconds, attributes)
        span.end()

    # ------------------------------------------------------------------ lifecycle

    def shutdown(self) -> None:
        """Flush what is queued (bounded by ``export_timeout``) and stop the exporters."""
        for provider in (self._traces, self._meters):
            try:
                provider.shutdown()
            except Exception:  # an exporter's failure is logged, never raised
                _log.warning("telemetry_shutdown_failed", exc_info=True)

    def force_flush(self) -> None:
        self._traces.force_flush(int(1000 * self.cfg.export_timeout))
        self._meters.force_flush(int(1000 * self.cfg.export_timeout))


# (Messages request key, GenAI attribute)
_PARAMS: Sequence[tuple[str, str]] = (
    ("max_tokens", "gen_ai.request.max_tokens"),
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
    ("top_k", "gen_ai.request.top_k"),
)


def _attr(span: Span, name: str) -> Any:
    attributes = getattr(span, "attributes", None)  # the SDK's span reads them back
    return "" if attributes is None else attributes.get(name, "")


def start(cfg: TelemetryConfig | None, *, version: str = "") -> Telemetry | None:
    """The process's :class:`Telemetry` when ``[telemetry]`` is configured, else None (and
    nothing of OpenTelemetry imported)."""
    if cfg is None:
        return None
    return Telemetry(cfg, version=version)
