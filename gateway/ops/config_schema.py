"""The config file's schema: one frozen dataclass per table, each field a key.

Every field is a TOML key of its table unless its metadata says ``toml: False`` (set by the
loader from the table's name, the environment or other keys). A key's TOML types come from its
annotation (a float takes an integer too), it is required when the field has no default, and
its default is the field's. Metadata: ``bound`` ("> 0" or ">= 0") is checked by the loader
(gateway/ops/config.py); ``types`` overrides the annotation's; ``shown`` is the default as
README.md's table writes it when it is not the value itself. :func:`knobs` and :func:`schema`
derive the keys from the fields; README.md's table and deploy/gateway.example.toml are tested
against them.

Also here: :func:`find_route`, a client's model name to its configured :class:`ModelRoute`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, get_type_hints
from urllib.parse import urlsplit

from gateway.text.glob import glob_match


def _not_toml(default: Any, *, secret: bool = False) -> Any:
    """A field that is no TOML key: set by parse() from the table's name, env or other keys."""
    return field(default=default, repr=not secret, metadata={"toml": False})


def _knob(default: Any, *, bound: str | None = None, shown: str | None = None) -> Any:
    meta: dict[str, Any] = {}
    if bound is not None:
        meta["bound"] = bound
    if shown is not None:
        meta["shown"] = shown
    return field(default=default, metadata=meta)


_POS, _NONNEG = "> 0", ">= 0"


@dataclass(frozen=True)
class UpstreamConfig:
    name: str = field(metadata={"toml": False})  # the table's name, upstreams.<name>
    # exactly one of base_url and base_urls; parse() sets base_url to the first of base_urls
    base_url: str = _knob("", shown="required unless `base_urls`")
    # replicas of one server (gateway/upstream/replicas.py); every other key applies to each
    base_urls: tuple[str, ...] = field(default=(), metadata={"types": (list,),
                                                              "shown": "unset"})
    kind: str = "openai"
    api_key_env: str | None = None
    api_key: str | None = _not_toml(None, secret=True)
    pool_size: int = _knob(0, bound=_NONNEG)  # 0: no limit (each stream holds one connection)
    connect_timeout: float = _knob(5.0, bound=_POS)
    header_timeout: float = _knob(600.0, bound=_POS)  # from the send to the final reply head
    idle_timeout: float = _knob(300.0, bound=_POS)  # a stream's longest gap between events
    # from the send to a buffered reply's last byte
    response_timeout: float = _knob(900.0, bound=_POS)
    max_response_bytes: int = _knob(64 * 1024 * 1024, bound=_POS)  # a buffered reply's size cap
    # "auto": a fresh connection per request (Connection: close) until the upstream's replies
    # have echoed X-Request-Id (gateway/upstream/reuse.py), then keep-alive with the echo
    # required; "always": keep-alive (the operator vouches); "never": a connection per
    # request. TOML true is "auto" (it was the default), false is "never".
    keepalive: str = field(default="auto", metadata={"types": (str, bool)})
    # what the engine leaves in content when its parsers are off (gateway/local/):
    # "auto": a leading <think> opens reasoning; "opened": the chat template opens <think> in
    # the prompt, so content starts inside reasoning; "off": content is text, as sent
    inline_thinking: str = "auto"
    # tool calls written as text in the model's native format become tool_use blocks (for
    # tools the request offered); false: content is never read for calls
    text_tool_calls: bool = True
    # a stream the engine cuts mid-answer is sent again with the partial answer as a prefill,
    # at most this many times per reply (gateway/messages/continuation.py); 0: never
    max_continuations: int = _knob(2, bound=_NONNEG)
    # the fleet (gateway/upstream/discovery.py, gateway/upstream/fleet.py): "dns": the host of
    # base_url is resolved every resolve_interval seconds and each address (A and AAAA) is a
    # replica, at most max_replicas of them; "none": the URLs as written
    discover: str = "none"
    resolve_interval: float = _knob(10.0, bound=_POS)
    max_replicas: int = _knob(16, bound=_POS)
    # active health probes: GET health_path at each replica's server root every
    # health_interval seconds (0: no probes), each due within health_timeout
    health_path: str = _knob("", shown="`/health` (`/api/version` for kind `ollama`)")
    health_interval: float = _knob(0.0, bound=_NONNEG)
    health_timeout: float = _knob(2.0, bound=_POS)
    # which replica takes a request (gateway/upstream/replicas.py): "affinity" (a session stays
    # on one replica), "round_robin" (in turn) or "least_busy" (fewest in flight)
    balance: str = "affinity"

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).netloc

    @property
    def replica_urls(self) -> tuple[str, ...]:
        """The base URL of each replica: ``base_urls``, or the one ``base_url``."""
        return self.base_urls or (self.base_url,)

