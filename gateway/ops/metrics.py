"""Every metric, defined once against an injected registry.

Naming follows Prometheus practice: the ``llm_gateway_`` prefix, base units in
the name (``_seconds``), ``_total`` on counters, ``_info`` on constant-1
metadata series. Label values come from config (model alias, upstream name,
upstream model), from the fixed enums below (api, reason, stop_reason, field)
or from HTTP status codes - never from client input, so cardinality stays
bounded by the config.

Series whose label values are known in advance are created at zero (the
fixed-enum ones here, the per-model ones in :meth:`Metrics.add_model`): a
counter that first appears already incremented hides that increment from
``rate()``, and a missing series shows as "no data" instead of 0.

The process collectors (``process_resident_memory_bytes`` and friends) are
registered by the app next to these, on the same registry. With ``--workers``
a process collector would describe only the worker that happens to answer the
scrape (CPU seconds jumping between workers, which Prometheus reads as counter
resets), so each worker writes its own figures instead (:class:`WorkerProcess`):
the same ``process_*`` names, CPU as one counter summed over every worker that
ran, the gauges one series per live worker with a ``pid`` label.

No ``*_created`` series: prometheus-client's creation timestamp of every counter,
histogram and labelled child (116 of ~430 samples) is switched off once, when this
module is imported, before any metric is defined. Prometheus needs none of them to
compute ``rate()``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.values import MutexValue

from gateway import __version__
from gateway.text.refusals import CAPABILITIES

disable_created_metrics()

PREFIX = "llm_gateway_"
APIS = (
    "messages",
    "count_tokens",
    "chat",
    "completions",
    "embeddings",
    "responses",
    "models",
    "batches",
)
BATCH_OUTCOMES = ("succeeded", "errored", "retried", "superseded")
BATCH_STATUSES = ("in_progress", "canceling", "ended")
STREAM_APIS = ("messages", "chat", "completions", "responses")
TERMINATIONS = (
    "completed",
    "client_disconnect",
    "upstream_error",
    "upstream_truncated",
    "malformed_chunk",
    "idle_timeout",
    "draining",
    "gateway_error",
)
# why a call to the clients' counter store (Redis) failed
STORE_ERRORS = ("connection", "timeout", "protocol", "reply")
# why a request was refused before any upstream call
REJECTIONS = (
    "auth",
    "draining",
    "body_too_large",
    "unknown_model",
    "overloaded",
    "invalid_request",
    "model_denied",  # outside the client's models list (403)
    "rate_limited",  # over one of the client's limits (429)
    "queue_timeout",  # waited queue_timeout for a slot of a saturated model (529)
    "limits_unavailable",  # the limits' store failed, on_store_error = "closed" (529)
    "budget_spent",  # the client's daily token budget is spent (429 billing_error)
)
# Claude Code's sign-in (gateway/auth/): what became of device codes (issued; approved or
# denied on the verification page; expired, as a poll heard), what happened to tokens
# (issued for an approved code, refreshed, revoked), and why a bearer token was refused
SIGNIN_CODES = ("issued", "approved", "denied", "expired")
SIGNIN_TOKENS = ("issued", "refreshed", "revoked")
BEARER_REFUSALS = ("unknown", "revoked", "expired", "client_removed")
# how a wait for a model's slot ended (llm_gateway_model_queue_outcomes_total's outcome)
QUEUE_OUTCOMES = ("admitted", "timed_out", "left")
# request fields the gateway knows and does not forward; anything else counts as "other"
DROPPED_FIELDS = (
    "metadata",
    "service_tier",
    "context_management",
    "container",
    "response_format",
    "seed",
    "min_p",
    "mcp_servers",
    "cache_control",
    "inference_geo",
    "speed",
    "diagnostics",
    "other",
)
TOKEN_TYPES = ("input", "output")
# framing anomalies of an upstream reply (gateway/upstream/connection.py says what each is)
PROTOCOL_ERRORS = (
    "extra_bytes",
    "length_and_chunked",
    "transfer_coding",
    "http10_chunked",
    "upgrade",
    "bad_status",
    "interim_flood",
    "head_too_large",
    "content_encoding",
    "request_id_mismatch",
    "request_id_missing",
    "malformed",
)
# why accept() failed on the API listener (errno names; "other" for the rest)
ACCEPT_ERRORS = ("emfile", "enfile", "enobufs", "enomem", "other")
# HTTP a client got wrong before any handler ran (gateway/http/protocol.py says what each is), and
# the client deadlines
CLIENT_HTTP_ERRORS = (
    "line_too_long",
    "too_many_headers",
    "bad_header",
    "bad_request_line",
    "length_and_chunked",
    "bad_content_length",
    "bad_transfer_encoding",
    "bad_body",
    "tls",
    "malformed",
    "head_timeout",
    "body_timeout",
    "tls_handshake",  # with server.tls_cert_file (gateway/http/listener.py)
    "tls_handshake_timeout",
    "http_on_tls",
)

# end-to-end request time: sub-second buffered errors up to long reasoning streams
_LATENCY = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
# time to first token: edges at the usual interactive SLOs (0.5 s, 1 s, 2 s, 5 s)
_TTFT = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0)
# per-token decode time and chunk gaps: ~1 ms (tiny models) to seconds (stalls)
_TOKEN = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.035,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
# the gateway's own work: tens of microseconds to a few milliseconds
_OVERHEAD = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)


# why an upstream stream was continued (llm_gateway_stream_continuations_total's cause label)
CONTINUATION_CAUSES = ("no_finish", "inband_error", "read_failed")
# what gateway/local/ normalised in a reply (llm_gateway_local_fixes_total's fix label)
BUDGETS = ("memory", "decoding")  # gateway/ops/budget.py
LOCAL_FIXES = (
    "tool_arguments_repaired",
    "tool_arguments_unrepairable",
    "text_tool_call",
    "inline_thinking",
)


def _adder(value: Any) -> Callable[[float], None]:
    """What adds to a metric child's ``value``: its own ``inc``, or for the per-process
    value (not ``--workers``' multiprocess one) the same sum under the same lock, taken by
    ``acquire``/``release``: a ``with`` on a lock costs twice that, and the gateway adds to
    a value about twenty times a request."""
    if type(value) is not MutexValue:
        return value.inc  # type: ignore[no-any-return]
    acquire = value._lock.acquire
    release = value._lock.release

    def add(amount: float) -> None:
        acquire()
        try:
            value._value += amount
        finally:
            release()

    return add


class _Observer:
    """A histogram child whose ``observe`` finds the bucket by bisection.

    prometheus-client's ``observe`` walks the bounds in Python (up to 16 steps here) and
    checks the metric's type again; this one does what it does, in one C call, on the
    child's own values (per-process or multiprocess alike). Everything else is the child's.
    """

    __slots__ = ("_bounds", "_buckets", "_sum", "child")

    def __init__(self, child: Histogram) -> None:
        self.child = child
        self._bounds = list(child._upper_bounds)  # ends with +Inf: every amount has a bucket
        self._buckets = [_adder(b) for b in child._buckets]
        self._sum = _adder(child._sum)

    def observe(self, amount: float) -> None:
        self._sum(amount)
        self._buckets[bisect_left(self._bounds, amount)](1)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.child, name)


class _Count:
    """A counter child whose ``inc`` goes straight to the child's value.

    prometheus-client's ``inc`` checks the metric's type again and for an exemplar on every
    call; the gateway counts a dozen times a request. The value is the child's own (its lock,
    per-process or multiprocess alike); everything else is the child's.
    """

    __slots__ = ("_add", "child")

    def __init__(self, child: Counter) -> None:
        self.child = child
        self._add = _adder(child._value)

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._add(amount)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.child, name)


class _Level:
    """A gauge child whose ``inc``, ``dec`` and ``set`` go straight to the child's value
    (as :class:`_Count`; no gauge here is in ``mostrecent`` mode, which needs a timestamp)."""

    __slots__ = ("_add", "_value", "child")

    def __init__(self, child: Gauge) -> None:
        self.child = child
        self._value = child._value
        self._add = _adder(child._value)

    def inc(self, amount: float = 1) -> None:
        self._add(amount)

    def dec(self, amount: float = 1) -> None:
        self._add(-amount)

    def set(self, value: float) -> None:
        self._value.set(float(value))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.child, name)


class _Memo:
    """A metric whose ``labels()`` children are cached by label values.

    prometheus-client validates and locks on every ``labels()`` call (several us); the
    gateway asks for the same few children on every request. Label values are bounded
    (config values, fixed enums, status codes), so the cache is too.
    """

    __slots__ = ("_children", "metric")

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self.metric.labels(*values)
            if isinstance(child, Histogram):
                child = _Observer(child)
            elif isinstance(child, Counter):
                child = _Count(child)
            elif isinstance(child, Gauge) and not child._is_most_recent:
                child = _Level(child)
            self._children[values] = child
        return child

    def remove(self, *values: str) -> None:
        """Stop exposing one child's series (a replica that left)."""
        if self._children.pop(values, None) is not None:
            self.metric.remove(*values)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.metric, name)


