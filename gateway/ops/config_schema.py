"""The config file's schema, the one source of every key: one frozen dataclass per table.

Every field is a TOML key of its table unless its metadata says ``toml: False`` (set by the
loader from the table's name, the environment or other keys). Each key is declared with
:func:`~gateway.ops.config_knob._knob` (gateway/ops/config_knob.py): its default, value set,
bounds, format and one-line description; nothing about a key's own value is written elsewhere.
To add a key: one field with ``_knob(default, doc=..., gt=/ge=/le=/choices=/fmt=...)``, then
regenerate the page (``python -m gateway.ops.config_doc > docs/configuration.md``) and add its
row to README.md's table and its line to deploy/gateway.example.toml.

One generic pass (gateway/ops/config_check.py) checks each key against its :class:`Knob`; the
loader's ``parse`` (gateway/ops/config.py) keeps only the rules that relate keys to one another.
README.md's table, deploy/gateway.example.toml and docs/configuration.md are tested against
:func:`schema`.

Also here: :func:`find_route`, a client's model name to its configured :class:`ModelRoute`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

# _knob declares a key; _POS/_NONNEG (its old bound= spelling) and FORMATS are re-exported
# for callers and branches that import them from here
from gateway.ops.config_knob import _NONNEG as _NONNEG
from gateway.ops.config_knob import _POS as _POS
from gateway.ops.config_knob import FORMATS as FORMATS
from gateway.ops.config_knob import MAX_MODEL_NAME_CHARS, Knob, _knob, _not_toml, knobs
from gateway.text.glob import glob_match

# ---------------------------------------------------------------- value sets and caps

UPSTREAM_KINDS = ("openai", "vllm", "sglang", "llamacpp", "ollama")
LOG_LEVELS = ("debug", "info", "warning", "error")
INLINE_THINKING = ("auto", "opened", "off")
BALANCE = ("affinity", "round_robin", "least_busy")  # gateway/upstream/replicas.py's policies
DISCOVER = ("none", "dns")
CLAUDE_CODE_TIERS = ("", "opus", "sonnet", "haiku")
CAPABILITY_SETTINGS = ("auto", "yes", "no")
# keepalive: TOML true was the default before keep-alive had to be earned; it now means "auto"
KEEPALIVE_CHOICES = ("auto", "always", "never")
KEEPALIVE_ALIASES: dict[Any, str] = {True: "auto", False: "never"}
MAX_REPLICAS = 256  # max_replicas' own cap: the per-replica metric series stay few
MAX_BATCH_IN_FLIGHT = 64
MAX_QUEUE_TIMEOUT = 600.0  # the SDKs' own request timeout
MAX_CLIENTS = 1000  # each a label value of the per-client metrics
MAX_SEARCH_RESULTS = 20
# a result's snippet, at most: a result is sealed whole in its encrypted_content, which the
# gateway opens again only up to 64 K characters (gateway/messages/search_blocks.py)
MAX_RESULT_CHARS = 8000


@dataclass(frozen=True)
class UpstreamConfig:
    """``[upstreams.NAME]``: one OpenAI-compatible server (or replicas of one)."""

    name: str = field(metadata={"toml": False})  # the table's name, upstreams.<name>
    # exactly one of base_url and base_urls; parse() sets base_url to the first of base_urls
    base_url: str = _knob(
        "",
        fmt="http_url",
        shown="required unless `base_urls`",
        doc="the server's OpenAI base URL (`/chat/completions` is appended); https is verified "
        "against the system CAs",
    )
    base_urls: tuple[str, ...] = _knob(
        (),
        fmt="http_url",
        types=(list,),
        shown="unset",
        doc="instead of `base_url`: the base URLs of replicas of one server; every other key "
        "applies to each",
    )
    kind: str = _knob(
        "openai",
        choices=UPSTREAM_KINDS,
        doc="the engine: request-side extras (usage on the first chunk, token counting) and "
        "defaults of `health_path` and the capabilities",
    )
    api_key_env: str | None = _knob(
        None, doc="env var holding the upstream's key, sent as `Authorization: Bearer <key>`"
    )
    api_key: str | None = _not_toml(None, secret=True)
    pool_size: int = _knob(
        0,
        ge=0,
        doc="connections to this upstream at once (each stream holds one); past it "
        "streams queue; 0: no limit",
    )
    connect_timeout: float = _knob(5.0, gt=0, doc="seconds to connect")
    header_timeout: float = _knob(
        600.0, gt=0, doc="seconds from sending a request to the reply's final head (a deadline)"
    )
    idle_timeout: float = _knob(
        300.0,
        gt=0,
        doc="seconds an upstream **stream** may go without an event before it is ended "
        "(not `server.idle_timeout`: an idle client connection)",
    )
    response_timeout: float = _knob(
        900.0, gt=0, doc="seconds from sending a request to a buffered reply's last byte"
    )
    max_response_bytes: int = _knob(
        64 * 1024 * 1024,
        gt=0,
        doc="largest buffered reply read from this **upstream** (64 MiB), larger: 500 "
        "(not `web_search.max_response_bytes`: a search backend's reply)",
    )
    # "auto": a fresh connection per request (Connection: close) until the upstream's replies
    # have echoed X-Request-Id (gateway/upstream/reuse.py), then keep-alive with the echo
    # required; "always": keep-alive (the operator vouches); "never": a connection per request
    keepalive: str = _knob(
        "auto",
        choices=KEEPALIVE_CHOICES,
        aliases=KEEPALIVE_ALIASES,
        types=(str, bool),
        doc="`auto`: keep-alive once replies echo `X-Request-Id`; `always`; `never` (a "
        "connection per request); true means `auto`, false `never`",
    )
    # what the engine leaves in content when its parsers are off (gateway/local/)
    inline_thinking: str = _knob(
        "auto",
        choices=INLINE_THINKING,
        doc="reasoning left in content: `auto` (a leading `<think>` opens it), `opened` (the "
        "template opened `<think>`), `off` (content is text)",
    )
    text_tool_calls: bool = _knob(
        True,
        doc="tool calls written as text in the model's native format become `tool_use` "
        "blocks (for offered tools); false: content is never read for calls",
    )
    passthrough_text_tool_calls: bool = _knob(
        False,
        doc="with `text_tool_calls`, the OpenAI pass-through parses them too: on chat "
        "`message.tool_calls` / `tool_calls` deltas and `finish_reason: tool_calls`, on "
        "`/v1/responses` `function_call` output items (off: replies are relayed as bytes, "
        "never decoded)",
    )
    # gateway/tenancy/fair.py engine_priority
    send_priority: bool = _knob(
        False,
        doc="send each request's client weight as the engine's `priority` (kind `vllm` "
        "with `--scheduling-policy priority`, `sglang` with `--enable-priority-scheduling`): "
        "-10·log2(weight) for vLLM, +10·log2(weight) for SGLang; weight 1 sends 0",
    )
    # gateway/messages/continuation.py
    max_continuations: int = _knob(
        2,
        ge=0,
        doc="times per reply a stream the engine cut mid-answer is sent again with "
        "the partial answer as a prefill; 0: never",
    )
    # the fleet (gateway/upstream/discovery.py, gateway/upstream/fleet.py)
    discover: str = _knob(
        "none",
        choices=DISCOVER,
        doc="`dns`: every address `base_url`'s host resolves to is a replica (re-resolved); "
        "`none`: the URLs as written",
    )
    resolve_interval: float = _knob(
        10.0, gt=0, doc='seconds between two resolutions of the name (`discover = "dns"`)'
    )
    max_replicas: int = _knob(
        16, gt=0, le=MAX_REPLICAS, doc="most addresses of one name that are replicas at once"
    )
    health_path: str = _knob(
        "",
        fmt="request_path",
        shown="`/health` (`/api/version` for kind `ollama`)",
        doc="the active probe's path at each replica's server root",
    )
    health_interval: float = _knob(
        0.0, ge=0, doc="seconds between active health probes of each replica; 0: no probes"
    )
    health_timeout: float = _knob(2.0, gt=0, doc="seconds a probe's status line may take")
    # gateway/upstream/window_watch.py
    context_window_interval: float = _knob(
        300.0,
        ge=0,
        doc="seconds between two readings of the engine's context window for models without "
        "`context_window` (vLLM/SGLang `/v1/models`, llama.cpp `/props`, Ollama `/api/show`); "
        "0: never read",
    )
    # gateway/upstream/replicas.py
    balance: str = _knob(
        "affinity",
        choices=BALANCE,
        doc="which replica takes a request: `affinity` (a session stays on one), "
        "`round_robin`, `least_busy` (fewest in flight)",
    )

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).netloc

    @property
    def replica_urls(self) -> tuple[str, ...]:
        """The base URL of each replica: ``base_urls``, or the one ``base_url``."""
        return self.base_urls or (self.base_url,)


@dataclass(frozen=True)
class ModelRoute:
    """``[[models]]``: a name clients send, and where it goes."""

    name: str = _knob(
        fmt="model_name",
        doc="what clients send as `model`; with `*` a pattern (`claude-*`): exact names win, "
        "patterns in config order (not `clients[].name`: a client's)",
    )
    # TOML: the upstream's name, which parse() resolves
    upstream: UpstreamConfig = _knob(  # noqa: RUF009 (a field specifier, as field() is)
        types=(str,), doc="the `[upstreams.NAME]` it goes to"
    )
    upstream_model: str = _knob(doc="the model name sent upstream")
    max_concurrency: int = _knob(
        0,
        ge=0,
        doc="requests at once for this **model**, past it 529 `overloaded_error` (or a wait: "
        "`queue_timeout`); 0: unlimited (not `clients[].max_concurrency`)",
    )
    queue_timeout: float = _knob(
        0.0,
        ge=0,
        le=MAX_QUEUE_TIMEOUT,
        doc="seconds a request past `max_concurrency` may wait for a slot, admitted in "
        "weighted fair order across clients; 0: 529 at once",
    )
    display_name: str = _knob("", shown="the name", doc="shown by `/v1/models`")
    created_at: str = _knob("2025-01-01T00:00:00Z", doc="shown by `/v1/models`")
    context_window: int = _knob(
        0,
        ge=0,
        doc="the model's context size, `/v1/models`' `max_input_tokens`; 0: read from the "
        "engine (`upstreams.NAME.context_window_interval`)",
    )
    # gateway/http/managed_settings.py
    claude_code_tier: str = _knob(
        "",
        choices=CLAUDE_CODE_TIERS,
        doc="the Claude Code tier this model is pushed as in `/managed/settings` "
        "(`ANTHROPIC_DEFAULT_<TIER>_MODEL`); unset tiers take the `sonnet` one (else the first "
        "model the client may use)",
    )
    # what the upstream takes (gateway/local/capabilities.py)
    images: str = _knob(
        "auto",
        choices=CAPABILITY_SETTINGS,
        doc="whether the upstream takes images: `auto` (the kind's default; refused, sent "
        "as text and remembered), `yes`, `no` (as text)",
    )
    tool_references: str = _knob(
        "auto",
        choices=CAPABILITY_SETTINGS,
        doc="whether it takes `tool_reference` content parts; as `images`",
    )
    named_tool_choice: str = _knob(
        "auto",
        choices=CAPABILITY_SETTINGS,
        doc="whether it honours `tool_choice` naming one tool; `no`: only that tool is "
        "offered, with `required`",
    )
    capability_ttl: float = _knob(
        600.0,
        gt=0,
        doc="seconds an `auto` route remembers a refusal; then the content is tried again",
    )
    # gateway/messages/call.py; a fallback's own fallbacks are not followed
    fallbacks: tuple[str, ...] = _knob(
        (),
        types=(list,),
        shown="unset",
        doc="other models, in order, that take a Messages request when this one's upstream "
        "failed before replying on every replica",
    )
    # their routes, set by parse()
    fallback_routes: tuple[ModelRoute, ...] = field(
        default=(), repr=False, metadata={"toml": False}
    )


@dataclass(frozen=True)
class ServerConfig:
    """``[server]``: the listener and what every request shares."""

    host: str = _knob("127.0.0.1", doc="listen address")
    port: int = _knob(8080, ge=0, le=65535, doc="listen port")
    prefix: str = _knob("/llm", fmt="prefix", doc="path prefix of every API route")
    ping_interval: float = _knob(
        10.0, gt=0, doc="seconds of upstream silence before a `ping` event is sent on a stream"
    )
    max_body_bytes: int = _knob(
        32 * 1024 * 1024,
        gt=0,
        doc="largest **request** body (32 MiB), larger: 413 (not `batches.max_body_bytes`: "
        "a batch create body)",
    )
    # request bodies being read and decoded at once (inside memory_budget_mb)
    max_decoding_bytes: int = _knob(
        64 * 1024 * 1024,
        gt=0,
        doc="request body bytes being received and decoded at once, all routes; past it 529",
    )
    # gateway/ops/budget.py. Half the shipped 1 GiB container limit: the rest is the process
    # itself, its worker processes and what is not counted
    memory_budget_mb: int = _knob(
        512,
        gt=0,
        doc="MiB requests in flight may hold at once (bodies, restored reasoning, "
        "batch creates); past it 529",
    )
    # also counted in memory_budget_mb, twice: the text and its copy in the upstream payload
    max_restored_reasoning_bytes: int = _knob(
        4 * 1024 * 1024,
        gt=0,
        doc="reasoning one request may restore from thinking signatures; past it 413",
    )
    # gateway/messages/documents/pdf_pool.py
    pdf_workers: int = _knob(2, gt=0, doc="worker processes that extract PDF text")
    pdf_cpu_seconds: float = _knob(5.0, gt=0, doc="CPU seconds one PDF document may take")
    pdf_request_cpu_seconds: float = _knob(
        20.0, gt=0, doc="CPU seconds all the PDFs of one request may take together"
    )
    decode_offload_bytes: int = _knob(
        1024 * 1024,
        ge=0,
        advanced=True,
        doc="bodies larger than this are counted and decoded in a child process; 0: all on "
        "the event loop",
    )
    shutdown_grace: float = _knob(
        30.0, gt=0, doc="seconds streams may run on after SIGTERM before they are ended"
    )
    write_timeout: float = _knob(
        60.0, gt=0, doc="seconds a write may wait on a client that stopped reading"
    )
    # client connections (gateway/http/protocol.py, gateway/http/listener.py)
    idle_timeout: float = _knob(
        60.0,
        gt=0,
        doc="seconds a **client connection** may wait for a request head, from accept or a "
        "reply (not `upstreams.NAME.idle_timeout`: a quiet upstream stream)",
    )
    request_head_timeout: float = _knob(
        30.0,
        gt=0,
        doc="seconds from a request head's first byte to its last (with TLS, also the "
        "handshake's limit)",
    )
    request_body_timeout: float = _knob(
        60.0, gt=0, doc="seconds from the end of a head to the body's last byte; past it 408"
    )
    max_connections: int = _knob(
        0, ge=0, doc="client connections on the API listener at once; 0: unlimited"
    )
    # gateway/ops/tls.py; read and checked at load (and again on SIGHUP)
    tls_cert_file: str | None = _knob(
        None,
        doc="PEM certificate (leaf first, then its chain): the API listener serves https "
        "(with `tls_key_file`); unset: plain http",
    )
    tls_key_file: str | None = _knob(
        None, doc="PEM private key of `tls_cert_file`, unencrypted (with `tls_cert_file`)"
    )
    hsts_max_age: int = _knob(
        31536000,
        ge=0,
        le=63072000,
        doc="with TLS on, every API answer's `Strict-Transport-Security: max-age=` this many "
        "seconds (browsers then reach the sign-in page over https only); 0: no header",
    )
    # SHA-256 of the served leaf, lower-case hex (as Claude Code shows it); "" without TLS
    tls_fingerprint: str = _not_toml("")
    metrics_host: str = _knob(
        "", shown="`server.host`", doc="the metrics listener's address (needs `metrics_port`)"
    )
    metrics_port: int = _knob(
        0,
        ge=0,
        le=65535,
        doc="`/metrics` on a listener of its own on this port; 0: on the API listener",
    )
    log_level: str = _knob("info", choices=LOG_LEVELS, doc="the lowest level logged")
    api_keys_env: str | None = _knob(
        None, doc="env var holding the accepted client keys, comma-separated; unset: no auth"
    )
    api_keys: tuple[str, ...] = _not_toml((), secret=True)
    admin_keys_env: str | None = _knob(
        None,
        doc="env var holding admin keys, comma-separated: `/v1/organizations/*` only (the "
        "usage report); unset: those routes answer 404",
    )
    admin_keys: tuple[str, ...] = _not_toml((), secret=True)
    keep_billing_header: bool = _knob(
        False,
        doc="keep Claude Code's `x-anthropic-billing-header:` system line (dropping it "
        "keeps the prefix cache warm)",
    )
    signing_key_env: str | None = _knob(
        None,
        doc="env var holding the key that signs and seals thinking signatures; unset: a key kept "
        "in the state directory",
    )
    signing_key: bytes = _not_toml(b"", secret=True)
    previous_signing_keys_env: str | None = _knob(
        None,
        doc="env var holding earlier signing keys, comma-separated: their signatures "
        "still open (a key rotation)",
    )
    previous_signing_keys: tuple[bytes, ...] = _not_toml((), secret=True)
    # where it came from: "env", "file" (the state directory's key) or "random" (this process)
    signing_key_source: str = _not_toml("random")
    # the Claude Code gateway protocol's managed settings (gateway/http/managed_settings.py)
    managed_settings: bool = _knob(
        True,
        doc="serve `GET {prefix}/managed/settings` (Claude Code's policy: context window, "
        "output cap, model names); false: 404",
    )
    claude_code_output_cap: int = _knob(
        32000,
        ge=0,
        doc="the largest `CLAUDE_CODE_MAX_OUTPUT_TOKENS` pushed (it is a window's eighth up to "
        "this); 0: not pushed",
    )
    claude_code_model_discovery: bool = _knob(
        True,
        doc="push `CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY` so Claude Code lists this "
        "gateway's `claude`-named models in `/model`",
    )

    @property
    def tls(self) -> bool:
        """The API listener serves https."""
        return bool(self.tls_cert_file and self.tls_key_file)

    @property
    def tls_files(self) -> tuple[str, str]:
        """(certificate file, key file) of a listener serving https."""
        assert self.tls_cert_file and self.tls_key_file, "no TLS configured"
        return self.tls_cert_file, self.tls_key_file

    @property
    def metrics_apart(self) -> bool:
        """/metrics has a listener of its own (and is then not served on the API's)."""
        return self.metrics_port != 0


@dataclass(frozen=True)
class BatchesConfig:
    """``[batches]``: Message Batches (gateway/batches/)."""

    enabled: bool = _knob(
        True,
        doc="serve the **Message Batches** routes; false: 404, no database (not "
        "`auth.enabled`: the sign-in's)",
    )
    database: str = _knob(
        "",
        fmt="database",
        shown="`batches.sqlite3` in the state directory",
        doc="where batches are kept: SQLite (a file) or PostgreSQL (shared by workers and "
        "replicas)",
    )
    database_env: str | None = _knob(
        None, doc="env var holding the database URL (one with a password in it)"
    )
    max_in_flight: int = _knob(
        2, gt=0, le=MAX_BATCH_IN_FLIGHT, doc="batch requests running at once per upstream"
    )
    max_in_flight_idle: int = _knob(
        0,
        ge=0,
        le=MAX_BATCH_IN_FLIGHT,
        doc="batch requests at once on an upstream idle for `idle_after` seconds; 0: "
        "`max_in_flight`",
    )
    idle_after: float = _knob(
        10.0, gt=0, doc="seconds without interactive requests before an upstream is idle"
    )
    interactive_threshold: int = _knob(
        1,
        gt=0,
        doc="new batch requests start on an upstream only while fewer interactive "
        "requests than this run on it",
    )
    expire_after: float = _knob(
        86400.0, gt=0, doc="seconds after creation at which a batch ends (the API's 24 hours)"
    )
    retention_days: float = _knob(29.0, gt=0, doc="days an ended batch's results are kept")
    public_base_url: str = _knob(
        "",
        fmt="http_base_or_empty",
        shown="the request's own scheme and host",
        doc="the gateway's public origin for `results_url` behind a reverse proxy",
    )
    max_requests: int = _knob(100_000, gt=0, doc="most requests in one batch")
    max_body_bytes: int = _knob(
        256 * 1024 * 1024,
        gt=0,
        doc="largest **batch create** body (256 MiB), larger: 413 (not "
        "`server.max_body_bytes`: every other request)",
    )
    poll_interval: float = _knob(
        1.0, gt=0, advanced=True, doc="seconds between looks for work when idle"
    )
    lease: float = _knob(
        60.0, gt=0, advanced=True, doc="seconds a process's claim on a request lasts unless renewed"
    )
    database_url: str = _not_toml("", secret=True)  # resolved: database, database_env or default
    # True when database or database_env named the location: a store that cannot be opened
    # there stops the start; False (the state directory's file): batches are turned off instead
    database_explicit: bool = _not_toml(False)


@dataclass(frozen=True)
class ClientConfig:
    """``[[clients]]``: one named client, its key, the models it may use and its limits
    (gateway/tenancy/). Every limit's 0 is no limit."""

    name: str = _knob(
        fmt="client_name",
        doc="the **client's** name: the label in metrics, logs and usage reports (its "
        "`api_key_id`; not `models[].name`)",
    )
    key_env: str | None = _knob(
        None, doc="env var holding the client's key (or `key_sha256`; exactly one)"
    )
    key_sha256: str = _knob(
        "",
        fmt="sha256_hex",
        shown="unset",
        doc="the SHA-256 of the client's key, 64 hex digits: the file holds no secret",
    )
    models: tuple[str, ...] = _knob(
        (),
        fmt="model_name",
        types=(list,),
        shown="every model",
        doc="the model names and `*` patterns the client may use; others: 403",
    )
    max_concurrency: int = _knob(
        0,
        ge=0,
        doc="the **client's** requests in flight at once, all models; past it 429 (not "
        "`models[].max_concurrency`: a model's)",
    )
    requests_per_minute: int = _knob(0, ge=0, doc="requests a minute")
    input_tokens_per_minute: int = _knob(0, ge=0, doc="input tokens a minute")
    output_tokens_per_minute: int = _knob(0, ge=0, doc="output tokens a minute")
    tokens_per_day: int = _knob(0, ge=0, doc="input and output tokens a day")
    weight: float = _knob(
        1.0, gt=0, le=1000, doc="the client's share of a saturated model against others'"
    )
    oidc_values: tuple[str, ...] = _knob(
        (),
        types=(list,),
        shown="none",
        doc="values of the ID token's `auth.oidc_claim` (an email, a subject, a group) that "
        "sign in as this client through the OpenID Connect provider",
    )
    forwards_identity: bool = _knob(
        False,
        shown="`false`: its requests are its own",
        doc="the client is a proxy (`claude gateway`) that names its developers in "
        "`x-claude-gateway-user-id`/`-email`: believed from `auth.trusted_forwarders` only",
    )
    forwarded_ids: tuple[str, ...] = _knob(
        (),
        fmt="forwarded_id",
        types=(list,),
        shown="none",
        doc="forwarded user ids (the sign-in's `sub`) whose requests are this client's",
    )
    forwarded_emails: tuple[str, ...] = _knob(
        (),
        fmt="forwarded_id",
        types=(list,),
        shown="none",
        doc="forwarded emails (any case) whose requests are this client's, when no "
        "`forwarded_ids` names the user",
    )
    email: str = _knob(
        "",
        shown="unset",
        doc="the account a developer signing in as this client sees (the token reply's "
        "`email`: Claude Code asks to confirm it and shows it in `/status`)",
    )
    # the key's SHA-256 (from key_env's value, or key_sha256), set by parse()
    key_digest: bytes = _not_toml(b"", secret=True)
    # key_env's value (empty with key_sha256): only for the scrubber of upstream error text
    key: str = _not_toml("", secret=True)


@dataclass(frozen=True)
class LimitsConfig:
    """``[limits]``: where the clients' counters live (gateway/tenancy/)."""

    redis_url_env: str | None = _knob(
        None,
        doc="env var holding a `redis://` URL: counters shared by every gateway process "
        "using it (Valkey works the same); unset: each process counts alone",
    )
    on_store_error: str = _knob(
        "open",
        choices=("open", "closed"),
        doc="when Redis cannot be reached: `open` lets requests through uncounted, "
        "`closed` refuses them (529)",
    )
    store_timeout: float = _knob(
        0.25, gt=0, le=10, doc="seconds one round trip to Redis may take before it is an error"
    )
    redis_url: str = _not_toml("", secret=True)


@dataclass(frozen=True)
class AuthConfig:
    """``[auth]``: Claude Code's sign-in to the gateway, the OAuth device flow (gateway/auth/)."""

    enabled: bool = _knob(
        False,
        doc="serve **Claude Code's sign-in** routes (tokens kept in the batches' database); "
        "false: 404 (not `batches.enabled`: the batches routes)",
    )
    access_token_seconds: int = _knob(
        3600, gt=0, le=86400, doc="seconds an access token is honoured; the client refreshes it"
    )
    refresh_token_seconds: int = _knob(
        30 * 86400,
        gt=0,
        doc="seconds a refresh token lasts (rotated on each use); then the developer signs "
        "in again",
    )
    code_seconds: int = _knob(
        600, gt=0, le=3600, doc="seconds a device code waits for its approval"
    )
    poll_seconds: int = _knob(
        5, ge=1, le=60, doc="seconds the client waits between two polls of the token endpoint"
    )
    max_pending_codes: int = _knob(
        1000,
        gt=0,
        doc="device codes waiting at once, all clients; past it the client is told to slow down",
    )
    page_tries_per_minute: int = _knob(
        10,
        gt=0,
        doc="verification page submissions a minute per client address, and new device "
        "codes apart; past it 429",
    )
    cache_seconds: float = _knob(
        30.0,
        gt=0,
        le=3600,
        doc="seconds a checked token is trusted without the database: how long another "
        "replica may still honour a token revoked elsewhere",
    )
    oidc_issuer: str = _knob(
        "",
        fmt="http_base_or_empty",
        shown="unset: no OpenID Connect",
        doc="an **OpenID Connect** provider's issuer URL: the verification page offers "
        "signing in with it (discovery at `{issuer}/.well-known/openid-configuration`)",
    )
    oidc_client_id: str = _knob(
        "", shown="required with `oidc_issuer`", doc="the gateway's client id at the provider"
    )
    oidc_client_secret_env: str | None = _knob(
        None,
        doc="env var holding the gateway's client secret at the provider; unset: a public "
        "client (PKCE alone)",
    )
    oidc_scopes: tuple[str, ...] = _knob(
        ("openid", "email"),
        types=(list,),
        shown='`["openid", "email"]`',
        doc="scopes asked of the provider; `openid` among them",
    )
    oidc_claim: str = _knob(
        "email",
        doc="the ID token claim whose value (or, for a list such as `groups`, any value) "
        "names the client through `clients[].oidc_values`; `email` only when `email_verified`",
    )
    oidc_name: str = _knob(
        "", shown="the issuer's host", doc="the provider's name on the button, `Sign in with NAME`"
    )
    oidc_timeout: float = _knob(
        10.0, gt=0, le=60, doc="seconds one call to the provider (discovery, keys, token) may take"
    )
    trusted_forwarders: tuple[str, ...] = _knob(
        (),
        fmt="cidr",
        types=(list,),
        shown="none",
        doc="peer addresses (CIDRs) whose `clients.forwards_identity` proxies may name the "
        "developer a request is for; from elsewhere those headers are ignored",
    )
    oidc_client_secret: str = _not_toml("", secret=True)  # oidc_client_secret_env's value

    @property
    def oidc(self) -> bool:
        """The verification page offers signing in with an OpenID Connect provider."""
        return bool(self.oidc_issuer)


@dataclass(frozen=True)
class WebSearchConfig:
    """``[web_search]``: the web_search server tool, run by the gateway (gateway/tools/)."""

    searxng_url: str = _knob(
        fmt="http_base",
        doc="a SearXNG instance (its JSON API); without `[web_search]` a web search tool is a 400",
    )
    timeout: float = _knob(10.0, gt=0, doc="seconds one search may take, all in")
    max_results: int = _knob(5, gt=0, le=MAX_SEARCH_RESULTS, doc="results kept per search")
    max_result_chars: int = _knob(
        1000, gt=0, le=MAX_RESULT_CHARS, doc="characters of one result's snippet the model sees"
    )
    max_request_chars: int = _knob(
        40_000, gt=0, doc="characters of search results the model sees in one request"
    )
    max_searches: int = _knob(
        8, gt=0, doc="searches in one request, at most, whatever the tool's `max_uses` says"
    )
    max_response_bytes: int = _knob(
        2 * 1024 * 1024,
        gt=0,
        doc="largest reply read from the **search backend** (2 MiB), larger: `unavailable` "
        "(not `upstreams.NAME.max_response_bytes`)",
    )


@dataclass(frozen=True)
class TelemetryConfig:
    """``[telemetry]``: OpenTelemetry over OTLP/HTTP (gateway/ops/telemetry.py)."""

    otlp_endpoint: str = _knob(
        fmt="http_base",
        doc="an OTLP/HTTP collector's base URL (`/v1/traces`, `/v1/metrics`, `/v1/logs` "
        "are appended); the gateway's spans and metrics go there, and so does the OTLP "
        "its clients send to the gateway",
    )
    service_name: str = _knob("llm-gateway", doc="the `service.name` resource attribute")
    headers_env: str | None = _knob(
        None,
        doc="env var holding headers for the collector, `k1=v1,k2=v2` (e.g. its key)",
    )
    sample_ratio: float = _knob(
        1.0,
        ge=0,
        le=1,
        doc="share of new traces recorded (a client's sampled `traceparent` is followed)",
    )
    export_timeout: float = _knob(
        10.0, gt=0, le=60, doc="seconds one export to the collector may take"
    )
    max_queue_spans: int = _knob(
        2048, gt=0, doc="spans waiting for export at most; past it new ones are dropped"
    )
    export_interval: float = _knob(
        60.0, gt=0, le=3600, doc="seconds between two exports of the metrics"
    )
    max_forward_bytes: int = _knob(
        4 * 1024 * 1024,
        gt=0,
        doc="largest OTLP body a client may send to `/v1/{metrics,logs,traces}`; larger: 413",
    )
    headers: tuple[tuple[str, str], ...] = _not_toml((), secret=True)


@dataclass(frozen=True)
class WebFetchConfig:
    """``[web_fetch]``: the web_fetch server tool, run by the gateway (gateway/tools/web_fetch/,
    docs/web-fetch.md). Without the table a web fetch tool is a 400."""

    enabled: bool = _knob(
        False,
        doc="run the web_fetch server tool; off: a `web_fetch_*` tool is a 400 "
        "(not `batches.enabled` nor `auth.enabled`)",
    )
    allowed_networks: tuple[str, ...] = _knob(
        (),
        fmt="cidr",
        types=(list,),
        shown="none",
        doc='CIDRs the fetcher may reach besides public addresses (`["127.0.0.0/8"]`); '
        "every other private, loopback, link-local or reserved address is refused",
    )
    fetch_timeout: float = _knob(20.0, gt=0, le=300, doc="seconds one fetch may take, all in")
    fetch_connect_timeout: float = _knob(
        5.0, gt=0, le=60, doc="seconds to connect to a page's server"
    )
    max_fetches: int = _knob(
        8, gt=0, le=100, doc="fetches in one request, at most, whatever the tool's `max_uses` says"
    )
    max_redirects: int = _knob(5, ge=0, le=20, doc="redirects one fetch follows, each checked")
    max_page_bytes: int = _knob(
        10 * 1024 * 1024,
        gt=0,
        le=100 * 1024 * 1024,
        doc="largest page body read, compressed and inflated (10 MiB); larger: `content_too_large`",
    )
    max_content_chars: int = _knob(
        100_000, gt=0, doc="characters of one fetched document's text the model sees"
    )
    max_fetched_chars: int = _knob(
        200_000, gt=0, doc="characters of fetched text the model sees in one request"
    )
    max_concurrent: int = _knob(8, gt=0, le=256, doc="fetches in flight in one gateway process")


@dataclass(frozen=True)
class Config:
    server: ServerConfig
    upstreams: Mapping[str, UpstreamConfig]
    models: Mapping[str, ModelRoute]
    batches: BatchesConfig = field(default_factory=BatchesConfig)
    web_search: WebSearchConfig | None = None  # None: no [web_search] table
    web_fetch: WebFetchConfig = field(default_factory=WebFetchConfig)
    clients: tuple[ClientConfig, ...] = ()
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    telemetry: TelemetryConfig | None = None  # None: no [telemetry] table
    source: str = "<built-in default>"
    # set by --workers in each worker process (not TOML knobs): prometheus multiprocess
    # directory and SO_REUSEPORT on the listening socket
    metrics_dir: str | None = None
    reuse_port: bool = False


# Where each table sits in a file, as errors and documentation name its keys.
TABLES: dict[str, type] = {
    "server": ServerConfig,
    "upstreams.<name>": UpstreamConfig,
    "models[]": ModelRoute,
    "batches": BatchesConfig,
    "web_search": WebSearchConfig,
    "web_fetch": WebFetchConfig,
    "clients[]": ClientConfig,
    "limits": LimitsConfig,
    "auth": AuthConfig,
    "telemetry": TelemetryConfig,
}


def schema() -> dict[str, Knob]:
    """Every key of the config file: ``server.host``, ``upstreams.<name>.base_url``, ..."""
    return {
        f"{table}.{name}": knob
        for table, cls in TABLES.items()
        for name, knob in knobs(cls).items()
    }


def find_route(models: Mapping[str, ModelRoute], name: str) -> ModelRoute | None:
    """The route for a client's model name: an exact name first, else the first pattern.

    A configured name holding ``*`` is a pattern, ``*`` matching any run of characters
    (``claude-*``); patterns are tried in config order. The route keeps its configured
    name, so metrics and logs stay bounded by the config whatever names clients send.
    A name longer than :data:`MAX_MODEL_NAME_CHARS` routes nowhere (a 404, like any unknown
    model): no configured name is that long, and matching stays cheap.
    """
    if len(name) > MAX_MODEL_NAME_CHARS:
        return None
    route = models.get(name)
    if route is not None:
        return route
    for candidate in models.values():
        if is_pattern(candidate.name) and glob_match(candidate.name, name):
            return candidate
    return None


def is_pattern(name: str) -> bool:
    return "*" in name