# the longest model name a client may send or the config may hold; longer names route nowhere
MAX_MODEL_NAME_CHARS = 256

@dataclass(frozen=True)
class ModelRoute:
    name: str
    upstream: UpstreamConfig = field(metadata={"types": (str,)})  # TOML: the upstream's name
    upstream_model: str
    max_concurrency: int = _knob(0, bound=_NONNEG)  # 0: unlimited
    display_name: str = _knob("", shown="the name")  # parse() sets it to the name
    created_at: str = "2025-01-01T00:00:00Z"
    context_window: int = _knob(0, bound=_NONNEG)  # 0: unknown
    # what the upstream takes (gateway/local/capabilities.py): "auto" (the upstream kind's
    # default; images and tool_reference parts are sent, and on the server's refusal sent
    # again as text and remembered for the route), "yes" (always sent as such) or "no" (always
    # sent as text)
    images: str = "auto"
    tool_references: str = "auto"
    # tool_choice naming one tool, in OpenAI's object form; "no": only that tool is offered,
    # with tool_choice "required" (llama.cpp and Ollama ignore the object form)
    named_tool_choice: str = "auto"
    # seconds an "auto" route remembers a refusal for; then the content is tried again
    capability_ttl: float = _knob(600.0, bound=_POS)
    # other models (by name) that take a Messages request when this one's upstream failed
    # before its reply's head on every replica (gateway/messages/call.py), tried in order;
    # a fallback's own fallbacks are not followed
    fallbacks: tuple[str, ...] = field(default=(), metadata={"types": (list,),
                                                              "shown": "unset"})
    # their routes, set by parse()
    fallback_routes: tuple[ModelRoute, ...] = field(default=(), repr=False,
                                                    metadata={"toml": False})


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    prefix: str = "/llm"
    ping_interval: float = _knob(10.0, bound=_POS)
    max_body_bytes: int = _knob(32 * 1024 * 1024, bound=_POS)
    # request bodies being read and decoded at once (inside memory_budget_mb)
    max_decoding_bytes: int = _knob(64 * 1024 * 1024, bound=_POS)
    # MiB that requests in flight may hold at once (gateway/ops/budget.py): bodies being
    # decoded, reasoning restored from signatures (until the reply ends), batch creates;
    # past it, 529 overloaded_error. Half the shipped 1 GiB container limit: the rest is
    # the process itself, its worker processes and what is not counted
    memory_budget_mb: int = _knob(512, bound=_POS)
    # reasoning one Messages request may restore from thinking signatures (also counted in
    # memory_budget_mb, twice: the text and its copy in the upstream payload)
    max_restored_reasoning_bytes: int = _knob(4 * 1024 * 1024, bound=_POS)
    # PDF text extraction (gateway/messages/pdf_pool.py): worker processes, and the CPU
    # seconds one document and one request may use
    pdf_workers: int = _knob(2, bound=_POS)
    pdf_cpu_seconds: float = _knob(5.0, bound=_POS)
    pdf_request_cpu_seconds: float = _knob(20.0, bound=_POS)
    # bodies larger than this are counted and decoded in a child process; 0: all on the loop
    decode_offload_bytes: int = _knob(1024 * 1024, bound=_NONNEG)
    shutdown_grace: float = _knob(30.0, bound=_POS)
    write_timeout: float = _knob(60.0, bound=_POS)
    # client connections (gateway/http/protocol.py, gateway/http/listener.py)
    # a connection waiting for a request head, from accept or reply
    idle_timeout: float = _knob(60.0, bound=_POS)
    request_head_timeout: float = _knob(30.0, bound=_POS)  # from a head's first byte to its last
    # from the end of the head to the body's last byte
    request_body_timeout: float = _knob(60.0, bound=_POS)
    max_connections: int = _knob(0, bound=_NONNEG)  # API connections at once; 0: unlimited
    metrics_host: str = _knob("", shown="`server.host`")  # "": server.host
    metrics_port: int = 0  # 0: /metrics on the API listener
    log_level: str = "info"
    api_keys_env: str | None = None
    api_keys: tuple[str, ...] = _not_toml((), secret=True)
    keep_billing_header: bool = False
    signing_key_env: str | None = None
    signing_key: bytes = _not_toml(b"", secret=True)
    # an env var holding earlier signing keys, comma-separated: signatures made under them
    # still open (a key rotation), new ones are made under signing_key only
    previous_signing_keys_env: str | None = None
    previous_signing_keys: tuple[bytes, ...] = _not_toml((), secret=True)
    # where it came from: "env", "file" (the state directory's key) or "random" (this process)
    signing_key_source: str = _not_toml("random")

    @property
    def metrics_apart(self) -> bool:
        """/metrics has a listener of its own (and is then not served on the API's)."""
        return self.metrics_port != 0


