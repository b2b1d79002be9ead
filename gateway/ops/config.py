"""The one loader: TOML file + environment -> frozen dataclasses.

This is the only module that reads files or ``os.environ``. The dataclasses are the
schema: each field is a key (unless marked otherwise) whose types, whether it is
required and its default come from the field (:func:`knobs`, :func:`schema`). Every
key is checked: an unknown key, a missing or wrong-typed value, a value out of its
bound, a model that names an unknown upstream, a duplicate model name or a base_url
that is not http(s) raises :class:`ConfigError`, whose text names the file and the key.
"""

from __future__ import annotations

import functools
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, get_type_hints
from urllib.parse import urlsplit

from gateway.ops.signing_key import default_signing_key, state_dir
from gateway.text.glob import glob_match

UPSTREAM_KINDS = ("openai", "vllm", "sglang", "llamacpp", "ollama")
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(Exception):
    """Bad configuration; the message names the file and the key."""


# The dataclasses below are the schema: every field is a TOML key of its table unless its
# metadata says ``toml: False``. A key's TOML types come from its annotation (a float takes an
# integer too), it is required when the field has no default, and its default is the field's.
# Metadata: ``bound`` ("> 0" or ">= 0") is checked by parse(); ``types`` overrides the
# annotation's; ``shown`` is the default as README.md's table writes it when it is not the value
# itself. README.md's table and deploy/gateway.example.toml are tested against this schema.


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


INLINE_THINKING = ("auto", "opened", "off")
BALANCE = ("affinity", "round_robin", "least_busy")  # gateway/upstream/replicas.py's policies
KEEPALIVE = {True: "auto", False: "never", "auto": "auto", "always": "always", "never": "never"}
CAPABILITY_SETTINGS = ("auto", "yes", "no")
CAPABILITY_KNOBS = ("images", "tool_references", "named_tool_choice")
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
    # request bodies being read and decoded at once
    max_decoding_bytes: int = _knob(64 * 1024 * 1024, bound=_POS)
    # reasoning one Messages request may restore from thinking signatures (also counted in
    # max_decoding_bytes while the request is prepared)
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
    # characters of one result's snippet the model sees
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


# The built-in default config: its routes (every key's default is its dataclass field's).
DEFAULT_TOML = """
[upstreams.local-vllm]
base_url = "http://127.0.0.1:8000/v1"
kind = "vllm"

[upstreams.local-ollama]
base_url = "http://127.0.0.1:11434/v1"
kind = "ollama"

[[models]]
name = "reasoning"
upstream = "local-vllm"
upstream_model = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"

[[models]]
name = "qwen2.5:3b-instruct"
upstream = "local-ollama"
upstream_model = "qwen2.5:3b-instruct"

# Claude Code names Claude models it was never told about (its default, its subagents'
# haiku tier): every claude-* name goes to the main model.
[[models]]
name = "claude-*"
upstream = "local-vllm"
upstream_model = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"
"""


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


_TOP_KEYS = ("server", "upstreams", "models", "batches", "web_search")
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean",
               list: "an array of strings"}


def _check_table(src: str, where: str, table: Any, schema: Mapping[str, Knob]) -> dict[str, Any]:
    """The table's keys checked, then each default filled in and each bound checked."""
    if not isinstance(table, dict):
        raise ConfigError(f"{src}: {where}: must be a table")
    for key in table:
        if key not in schema:
            raise ConfigError(f"{src}: {where}.{key}: unknown key")
    for key, knob in schema.items():
        if key not in table:
            if knob.required:
                raise ConfigError(f"{src}: {where}.{key}: missing (required)")
            continue
        value = table[key]
        types = knob.types
        # bool is an int subclass; only accept it where bool is asked for
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            want = " or ".join(_TYPE_NAMES[t] for t in types)
            raise ConfigError(f"{src}: {where}.{key}: must be {want}, got {value!r}")
    out = {key: knob.default for key, knob in schema.items() if not knob.required}
    for key, value in table.items():
        knob = schema[key]
        if knob.bound is not None:
            _positive(src, f"{where}.{key}", value, allow_zero=knob.bound == _NONNEG)
        out[key] = float(value) if float in knob.types and bool not in knob.types else value
    return out


