"""Every metric, defined once against an injected registry.

Label values come from config (model alias, upstream name), from fixed enums
(api, reason, stop_reason, field) or from HTTP status codes the gateway itself
chose - never from client input, so cardinality stays bounded.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from gateway import __version__

APIS = ("messages", "count_tokens", "chat", "models")
TERMINATIONS = (
    "completed", "client_disconnect", "upstream_error", "upstream_truncated", "malformed_chunk",
    "idle_timeout", "draining", "gateway_error",
)
DROPPED_FIELDS = (
    "metadata", "service_tier", "context_management", "container", "response_format", "seed",
    "min_p", "mcp_servers", "cache_control", "inference_geo", "speed", "diagnostics",
    "server_tool", "other",
)
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_FAST = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_TTFT = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        p = "llm_gateway_"
        r = registry
        self.requests = Counter(p + "requests_total", "Requests answered, by API, model and status",
                                ["api", "model", "code", "stream"], registry=r)
        self.request_duration = Histogram(p + "request_duration_seconds",
                                          "Time from request to last byte",
                                          ["api", "model", "stream"], buckets=_LATENCY, registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds",
                              "Time from request to the first content token sent",
                              ["api", "model"], buckets=_TTFT, registry=r)
        self.inter_chunk = Histogram(p + "inter_chunk_latency_seconds",
                                     "Gap between upstream stream chunks", ["model"],
                                     buckets=_FAST, registry=r)
        self.tpot = Histogram(p + "time_per_output_token_seconds",
                              "Decode time per output token after the first", ["model"],
                              buckets=_FAST, registry=r)
        self.overhead = Histogram(p + "overhead_seconds",
                                  "Gateway's own CPU-bound time per request (parse, validate, "
                                  "translate)", ["api"], buckets=_FAST, registry=r)
        self.upstream_requests = Counter(p + "upstream_requests_total",
                                         "Upstream calls by outcome (HTTP code, connect_error, "
                                         "timeout)", ["model", "upstream", "code"], registry=r)
        self.upstream_headers = Histogram(p + "upstream_response_headers_seconds",
                                          "Time until the upstream's response headers",
                                          ["model", "upstream"], buckets=_LATENCY, registry=r)
        self.tokens = Counter(p + "tokens_total", "Tokens reported by upstreams",
                              ["model", "type"], registry=r)
        self.terminations = Counter(p + "stream_terminations_total", "How streams ended",
                                    ["api", "model", "reason"], registry=r)
        self.stop_reasons = Counter(p + "stop_reasons_total", "Anthropic stop_reason of replies",
                                    ["model", "stop_reason"], registry=r)
        self.in_flight = Gauge(p + "streams_in_flight", "Streams being relayed now",
                               ["api", "model"], registry=r)
        self.rejected = Counter(p + "rejected_total", "Requests refused before any upstream call",
                                ["api", "reason"], registry=r)
        self.dropped_fields = Counter(p + "dropped_fields_total",
                                      "Request fields not forwarded upstream", ["field"], registry=r)
        self.tool_arg_errors = Counter(p + "tool_argument_errors_total",
                                       "Tool-call arguments that were not valid JSON or had no call",
                                       ["model"], registry=r)
        self.loop_lag = Gauge(p + "event_loop_lag_seconds", "Event loop scheduling lag", registry=r)
        self.build_info = Info(p + "build", "Gateway build", registry=r)
        self.build_info.info({"version": __version__})
        self.model_info = Gauge(p + "model_info", "Configured model routes",
                                ["model", "upstream", "upstream_model"], registry=r)

    def drop_field(self, name: str) -> None:
        self.dropped_fields.labels(name if name in DROPPED_FIELDS else "other").inc()