@dataclass(frozen=True)
class BatchesConfig:
    """``[batches]``: Message Batches (gateway/batches/)."""

    enabled: bool = True
    # "": a SQLite file in the state directory; "sqlite:///PATH", a path, or "postgresql://..."
    database: str = _knob("", shown="`batches.sqlite3` in the state directory")
    database_env: str | None = None  # an env var holding the database URL (a password in it)
    max_in_flight: int = _knob(2, bound=_POS)  # batch requests at once per upstream, <= 64
    # batch requests at once on an upstream no interactive request has used for idle_after
    # seconds (0: max_in_flight); up to the upstream's slots fills an idle server
    max_in_flight_idle: int = _knob(0, bound=_NONNEG)
    idle_after: float = _knob(10.0, bound=_POS)
    # batch work starts new requests on an upstream only while fewer interactive requests
    # than this are in flight on it
    interactive_threshold: int = _knob(1, bound=_POS)
    expire_after: float = _knob(86400.0, bound=_POS)  # seconds: the API's 24 hours
    retention_days: float = _knob(29.0, bound=_POS)  # an ended batch's results are kept
    public_base_url: str = _knob("", shown="the request's own scheme and host")
    max_requests: int = _knob(100_000, bound=_POS)
    max_body_bytes: int = _knob(256 * 1024 * 1024, bound=_POS)
    poll_interval: float = _knob(1.0, bound=_POS)  # seconds between looks for work when idle
    lease: float = _knob(60.0, bound=_POS)  # seconds a claim lasts unless renewed
    database_url: str = _not_toml("", secret=True)  # resolved: database, database_env or default
    # True when database or database_env named the location: a store that cannot be opened
    # there stops the start; False (the state directory's file): batches are turned off instead
    database_explicit: bool = _not_toml(False)


@dataclass(frozen=True)
class WebSearchConfig:
    """``[web_search]``: the web_search server tool, run by the gateway (gateway/tools/)."""

    searxng_url: str  # a SearXNG instance, http(s)://host[:port][/path]; its JSON API
    timeout: float = _knob(10.0, bound=_POS)  # seconds one search may take, all in
    max_results: int = _knob(5, bound=_POS)  # results kept per search (at most 20)
    # characters of one result's snippet the model sees (at most 8000)
    max_result_chars: int = _knob(1000, bound=_POS)
    # characters of search results the model sees in one request, all searches together
    max_request_chars: int = _knob(40_000, bound=_POS)
    # searches in one request, at most, whatever the tool's max_uses says
    max_searches: int = _knob(8, bound=_POS)
    max_response_bytes: int = _knob(2 * 1024 * 1024, bound=_POS)  # a backend reply, at most


@dataclass(frozen=True)
class Config:
    server: ServerConfig
    upstreams: Mapping[str, UpstreamConfig]
    models: Mapping[str, ModelRoute]
    batches: BatchesConfig = field(default_factory=BatchesConfig)
    web_search: WebSearchConfig | None = None  # None: no [web_search] table
    source: str = "<built-in default>"
    # set by --workers in each worker process (not TOML knobs): prometheus multiprocess
    # directory and SO_REUSEPORT on the listening socket
    metrics_dir: str | None = None
    reuse_port: bool = False

@dataclass(frozen=True)
class Knob:
    """One TOML key of the schema, derived from its dataclass field."""

    name: str
    types: tuple[type, ...]
    required: bool
    default: Any  # None when required or unset
    bound: str | None  # "> 0", ">= 0" or None
    shown: str | None  # the default as documentation writes it, when not the value itself


_TOML_TYPES: dict[Any, tuple[type, ...]] = {
    str: (str,), int: (int,), float: (int, float), bool: (bool,), str | None: (str,),
}


@functools.cache
def knobs(cls: type) -> dict[str, Knob]:
    """The TOML keys of one table (ServerConfig, UpstreamConfig or ModelRoute), in order."""
    hints = get_type_hints(cls)
    out: dict[str, Knob] = {}
    for f in fields(cls):
        if not f.metadata.get("toml", True):
            continue
        required = f.default is MISSING and f.default_factory is MISSING
        types = f.metadata.get("types") or _TOML_TYPES[hints[f.name]]
        out[f.name] = Knob(f.name, types, required, None if required else f.default,
                           f.metadata.get("bound"), f.metadata.get("shown"))
    return out


# Where each table sits in a file, as errors and documentation name its keys.
TABLES: dict[str, type] = {
    "server": ServerConfig, "upstreams.<name>": UpstreamConfig, "models[]": ModelRoute,
    "batches": BatchesConfig, "web_search": WebSearchConfig,
}


def schema() -> dict[str, Knob]:
    """Every key of the config file: ``server.host``, ``upstreams.<name>.base_url``, ..."""
    return {f"{table}.{name}": knob
            for table, cls in TABLES.items() for name, knob in knobs(cls).items()}


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

