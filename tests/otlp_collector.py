"""A small OTLP/HTTP collector on 127.0.0.1 for the telemetry tests: an aiohttp app in a
thread of its own that takes ``POST /v1/traces``, ``/v1/metrics`` and ``/v1/logs`` in
protobuf (decoded with opentelemetry-proto) or JSON, and keeps what it got.

``spans()`` flattens every span received (name, ids, kind, attributes, its resource's
attributes); ``metric_names()`` and ``metric_points(name)`` read the metrics; ``received``
keeps each request as (signal, content type, the decoded message or JSON object).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["Collector", "Span", "value_of"]

_TYPES = {
    "traces": ExportTraceServiceRequest,
    "metrics": ExportMetricsServiceRequest,
    "logs": ExportLogsServiceRequest,
}


def value_of(value: AnyValue) -> Any:
    """An OTLP attribute value as Python (arrays as lists)."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status_code: int


class Collector:
    """The collector (see the module docstring); ``start()`` it, ``stop()`` it."""

    def __init__(self) -> None:
        self.port = 0
        self.received: list[tuple[str, str, Any]] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._runner: web.AppRunner | None = None
        self._listener = socket.socket()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the collector did not start")

    def stop(self) -> None:
        async def down() -> None:
            if self._runner is None:
                return
            # Stop accepting, let the connections accepted last reach the server, then shut
            # it down. Closing the listener at once (what cleanup() does) loses them: on
            # Python 3.11 a connection whose accept task runs after the close is never
            # closed, nor is one that joins aiohttp's server while its shutdown runs.
            asyncio.get_running_loop().remove_reader(self._listener.fileno())
            await asyncio.sleep(0.05)
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(down(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/{signal:(?:traces|metrics|logs)}", self._take)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        self._listener.bind(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._loop.run_until_complete(web.SockSite(self._runner, self._listener).start())
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _take(self, request: web.Request) -> web.Response:
        signal = request.match_info["signal"]
        body = await request.read()
        if request.content_type == "application/json":
            decoded: Any = json.loads(body)
        else:
            decoded = _TYPES[signal]()
            decoded.ParseFromString(body)
        with self._lock:
            self.received.append((signal, request.content_type, decoded))
        return web.Response(body=b"", content_type=request.content_type)

    def of(self, signal: str, content_type: str = "application/x-protobuf") -> list[Any]:
        with self._lock:
            return [m for s, t, m in self.received if s == signal and t == content_type]

    def spans(self) -> list[Span]:
        out = []
        for message in self.of("traces"):
            for rs in message.resource_spans:
                resource = {kv.key: value_of(kv.value) for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        out.append(
                            Span(
                                s.name,
                                s.trace_id.hex(),
                                s.span_id.hex(),
                                s.parent_span_id.hex(),
                                s.kind,
                                {kv.key: value_of(kv.value) for kv in s.attributes},
                                resource,
                                s.status.code,
                            )
                        )
        return out

    def metric_points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        """(attributes, data point) of every point of the metric ``name`` received."""
        out = []
        for message in self.of("metrics"):
            for rm in message.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name != name:
                            continue
                        data = getattr(m, m.WhichOneof("data"))
                        for p in data.data_points:
                            out.append(({kv.key: value_of(kv.value) for kv in p.attributes}, p))
        return out
