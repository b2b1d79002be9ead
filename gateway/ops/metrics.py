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
registered by the app next to these, on the same registry; with ``--workers`` each
worker writes its own figures instead (gateway/ops/metrics_workers.py).

:class:`Metrics` declares its families area by area (one method each: requests,
clients, replies, upstreams, listeners, server tools, batches, HTTP, sign-in,
process), with gateway/ops/metric_kinds.py's ``Families``: each family a ``Memo``,
whose cached children are what the hot path writes to. The order of the families is
the order of the exposition.

No ``*_created`` series: prometheus-client's creation timestamp of every counter,
histogram and labelled child (116 of ~430 samples) is switched off once, when this
module is imported, before any metric is defined. Prometheus needs none of them to
compute ``rate()``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, disable_created_metrics

from gateway import __version__
from gateway.ops.metric_kinds import Families
from gateway.ops.metrics_workers import WorkerProcess
from gateway.ops.reply_series import ReplySeries
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
        self._reply_series: dict[tuple[str, str], ReplySeries] = {}
        f = Families(registry, PREFIX)
        self._requests(f)
        self._clients(f)
        self._replies(f)
        self._upstreams(f)
        self._listeners(f)
        self._server_tools(f)
        self._batches(f)
        self._http(f)
        self._signin(f)
        self._process(f, info_registry)

    def _requests(self, f: Families) -> None:
        """Requests end to end: counted, timed, their upstream calls and tokens."""
        self.requests = f.counter(
            "requests_total",
            "Requests answered, by API, model alias, HTTP status and stream",
            ["api", "model", "code", "stream"],
            one_writer=True,
        )
        self.request_duration = f.histogram(
            "request_duration_seconds",
            "Time from request arrival to the last byte sent",
            ["api", "model", "stream"],
            _LATENCY,
            one_writer=True,
        )
        self.ttft = f.histogram(
            "time_to_first_token_seconds",
            "Time from request arrival to the first content token sent to the client",
            ["api", "model"],
            _TTFT,
            one_writer=True,
        )
        self.inter_chunk = f.histogram(
            "inter_chunk_latency_seconds",
            "Gap between consecutive upstream stream chunks",
            ["model"],
            _TOKEN,
        )
        self.tpot = f.histogram(
            "time_per_output_token_seconds",
            "Mean decode time per output token after the first, per stream",
            ["model"],
            _TOKEN,
            one_writer=True,
        )
        self.overhead = f.histogram(
            "overhead_seconds",
            "Gateway's own time per request: parse, validate and translate, excluding upstream",
            ["api"],
            _OVERHEAD,
            one_writer=True,
        )
        self.upstream_requests = f.counter(
            "upstream_requests_total",
            "Upstream calls by outcome: HTTP status, connect_error or timeout before headers",
            ["model", "upstream", "code"],
            one_writer=True,
        )
        self.upstream_headers = f.histogram(
            "upstream_response_headers_seconds",
            "Time from sending the upstream request to its response headers",
            ["model", "upstream"],
            _LATENCY,
            one_writer=True,
        )
        self.tokens = f.counter(
            "tokens_total",
            "Tokens reported in upstream usage, by type input or output",
            ["model", "type"],
            one_writer=True,
        )

    def _clients(self, f: Families) -> None:
        """Per named client ([[clients]]) and the forwarded identities."""
        # per named client ([[clients]]): the label is a configured name or "anonymous"
        # (gateway/tenancy/clients.py), counted only when clients are configured
        self.client_requests = f.counter(
            "client_requests_total",
            "Requests answered per client, by model alias and HTTP status",
            ["client", "model", "code"],
            one_writer=True,
        )
        # requests carrying a proxy's identity headers (gateway/tenancy/forwarding.py), by
        # what became of them: named, unnamed (the forwarder's own), ignored (untrusted)
        self.forwarded_identities = f.counter(
            "forwarded_identities_total",
            "Requests carrying x-claude-gateway-user-id or -email, by outcome: named "
            "(a client's), unnamed (the forwarder's own), ignored (not trusted)",
            ["outcome"],
        )
        self.client_tokens = f.counter(
            "client_tokens_total",
            "Tokens of replies per client, by model alias and type: input (not read from "
            "cache), output or cache_read",
            ["client", "model", "type"],
        )

    def _replies(self, f: Families) -> None:
        """How streams ended, requests refused before any upstream call, and what the
        gateway changed on the way (dropped fields, repairs, continuations, fallbacks)."""
        self.terminations = f.counter(
            "stream_terminations_total",
            "Streams ended, by how they ended",
            ["api", "model", "reason"],
            one_writer=True,
        )
        self.stop_reasons = f.counter(
            "stop_reasons_total",
            "Anthropic stop_reason of finished replies",
            ["model", "stop_reason"],
            one_writer=True,
        )
        # multiprocess_mode only matters with --workers (prometheus multiprocess mode):
        # live workers' values are summed (in flight) or maxed (lag, constant-1 info)
        self.in_flight = f.gauge(
            "streams_in_flight",
            "Streams being relayed to clients now",
            ["api", "model"],
            "livesum",
            one_writer=True,
        )
        self.rejected = f.counter(
            "rejected_total",
            "Requests refused before any upstream call, by reason",
            ["api", "reason"],
        )
        self.limits_store_errors = f.counter(
            "limits_store_errors_total",
            "Calls to the clients' counter store (Redis) that failed, by kind",
            ["kind"],
        )
        self.dropped_fields = f.counter(
            "dropped_fields_total", "Client request fields not forwarded upstream", ["field"]
        )
        self.tool_arg_errors = f.counter(
            "tool_argument_errors_total",
            "Tool-call argument pieces that belonged to no named call or came after its block "
            "closed, dropped (arguments that are not JSON are repaired: local_fixes_total)",
            ["model"],
        )
        self.stream_continuations = f.counter(
            "stream_continuations_total",
            "Upstream streams cut mid-answer and continued (the same request sent again with "
            "the partial answer as a prefill), by cause: no_finish, inband_error, read_failed",
            ["model", "cause"],
        )
        self.local_fixes = f.counter(
            "local_fixes_total",
            "Replies a local engine sent in a shape the gateway normalised, by fix: tool "
            "arguments repaired or unrepairable, tool calls written as text, inline <think>",
            ["model", "fix"],
        )
        self.reasoning_hidden = f.counter(
            "reasoning_hidden_total",
            "Replies whose upstream reasoned although no thinking was asked for; the "
            "reasoning was not shown",
            ["model"],
            one_writer=True,
        )
        self.capability_fallbacks = f.counter(
            "capability_fallbacks_total",
            "Requests an upstream refused for content it cannot take (images, tool_reference "
            "parts), sent again with that content as text; the route then sends it as text",
            ["model", "capability"],
        )
        self.fallbacks = f.counter(
            "fallbacks_total",
            "Messages requests sent to a fallback model (fallback: its configured name) after "
            "every replica of the model's upstream failed before replying",
            ["model", "fallback"],
        )
        for api in APIS:
            for reason in REJECTIONS:
                self.rejected.labels(api, reason)
        for name in DROPPED_FIELDS:
            self.dropped_fields.labels(name)
        for kind in STORE_ERRORS:
            self.limits_store_errors.labels(kind)

    def _upstreams(self, f: Families) -> None:
        """The upstreams: framing errors, connections, replicas, fleets and probes."""
        self.upstream_protocol_errors = f.counter(
            "upstream_protocol_errors_total",
            "Upstream replies that broke HTTP framing, by kind; each closed the upstream's "
            "idle connections",
            ["upstream", "kind"],
        )
        self.upstream_connections = f.gauge(
            "upstream_connections",
            "Connections open to the upstream now, busy or idle",
            ["upstream"],
            "livesum",
        )
        self.upstream_keepalive = f.gauge(
            "upstream_keepalive",
            "1 while requests to the upstream reuse connections (keepalive always, or auto "
            "once its replies have echoed X-Request-Id), 0 while each gets a fresh one",
            ["upstream"],
            "livemax",
        )
        # replicas (gateway/upstream/replicas.py): ``replica`` is host:port from base_urls
        self.upstream_replica_in_flight = f.gauge(
            "upstream_replica_in_flight",
            "Requests on the upstream replica now, from the send until the reply is read",
            ["upstream", "replica"],
            "livesum",
            one_writer=True,
        )
        self.upstream_replica_healthy = f.gauge(
            "upstream_replica_healthy",
            "1 while the replica takes requests, 0 while it is ejected after a failure",
            ["upstream", "replica"],
            "livemin",
        )
        self.upstream_replica_requests = f.counter(
            "upstream_replica_requests_total",
            "Attempts sent to each replica, by outcome: ok (it answered, 2xx-4xx), status_5xx, "
            "connect_error, timeout, bad_response",
            ["upstream", "replica", "outcome"],
            one_writer=True,
        )
        # the fleet (gateway/upstream/discovery.py, fleet.py): ``replica`` of a DNS-found
        # replica is the name's host:port and a slot number (#0, #1, ...; at most twice
        # max_replicas), the address in the upstream_replicas_changed log line
        self.upstream_replicas = f.gauge(
            "upstream_replicas",
            "Replicas of the upstream taking requests now: its base_urls, or the addresses its "
            "DNS name resolved to (discover = dns, at most max_replicas)",
            ["upstream"],
            "livemax",
        )
        self.upstream_resolutions = f.counter(
            "upstream_resolutions_total",
            "DNS resolutions of the upstream's name (discover = dns), by outcome: ok, failed "
            "(an error or a timeout), empty (no address); failed and empty keep the last set",
            ["upstream", "outcome"],
        )
        self.upstream_probes = f.counter(
            "upstream_probes_total",
            "Active health probes of each replica (health_interval), by outcome: ok (2xx), "
            "status (another status), timeout, error (no connection, no status line)",
            ["upstream", "replica", "outcome"],
        )
        self.upstream_retries = f.counter(
            "upstream_retries_total",
            "Requests sent to another replica after a failure before the reply's head",
            ["upstream"],
        )

    def _listeners(self, f: Families) -> None:
        """The listeners: client connections and accept() failures."""
        self.client_connections = Gauge(
            f.prefix + "client_connections",
            "Client connections open now, both listeners",
            registry=f.registry,
            multiprocess_mode="livesum",
        )
        self.accept_errors = f.counter(
            "accept_errors_total",
            "accept() failures on a listener, by errno; each pauses accepting for a second",
            ["reason"],
        )
        for reason in ACCEPT_ERRORS:
            self.accept_errors.labels(reason)

    def _server_tools(self, f: Families) -> None:
        """The server tools the gateway runs itself: web_search and web_fetch."""
        # the web_search server tool (gateway/tools/); backend: "searxng"
        self.web_searches = f.counter(
            "web_searches_total",
            "Web searches run for the web_search tool, by backend and outcome (ok, error)",
            ["backend", "outcome"],
        )
        self.web_search_errors = f.counter(
            "web_search_errors_total",
            "Web searches that failed, by backend and the web_search_tool_result_error code "
            "the reply carries (unavailable, too_many_requests, query_too_long, ...)",
            ["backend", "error_code"],
        )
        self.web_search_duration = f.histogram(
            "web_search_duration_seconds",
            "Time one web search took at its backend, answer read and decoded",
            ["backend"],
            _LATENCY,
        )
        # the web_fetch server tool (gateway/tools/web_fetch/), by the reply's upstream model
        self.web_fetches = f.counter(
            "web_fetches_total",
            "Web fetches asked for by the model, by upstream model and outcome: ok, or "
            "the web_fetch_tool_result_error code (url_not_in_prior_context, ...)",
            ["model", "outcome"],
        )
        self.web_fetch_duration = f.histogram(
            "web_fetch_duration_seconds",
            "Time one web fetch took, page read and its text extracted",
            ["model"],
            _LATENCY,
        )

    def _batches(self, f: Families) -> None:
        """Message Batches, and the model queues (requests waiting for a slot)."""
        # Message Batches (gateway/batches/)
        self.batches_created = Counter(
            f.prefix + "batches_created_total", "Message batches created", registry=f.registry
        )
        self.batch_requests = f.counter(
            "batch_requests_total",
            "Batch requests run on an upstream, by outcome: succeeded, errored (the request's "
            "result is an error), retried (a retryable failure: run again later), superseded "
            "(the result came after the request was canceled, expired or claimed again)",
            ["model", "outcome"],
        )
        # requests waiting for a slot of a saturated model (models[].queue_timeout)
        self.queue_length = f.gauge(
            "model_queue_requests",
            "Requests waiting for a slot of a model at its max_concurrency, by model",
            ["model"],
            "livesum",
        )
        self.queue_wait = f.histogram(
            "model_queue_wait_seconds",
            "Time a request admitted after a wait waited for its slot, by model and client",
            ["model", "client"],
            _LATENCY,
        )
        self.queue_outcomes = f.counter(
            "model_queue_outcomes_total",
            "Requests that waited for a slot, by model and how the wait ended",
            ["model", "outcome"],
        )
        self.batch_queue = f.gauge(
            "batch_queue_requests",
            "Batch requests waiting or running, all batches, by model (from the store)",
            ["model"],
            "max",
        )
        self.batches = f.gauge(
            "batches", "Message batches in the store, by processing status", ["status"], "max"
        )
        self.batch_in_flight = f.gauge(
            "batch_requests_in_flight",
            "Batch requests running on an upstream now",
            ["upstream"],
            "livesum",
        )
        for status in BATCH_STATUSES:
            self.batches.labels(status)

    def _http(self, f: Families) -> None:
        """Broken client HTTP and missed client deadlines; config reloads."""
        self.client_http_errors = f.counter(
            "client_http_errors_total",
            "Requests refused for broken HTTP framing, and client deadlines missed, by kind",
            ["kind"],
        )
        # SIGHUP: the config re-read (gateway/http/reload.py); result: ok, failed
        self.config_reloads = f.counter(
            "config_reloads_total",
            "Config re-reads on SIGHUP: ok (the clients and keys replaced) or failed "
            "(the file refused; the previous ones kept)",
            ["result"],
        )
        for kind in CLIENT_HTTP_ERRORS:
            self.client_http_errors.labels(kind)
        for result in ("ok", "failed"):
            self.config_reloads.labels(result)

    def _signin(self, f: Families) -> None:
        """Claude Code's sign-in (gateway/auth/): codes, tokens, refused bearers."""
        # the sign-in (gateway/auth/): codes, tokens, refused bearers (see SIGNIN_CODES)
        self.signin_codes = f.counter(
            "signin_device_codes_total",
            "Sign-in device codes by outcome: issued, approved or denied on the "
            "verification page, expired (a poll heard expired_token)",
            ["outcome"],
        )
        self.signin_tokens = f.counter(
            "signin_tokens_total",
            "Sign-in tokens: issued for an approved code, refreshed, revoked (a sign-in's "
            "access and refresh token, at the revocation endpoint or for a reused refresh "
            "token)",
            ["event"],
        )
        self.signin_refused = f.counter(
            "signin_bearer_refused_total",
            "Requests refused (401) for their sign-in bearer token: unknown, revoked, "
            "expired, or its client no longer configured",
            ["reason"],
        )
        for outcome in SIGNIN_CODES:
            self.signin_codes.labels(outcome)
        for event in SIGNIN_TOKENS:
            self.signin_tokens.labels(event)
        for reason in BEARER_REFUSALS:
            self.signin_refused.labels(reason)

    def _process(self, f: Families, info_registry: CollectorRegistry | None) -> None:
        """Process-wide: memory budgets, event loop lag, build and model info."""
        # process-wide memory budgets (gateway/ops/budget.py); budget: memory, decoding
        self.budget_held = f.gauge(
            "memory_budget_bytes",
            "Bytes requests in flight hold now, as counted in each memory budget",
            ["budget"],
            "livesum",
        )
        self.budget_limit = f.gauge(
            "memory_budget_limit_bytes",
            "Each memory budget's limit (configured)",
            ["budget"],
            "livemax",
        )
        self.budget_sheds = f.counter(
            "memory_budget_sheds_total",
            "Requests refused with 529 overloaded_error because a memory budget was full",
            ["budget"],
        )
        self.loop_lag = f.gauge(
            "event_loop_lag_seconds",
            "How late the event loop ran a timer, last probe",
            (),
            "livemax",
        )
        # Info metrics have no multiprocess storage: with --workers, build info goes on the
        # exposition registry itself (info_registry), which every worker serves alike.
        self.build_info = Info(
            f.prefix + "build",
            "Gateway build; constant 1",
            registry=info_registry if info_registry is not None else f.registry,
        )
        self.build_info.info({"version": __version__})
        self.model_info = f.gauge(
            "model_info",
            "Configured model routes; constant 1",
            ["model", "upstream", "upstream_model"],
            "max",
        )
        for budget in BUDGETS:
            self.budget_held.labels(budget)
            self.budget_sheds.labels(budget)

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

    def reply_series(self, api: str, model: str) -> ReplySeries:
        """The series ``model``'s replies on ``api`` write, kept (:class:`ReplySeries`)."""
        series = self._reply_series.get((api, model))
        if series is None:
            series = self._reply_series[(api, model)] = ReplySeries(self, api, model)
        return series

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