class WorkerProcess:
    """A ``--workers`` worker's process figures, as multiprocess metrics.

    :meth:`sample` runs on the app's 0.5 s probe timer and copies what prometheus-client's
    own ``ProcessCollector`` reads from ``/proc/self`` into metrics that every worker's
    ``/metrics`` serves alike: ``process_cpu_seconds_total`` is a counter, increased by the
    CPU time used since the last sample and summed over every worker that ever ran (a
    replaced worker's seconds stay counted, so the sum never goes down); the gauges are
    ``liveall``, one series per live worker labelled ``pid``. The supervisor's own few
    milliseconds of CPU are not counted.
    """

    _GAUGES = (
        ("process_resident_memory_bytes", "Resident memory size in bytes, per worker"),
        ("process_virtual_memory_bytes", "Virtual memory size in bytes, per worker"),
        ("process_open_fds", "Number of open file descriptors, per worker"),
        ("process_max_fds", "Maximum number of open file descriptors, per worker"),
        (
            "process_start_time_seconds",
            "Start time of the worker since unix epoch in seconds, per worker",
        ),
    )

    def __init__(self, registry: CollectorRegistry) -> None:
        self._collector = ProcessCollector(registry=None)
        self._cpu_seen = 0.0
        self.cpu = Counter(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds, all workers",
            registry=registry,
        )
        self.gauges = {
            name: Gauge(name, doc, registry=registry, multiprocess_mode="liveall")
            for name, doc in self._GAUGES
        }
        self.sample()

    def sample(self) -> None:
        for family in self._collector.collect():  # nothing where /proc is missing
            for sample in family.samples:
                if sample.name == "process_cpu_seconds_total":
                    if sample.value > self._cpu_seen:
                        self.cpu.inc(sample.value - self._cpu_seen)
                        self._cpu_seen = sample.value
                elif (gauge := self.gauges.get(sample.name)) is not None:
                    gauge.set(sample.value)