def _positive(src: str, where: str, value: float, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{src}: {where}: must be {'>= 0' if allow_zero else '> 0'}")


_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")  # what a bearer token may hold


def _env(env: Mapping[str, str], src: str, where: str, name: str) -> str:
    value = env.get(name)
    if not value:
        raise ConfigError(f"{src}: {where}: environment variable {name} is not set")
    return value


def parse(data: Mapping[str, Any], src: str, env: Mapping[str, str]) -> Config:
    for key in data:
        if key not in _TOP_KEYS:
            raise ConfigError(f"{src}: {key}: unknown key")

    srv = _check_table(src, "server", data.get("server", {}), knobs(ServerConfig))
    prefix = srv["prefix"]
    if prefix and (not prefix.startswith("/") or prefix.endswith("/")):
        raise ConfigError(f"{src}: server.prefix: must start with '/' and not end with '/' "
                          f"(or be empty), got {prefix!r}")
    port = srv["port"]
    if not 0 <= port <= 65535:
        raise ConfigError(f"{src}: server.port: must be 0..65535, got {port}")
    _check_metrics_listener(src, srv, port)
    if srv["log_level"] not in LOG_LEVELS:
        raise ConfigError(f"{src}: server.log_level: must be one of {', '.join(LOG_LEVELS)}")
    api_keys: tuple[str, ...] = ()
    if srv["api_keys_env"] is not None:
        raw = _env(env, src, "server.api_keys_env", srv["api_keys_env"])
        api_keys = tuple(k.strip() for k in raw.split(",") if k.strip())
    if srv["signing_key_env"] is not None:
        signing_key = _env(env, src, "server.signing_key_env", srv["signing_key_env"]).encode()
        key_source = "env"
    else:
        signing_key, key_source = default_signing_key(env)
    previous: tuple[bytes, ...] = ()
    if srv["previous_signing_keys_env"] is not None:
        raw = _env(env, src, "server.previous_signing_keys_env",
                   srv["previous_signing_keys_env"])
        previous = tuple(dict.fromkeys(
            k.strip().encode() for k in raw.split(",") if k.strip() and k.strip().encode()
            != signing_key))
    server = ServerConfig(
        **srv,
        api_keys=api_keys,
        signing_key=signing_key,
        signing_key_source=key_source,
        previous_signing_keys=previous,
    )

    raw_ups = data.get("upstreams", {})
    if not isinstance(raw_ups, dict):
        raise ConfigError(f"{src}: upstreams: must be a table of tables")
    upstreams: dict[str, UpstreamConfig] = {}
    for name, table in raw_ups.items():
        where = f"upstreams.{name}"
        up = _check_table(src, where, table, knobs(UpstreamConfig))
        _base_urls(src, where, table, up)
        if up["kind"] not in UPSTREAM_KINDS:
            raise ConfigError(f"{src}: {where}.kind: must be one of {', '.join(UPSTREAM_KINDS)}")
        if up["keepalive"] not in KEEPALIVE:
            raise ConfigError(f"{src}: {where}.keepalive: must be \"auto\", \"always\", "
                              f"\"never\" or a boolean, got {up['keepalive']!r}")
        up["keepalive"] = KEEPALIVE[up["keepalive"]]
        if up["balance"] not in BALANCE:
            raise ConfigError(f"{src}: {where}.balance: must be one of {', '.join(BALANCE)}")
        if up["inline_thinking"] not in INLINE_THINKING:
            raise ConfigError(f"{src}: {where}.inline_thinking: must be one of "
                              f"{', '.join(INLINE_THINKING)}")
        _fleet(src, where, table, up)
        key_env = up["api_key_env"]
        api_key = _env(env, src, f"{where}.api_key_env", key_env) if key_env is not None else None
        if api_key is not None and not _TOKEN_CHARS.fullmatch(api_key.strip()):
            # it goes into an HTTP header line: a newline would end it (header injection)
            raise ConfigError(f"{src}: {where}.api_key_env: the key in {key_env} "
                              "must be printable ASCII without spaces")
        if api_key is not None:
            api_key = api_key.strip()
        upstreams[name] = UpstreamConfig(name=name, api_key=api_key, **up)

    raw_models = data.get("models", [])
    if not isinstance(raw_models, list):
        raise ConfigError(f"{src}: models: must be an array of tables ([[models]])")
    models: dict[str, ModelRoute] = {}
    for i, table in enumerate(raw_models):
        where = f"models[{i}]"
        m = _check_table(src, where, table, knobs(ModelRoute))
        if not m["name"]:
            raise ConfigError(f"{src}: {where}.name: must not be empty")
        if len(m["name"]) > MAX_MODEL_NAME_CHARS:
            raise ConfigError(f"{src}: {where}.name: at most {MAX_MODEL_NAME_CHARS} characters")
        if m["name"] in models:
            raise ConfigError(f"{src}: {where}.name: duplicate model name {m['name']!r}")
        for knob in CAPABILITY_KNOBS:
            if m[knob] not in CAPABILITY_SETTINGS:
                raise ConfigError(f"{src}: {where}.{knob}: must be one of "
                                  f"{', '.join(CAPABILITY_SETTINGS)}")
        if m["upstream"] not in upstreams:
            raise ConfigError(f"{src}: {where}.upstream: unknown upstream {m['upstream']!r}")
        upstream = upstreams[m.pop("upstream")]
        if "display_name" not in table:
            m["display_name"] = m["name"]
        m["fallbacks"] = tuple(m["fallbacks"])
        models[m["name"]] = ModelRoute(upstream=upstream, **m)
    if not models:
        raise ConfigError(f"{src}: models: at least one [[models]] entry is required")
    models = _fallbacks(src, models)
    batches = _batches(src, data.get("batches", {}), env)
    web_search = _web_search(src, data["web_search"]) if "web_search" in data else None
    return Config(server=server, upstreams=upstreams, models=models, batches=batches,
                  web_search=web_search, source=src)


MAX_SEARCH_RESULTS = 20


def _web_search(src: str, table: Any) -> WebSearchConfig:
    w = _check_table(src, "web_search", table, knobs(WebSearchConfig))
    url = w["searxng_url"].rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
        raise ConfigError(f"{src}: web_search.searxng_url: must be an http(s) URL "
                          f"(scheme://host[:port][/path]), got {w['searxng_url']!r}")
    if w["max_results"] > MAX_SEARCH_RESULTS:
        raise ConfigError(f"{src}: web_search.max_results: must be at most "
                          f"{MAX_SEARCH_RESULTS}, got {w['max_results']}")
    w["searxng_url"] = url
    return WebSearchConfig(**w)


def _fallbacks(src: str, models: dict[str, ModelRoute]) -> dict[str, ModelRoute]:
    """Each model's ``fallbacks`` checked (configured names, not its own, none twice) and
    resolved to routes. Only a model's own list is followed, so chains and cycles of
    fallbacks cannot loop."""
    out = {}
    for i, (name, route) in enumerate(models.items()):
        where = f"models[{i}].fallbacks"
        for n, other in enumerate(route.fallbacks):
            if not isinstance(other, str) or other not in models:
                raise ConfigError(f"{src}: {where}[{n}]: unknown model {other!r}")
            if other == name:
                raise ConfigError(f"{src}: {where}[{n}]: a model cannot fall back to itself")
        if len(set(route.fallbacks)) != len(route.fallbacks):
            raise ConfigError(f"{src}: {where}: names a model twice")
        out[name] = replace(route, fallback_routes=tuple(models[f] for f in route.fallbacks))
    return out


def _base_urls(src: str, where: str, table: Mapping[str, Any], up: dict[str, Any]) -> None:
    """Exactly one of base_url and base_urls, each URL http(s); base_url set to the first."""
    if "base_url" in table and "base_urls" in table:
        raise ConfigError(f"{src}: {where}.base_urls: set base_url or base_urls, not both")
    if "base_url" not in table and "base_urls" not in table:
        raise ConfigError(f"{src}: {where}.base_url: missing (required, or base_urls)")
    key = "base_url" if "base_url" in table else "base_urls"
    urls = [up["base_url"]] if key == "base_url" else up["base_urls"]
    if not urls:
        raise ConfigError(f"{src}: {where}.base_urls: must list at least one URL")
    clean = []
    for i, url in enumerate(urls):
        at = key if key == "base_url" else f"{key}[{i}]"
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"{src}: {where}.{at}: must be an http(s) URL, got {url!r}")
        clean.append(url.rstrip("/"))
    if len(set(clean)) != len(clean):
        raise ConfigError(f"{src}: {where}.base_urls: lists a URL twice")
    up["base_url"] = clean[0]
    up["base_urls"] = tuple(clean) if key == "base_urls" else ()