# the web_search_tool_result_error codes (gateway/messages/search_blocks.py: ERROR_CODES)
WEB_SEARCH_ERROR_CODES = (
    "invalid_tool_input",
    "unavailable",
    "max_uses_exceeded",
    "too_many_requests",
    "query_too_long",
    "request_too_large",
)

# the web_fetch_tool_result_error codes (gateway/messages/fetch_blocks.py: ERROR_CODES)
WEB_FETCH_ERROR_CODES = (
    "invalid_tool_input",
    "url_too_long",
    "url_not_allowed",
    "url_not_in_prior_context",
    "url_not_accessible",
    "unsupported_content_type",
    "too_many_requests",
    "max_uses_exceeded",
    "unavailable",
    "content_too_large",
)


class Metrics:
    """The gateway's metrics on ``registry``; attribute names are what the handlers use.

    ``per_worker_process``: with ``--workers``, also define :class:`WorkerProcess`
    (``self.process``), whose ``sample()`` the app's probe timer calls.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        info_registry: CollectorRegistry | None = None,
        *,
        per_worker_process: bool = False,
    ) -> None:
        self.registry = registry
        self.process = WorkerProcess(registry) if per_worker_process else None
        p = PREFIX
        r = registry
        self.requests = _Memo(
            Counter(
                p + "requests_total",
                "Requests answered, by API, model alias, HTTP status and stream",
                ["api", "model", "code", "stream"],
                registry=r,
            )
        )
        self.request_duration = _Memo(
            Histogram(
                p + "request_duration_seconds",
                "Time from request arrival to the last byte sent",
                ["api", "model", "stream"],
                buckets=_LATENCY,
                registry=r,
            )
        )
        self.ttft = _Memo(
            Histogram(
                p + "time_to_first_token_seconds",
                "Time from request arrival to the first content token sent to the client",
                ["api", "model"],
                buckets=_TTFT,
                registry=r,
            )
        )
        self.inter_chunk = _Memo(
            Histogram(
                p + "inter_chunk_latency_seconds",
                "Gap between consecutive upstream stream chunks",
                ["model"],
                buckets=_TOKEN,
                registry=r,
            )
        )
        self.tpot = _Memo(
            Histogram(
                p + "time_per_output_token_seconds",
                "Mean decode time per output token after the first, per stream",
                ["model"],
                buckets=_TOKEN,
                registry=r,
            )
        )
        self.overhead = _Memo(
            Histogram(
                p + "overhead_seconds",
                "Gateway's own time per request: parse, validate and translate, excluding upstream",
                ["api"],
                buckets=_OVERHEAD,
                registry=r,
            )
        )
        self.upstream_requests = _Memo(
            Counter(
                p + "upstream_requests_total",
                "Upstream calls by outcome: HTTP status, connect_error or timeout before headers",
                ["model", "upstream", "code"],
                registry=r,
            )
        )
        self.upstream_headers = _Memo(
            Histogram(
                p + "upstream_response_headers_seconds",
                "Time from sending the upstream request to its response headers",
                ["model", "upstream"],
                buckets=_LATENCY,
                registry=r,
            )
        )
        self.tokens = _Memo(
            Counter(
                p + "tokens_total",
                "Tokens reported in upstream usage, by type input or output",
                ["model", "type"],
                registry=r,
            )
        )
        # per named client ([[clients]]): the label is a configured name or "anonymous"
        # (gateway/tenancy/clients.py), counted only when clients are configured
        self.client_requests = _Memo(
            Counter(
                p + "client_requests_total",
                "Requests answered per client, by model alias and HTTP status",
                ["client", "model", "code"],
                registry=r,
            )
        )
        # requests carrying a proxy's identity headers (gateway/tenancy/forwarding.py), by
        # what became of them: named, unnamed (the forwarder's own), ignored (untrusted)
        self.forwarded_identities = _Memo(
            Counter(
                p + "forwarded_identities_total",
                "Requests carrying x-claude-gateway-user-id or -email, by outcome: named "
                "(a client's), unnamed (the forwarder's own), ignored (not trusted)",
                ["outcome"],
                registry=r,
            )
        )
        self.client_tokens = _Memo(
            Counter(
                p + "client_tokens_total",
                "Tokens of replies per client, by model alias and type: input (not read from "
                "cache), output or cache_read",
                ["client", "model", "type"],
                registry=r,
            )
        )
        self.terminations = _Memo(
            Counter(
                p + "stream_terminations_total",
                "Streams ended, by how they ended",
                ["api", "model", "reason"],
                registry=r,
            )
        )
        self.stop_reasons = _Memo(
            Counter(
                p + "stop_reasons_total",
                "Anthropic stop_reason of finished replies",
                ["model", "stop_reason"],
                registry=r,
            )
        )
        # multiprocess_mode only matters with --workers (prometheus multiprocess mode):
        # live workers' values are summed (in flight) or maxed (lag, constant-1 info)
        self.in_flight = _Memo(
            Gauge(
                p + "streams_in_flight",
                "Streams being relayed to clients now",
                ["api", "model"],
                registry=r,
                multiprocess_mode="livesum",
            )
        )
        self.rejected = _Memo(
            Counter(
                p + "rejected_total",
                "Requests refused before any upstream call, by reason",
                ["api", "reason"],
                registry=r,
            )
        )
        self.limits_store_errors = _Memo(
            Counter(
                p + "limits_store_errors_total",
                "Calls to the clients' counter store (Redis) that failed, by kind",
                ["kind"],
                registry=r,
            )
        )
        self.dropped_fields = _Memo(
            Counter(
                p + "dropped_fields_total",
                "Client request fields not forwarded upstream",
                ["field"],
                registry=r,
            )
        )
        self.tool_arg_errors = _Memo(
            Counter(
                p + "tool_argument_errors_total",
                "Tool-call argument pieces that belonged to no named call or came after its block "
                "closed, dropped (arguments that are not JSON are repaired: local_fixes_total)",
                ["model"],
                registry=r,
            )
        )
        self.stream_continuations = _Memo(
            Counter(
                p + "stream_continuations_total",
                "Upstream streams cut mid-answer and continued (the same request sent again with "
                "the partial answer as a prefill), by cause: no_finish, inband_error, read_failed",
                ["model", "cause"],
                registry=r,
            )
        )
        self.local_fixes = _Memo(
            Counter(
                p + "local_fixes_total",
                "Replies a local engine sent in a shape the gateway normalised, by fix: tool "
                "arguments repaired or unrepairable, tool calls written as text, inline <think>",
                ["model", "fix"],
                registry=r,
            )
        )
        self.reasoning_hidden = _Memo(
            Counter(
                p + "reasoning_hidden_total",
                "Replies whose upstream reasoned although no thinking was asked for; the "
                "reasoning was not shown",
                ["model"],
                registry=r,
            )
        )
        self.capability_fallbacks = _Memo(
            Counter(
                p + "capability_fallbacks_total",
                "Requests an upstream refused for content it cannot take (images, tool_reference "
                "parts), sent again with that content as text; the route then sends it as text",
                ["model", "capability"],
                registry=r,
            )
        )
        self.fallbacks = _Memo(
            Counter(
                p + "fallbacks_total",
                "Messages requests sent to a fallback model (fallback: its configured name) after "
                "every replica of the model's upstream failed before replying",
                ["model", "fallback"],
                registry=r,
            )
        )
        self.upstream_protocol_errors = _Memo(
            Counter(
                p + "upstream_protocol_errors_total",
                "Upstream replies that broke HTTP framing, by kind; each closed the upstream's "
                "idle connections",
                ["upstream", "kind"],
                registry=r,
            )
        )
        self.upstream_connections = _Memo(
            Gauge(
                p + "upstream_connections",
                "Connections open to the upstream now, busy or idle",
                ["upstream"],
                registry=r,
                multiprocess_mode="livesum",
            )
        )
        self.upstream_keepalive = _Memo(
            Gauge(
                p + "upstream_keepalive",
                "1 while requests to the upstream reuse connections (keepalive always, or auto "
                "once its replies have echoed X-Request-Id), 0 while each gets a fresh one",
                ["upstream"],
                registry=r,
                multiprocess_mode="livemax",
            )
        )
        # replicas (gateway/upstream/replicas.py): ``replica`` is host:port from base_urls
        self.upstream_replica_in_flight = _Memo(
            Gauge(
                p + "upstream_replica_in_flight",
                "Requests on the upstream replica now, from the send until the reply is read",
                ["upstream", "replica"],
                registry=r,
                multiprocess_mode="livesum",
            )
        )
        self.upstream_replica_healthy = _Memo(
            Gauge(
                p + "upstream_replica_healthy",
                "1 while the replica takes requests, 0 while it is ejected after a failure",
                ["upstream", "replica"],
                registry=r,
                multiprocess_mode="livemin",
            )
        )
        self.upstream_replica_requests = _Memo(
            Counter(
                p + "upstream_replica_requests_total",
                "Attempts sent to each replica, by outcome: ok (it answered, 2xx-4xx), status_5xx, "
                "connect_error, timeout, bad_response",
                ["upstream", "replica", "outcome"],
                registry=r,
            )
        )
        # the fleet (gateway/upstream/discovery.py, fleet.py): ``replica`` of a DNS-found
        # replica is the name's host:port and a slot number (#0, #1, ...; at most twice
        # max_replicas), the address in the upstream_replicas_changed log line
        self.upstream_replicas = _Memo(
            Gauge(
                p + "upstream_replicas",
                "Replicas of the upstream taking requests now: its base_urls, or the addresses its "
                "DNS name resolved to (discover = dns, at most max_replicas)",
                ["upstream"],
                registry=r,
                multiprocess_mode="livemax",
            )
        )
        self.upstream_resolutions = _Memo(
            Counter(
                p + "upstream_resolutions_total",
                "DNS resolutions of the upstream's name (discover = dns), by outcome: ok, failed "
                "(an error or a timeout), empty (no address); failed and empty keep the last set",
                ["upstream", "outcome"],
                registry=r,
            )
        )
        self.upstream_probes = _Memo(
            Counter(
                p + "upstream_probes_total",
                "Active health probes of each replica (health_interval), by outcome: ok (2xx), "
                "status (another status), timeout, error (no connection, no status line)",
                ["upstream", "replica", "outcome"],
                registry=r,
            )
        )
        self.upstream_retries = _Memo(
            Counter(
                p + "upstream_retries_total",
                "Requests sent to another replica after a failure before the reply's head",
                ["upstream"],
                registry=r,
            )
        )
        self.client_connections = Gauge(
            p + "client_connections",
            "Client connections open now, both listeners",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.accept_errors = _Memo(
            Counter(
                p + "accept_errors_total",
                "accept() failures on a listener, by errno; each pauses accepting for a second",
                ["reason"],
                registry=r,
            )
        )
        # the web_search server tool (gateway/tools/); backend: "searxng"
        self.web_searches = _Memo(
            Counter(
                p + "web_searches_total",
                "Web searches run for the web_search tool, by backend and outcome (ok, error)",
                ["backend", "outcome"],
                registry=r,
            )
        )
        self.web_search_errors = _Memo(
            Counter(
                p + "web_search_errors_total",
                "Web searches that failed, by backend and the web_search_tool_result_error code "
                "the reply carries (unavailable, too_many_requests, query_too_long, ...)",
                ["backend", "error_code"],
                registry=r,
            )
        )
        self.web_search_duration = _Memo(
            Histogram(
                p + "web_search_duration_seconds",
                "Time one web search took at its backend, answer read and decoded",
                ["backend"],
                buckets=_LATENCY,
                registry=r,
            )
        )
        # the web_fetch server tool (gateway/tools/web_fetch/), by the reply's upstream model
        self.web_fetches = _Memo(
            Counter(
                p + "web_fetches_total",
                "Web fetches asked for by the model, by upstream model and outcome: ok, or "
                "the web_fetch_tool_result_error code (url_not_in_prior_context, ...)",
                ["model", "outcome"],
                registry=r,
            )
        )
        self.web_fetch_duration = _Memo(
            Histogram(
                p + "web_fetch_duration_seconds",
                "Time one web fetch took, page read and its text extracted",
                ["model"],
                buckets=_LATENCY,
                registry=r,
            )
        )
        # Message Batches (gateway/batches/)
        self.batches_created = Counter(
            p + "batches_created_total", "Message batches created", registry=r
        )
        self.batch_requests = _Memo(
            Counter(
                p + "batch_requests_total",
                "Batch requests run on an upstream, by outcome: succeeded, errored (the request's "
                "result is an error), retried (a retryable failure: run again later), superseded "
                "(the result came after the request was canceled, expired or claimed again)",
                ["model", "outcome"],
                registry=r,
            )
        )
        # requests waiting for a slot of a saturated model (models[].queue_timeout)
        self.queue_length = _Memo(
            Gauge(
                p + "model_queue_requests",
                "Requests waiting for a slot of a model at its max_concurrency, by model",
                ["model"],
                registry=r,
                multiprocess_mode="livesum",
            )
        )
        self.queue_wait = _Memo(
            Histogram(
                p + "model_queue_wait_seconds",
                "Time a request admitted after a wait waited for its slot, by model and client",
                ["model", "client"],
                buckets=_LATENCY,
                registry=r,
            )
        )
        self.queue_outcomes = _Memo(
            Counter(
                p + "model_queue_outcomes_total",
                "Requests that waited for a slot, by model and how the wait ended",
                ["model", "outcome"],
                registry=r,
            )
        )
        self.batch_queue = _Memo(
            Gauge(
                p + "batch_queue_requests",
                "Batch requests waiting or running, all batches, by model (from the store)",
                ["model"],
                registry=r,
                multiprocess_mode="max",
            )
        )
        self.batches = _Memo(
            Gauge(
                p + "batches",
                "Message batches in the store, by processing status",
                ["status"],
                registry=r,
                multiprocess_mode="max",
            )
        )
        self.batch_in_flight = _Memo(
            Gauge(
                p + "batch_requests_in_flight",
                "Batch requests running on an upstream now",
                ["upstream"],
                registry=r,
                multiprocess_mode="livesum",
            )
        )
        self.client_http_errors = _Memo(
            Counter(
                p + "client_http_errors_total",
                "Requests refused for broken HTTP framing, and client deadlines missed, by kind",
                ["kind"],
                registry=r,
            )
        )
        # SIGHUP: the config re-read (gateway/http/reload.py); result: ok, failed
        self.config_reloads = _Memo(
            Counter(
                p + "config_reloads_total",
                "Config re-reads on SIGHUP: ok (the clients and keys replaced) or failed "
                "(the file refused; the previous ones kept)",
                ["result"],
                registry=r,
            )
        )
        # the sign-in (gateway/auth/): codes, tokens, refused bearers (see SIGNIN_CODES)
        self.signin_codes = _Memo(
            Counter(
                p + "signin_device_codes_total",
                "Sign-in device codes by outcome: issued, approved or denied on the "
                "verification page, expired (a poll heard expired_token)",
                ["outcome"],
                registry=r,
            )
        )
        self.signin_tokens = _Memo(
            Counter(
                p + "signin_tokens_total",
                "Sign-in tokens: issued for an approved code, refreshed, revoked (a sign-in's "
                "access and refresh token, at the revocation endpoint or for a reused refresh "
                "token)",
                ["event"],
                registry=r,
            )
        )
        self.signin_refused = _Memo(
            Counter(
                p + "signin_bearer_refused_total",
                "Requests refused (401) for their sign-in bearer token: unknown, revoked, "
                "expired, or its client no longer configured",
                ["reason"],
                registry=r,
            )
        )
        # process-wide memory budgets (gateway/ops/budget.py); budget: memory, decoding
        self.budget_held = _Memo(
            Gauge(
                p + "memory_budget_bytes",
                "Bytes requests in flight hold now, as counted in each memory budget",
                ["budget"],
                registry=r,
                multiprocess_mode="livesum",
            )
        )
        self.budget_limit = _Memo(
            Gauge(
                p + "memory_budget_limit_bytes",
                "Each memory budget's limit (configured)",
                ["budget"],
                registry=r,
                multiprocess_mode="livemax",
            )
        )
        self.budget_sheds = _Memo(
            Counter(
                p + "memory_budget_sheds_total",
                "Requests refused with 529 overloaded_error because a memory budget was full",
                ["budget"],
                registry=r,
            )
        )
        self.loop_lag = _Memo(
            Gauge(
                p + "event_loop_lag_seconds",
                "How late the event loop ran a timer, last probe",
                registry=r,
                multiprocess_mode="livemax",
            )
        )
        # Info metrics have no multiprocess storage: with --workers, build info goes on the
        # exposition registry itself (info_registry), which every worker serves alike.
        self.build_info = Info(
            p + "build",
            "Gateway build; constant 1",
            registry=info_registry if info_registry is not None else r,
        )
        self.build_info.info({"version": __version__})
        self.model_info = _Memo(
            Gauge(
                p + "model_info",
                "Configured model routes; constant 1",
                ["model", "upstream", "upstream_model"],
                registry=r,
                multiprocess_mode="max",
            )
        )
        for api in APIS:
            for reason in REJECTIONS:
                self.rejected.labels(api, reason)
        for name in DROPPED_FIELDS:
            self.dropped_fields.labels(name)
        for kind in STORE_ERRORS:
            self.limits_store_errors.labels(kind)
        for reason in ACCEPT_ERRORS:
            self.accept_errors.labels(reason)
        for kind in CLIENT_HTTP_ERRORS:
            self.client_http_errors.labels(kind)
        for result in ("ok", "failed"):
            self.config_reloads.labels(result)
        for status in BATCH_STATUSES:
            self.batches.labels(status)
        for budget in BUDGETS:
            self.budget_held.labels(budget)
            self.budget_sheds.labels(budget)
        for outcome in SIGNIN_CODES:
            self.signin_codes.labels(outcome)
        for event in SIGNIN_TOKENS:
            self.signin_tokens.labels(event)
        for reason in BEARER_REFUSALS:
            self.signin_refused.labels(reason)

    def add_model(
        self, model: str, upstream: str, upstream_model: str, fallbacks: tuple[str, ...] = ()
    ) -> None:
        """Publish a configured route and create its per-model series at zero."""
        for fallback in fallbacks:
            self.fallbacks.labels(model, fallback)
        self.model_info.labels(model, upstream, upstream_model).set(1)
        for kind in TOKEN_TYPES:
            self.tokens.labels(model, kind)
        for outcome in BATCH_OUTCOMES:
            self.batch_requests.labels(model, outcome)
        self.batch_queue.labels(model)
        for api in STREAM_APIS:
            self.in_flight.labels(api, model)
            for reason in TERMINATIONS:
                self.terminations.labels(api, model, reason)
        self.tool_arg_errors.labels(model)
        for fix in LOCAL_FIXES:
            self.local_fixes.labels(model, fix)
        for cause in CONTINUATION_CAUSES:
            self.stream_continuations.labels(model, cause)
        self.reasoning_hidden.labels(model)
        for capability in CAPABILITIES:
            self.capability_fallbacks.labels(model, capability)

    def add_queue(self, model: str) -> None:
        """Create the wait series of a model with a queue_timeout at zero (the client label
        of the wait histogram is created as clients wait: their configured names)."""
        self.queue_length.labels(model)
        for outcome in QUEUE_OUTCOMES:
            self.queue_outcomes.labels(model, outcome)

    def count_tokens(self, model: str, usage: tuple[int, int] | None) -> None:
        """Count a reply's (input, output) tokens, buffered or streamed, for every API."""
        if usage is not None:
            self.tokens.labels(model, "input").inc(usage[0])
            self.tokens.labels(model, "output").inc(usage[1])

    def add_upstream(self, upstream: str) -> None:
        """Create a configured upstream's per-upstream series at zero."""
        for kind in PROTOCOL_ERRORS:
            self.upstream_protocol_errors.labels(upstream, kind)
        self.batch_in_flight.labels(upstream)

    def add_web_search_backend(self, backend: str) -> None:
        """Create a configured web search backend's series at zero (every error code)."""
        for outcome in ("ok", "error"):
            self.web_searches.labels(backend, outcome)
        for code in WEB_SEARCH_ERROR_CODES:
            self.web_search_errors.labels(backend, code)
        self.web_search_duration.labels(backend)

    def drop_field(self, name: str) -> None:
        """Count a dropped request field; unknown names (client input) count as ``other``."""
        self.dropped_fields.labels(name if name in DROPPED_FIELDS else "other").inc()