DISCOVER = ("none", "dns")
MAX_REPLICAS = 256  # max_replicas' own bound: the per-replica metric series stay few
_PATH_CHARS = re.compile(r"/[\x21-\x7e]*")  # what goes into a request line


def _fleet(src: str, where: str, table: Mapping[str, Any], up: dict[str, Any]) -> None:
    """discover, max_replicas and health_path checked; health_path's default by kind."""
    if up["discover"] not in DISCOVER:
        raise ConfigError(f"{src}: {where}.discover: must be one of {', '.join(DISCOVER)}")
    if up["discover"] == "dns" and "base_urls" in table:
        raise ConfigError(f"{src}: {where}.discover: \"dns\" takes base_url (one name to "
                          "resolve), not base_urls")
    if up["max_replicas"] > MAX_REPLICAS:
        raise ConfigError(f"{src}: {where}.max_replicas: must be at most {MAX_REPLICAS}")
    path = up["health_path"] or ("/api/version" if up["kind"] == "ollama" else "/health")
    if not _PATH_CHARS.fullmatch(path):
        raise ConfigError(f"{src}: {where}.health_path: must start with '/' and hold "
                          f"printable ASCII without spaces, got {path!r}")
    up["health_path"] = path


MAX_BATCH_IN_FLIGHT = 64


def _batches(src: str, table: Any, env: Mapping[str, str]) -> BatchesConfig:
    b = _check_table(src, "batches", table, knobs(BatchesConfig))
    for key in ("max_in_flight", "max_in_flight_idle"):
        if b[key] > MAX_BATCH_IN_FLIGHT:
            raise ConfigError(f"{src}: batches.{key}: must be at most "
                              f"{MAX_BATCH_IN_FLIGHT}, got {b[key]}")
    if b["database"] and b["database_env"]:
        raise ConfigError(f"{src}: batches.database_env: set database or database_env, not both")
    url = b["database"]
    if b["database_env"]:
        url = _env(env, src, "batches.database_env", b["database_env"])
    if url and not (url.startswith(("sqlite:///", "postgresql://", "postgres://", "/"))):
        raise ConfigError(f"{src}: batches.database: must be sqlite:///PATH, an absolute path "
                          "or postgresql://...")
    if not url:
        folder = state_dir(env)
        url = f"sqlite:///{folder}/batches.sqlite3" if folder else ""
    base = b["public_base_url"].rstrip("/")
    if base:
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
            raise ConfigError(f"{src}: batches.public_base_url: must be an http(s) URL "
                              f"(scheme://host[:port][/path]), got {base!r}")
    b["public_base_url"] = base
    explicit = bool(b["database"] or b["database_env"])
    return BatchesConfig(**b, database_url=url, database_explicit=explicit)


def _check_metrics_listener(src: str, srv: Mapping[str, Any], port: int) -> None:
    metrics_port = srv["metrics_port"]
    if not 0 <= metrics_port <= 65535:
        raise ConfigError(f"{src}: server.metrics_port: must be 0..65535, got {metrics_port}")
    if metrics_port and metrics_port == port:
        raise ConfigError(f"{src}: server.metrics_port: must differ from server.port "
                          "(0 serves /metrics on the API listener)")
    if srv.get("metrics_host") and not metrics_port:
        raise ConfigError(f"{src}: server.metrics_host: needs server.metrics_port")


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


def load(path: str | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Load the config from ``path``, ``$GATEWAY_CONFIG``, or the built-in default."""
    env = os.environ if env is None else env
    cfg = _load(path or env.get("GATEWAY_CONFIG") or None, env)
    metrics_dir = env.get("PROMETHEUS_MULTIPROC_DIR") or None
    if metrics_dir or env.get(WORKER_ENV):
        from dataclasses import replace

        cfg = replace(cfg, metrics_dir=metrics_dir, reuse_port=bool(env.get(WORKER_ENV)))
    return cfg


WORKER_ENV = "LLM_GATEWAY_WORKER"  # set by the --workers supervisor in each worker's env


def _load(path: str | None, env: Mapping[str, str]) -> Config:
    if path is None:
        return parse(tomllib.loads(DEFAULT_TOML), "<built-in default>", env)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse(data, path, env)


def with_overrides(cfg: Config, *, host: str | None, port: int | None) -> Config:
    from dataclasses import replace

    server = cfg.server
    if host is not None:
        server = replace(server, host=host)
    if port is not None:
        server = replace(server, port=port)
    return replace(cfg, server=server)
