"""The one loader: TOML file + environment -> frozen dataclasses.

This is the only module that reads files or ``os.environ``. The dataclasses are the
schema (gateway/ops/config_schema.py): each field is a key (unless marked otherwise) whose
types, whether it is required and its default come from the field (:func:`knobs`,
:func:`schema`); with no file, the built-in default (gateway/ops/config_default.py). Every
key is checked: an unknown key, a missing or wrong-typed value, a value out of its
bound, a model that names an unknown upstream, a duplicate model name or a base_url
that is not http(s) raises :class:`ConfigError`, whose text names the file and the key.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from gateway.ops.config_default import DEFAULT_TOML
from gateway.ops.config_schema import (
    _NONNEG,
    MAX_MODEL_NAME_CHARS,
    BatchesConfig,
    Config,
    Knob,
    ModelRoute,
    ServerConfig,
    UpstreamConfig,
    WebSearchConfig,
    find_route,
    knobs,
)
from gateway.ops.signing_key import default_signing_key, state_dir

# the schema's names most callers import from here (the rest: gateway/ops/config_schema.py)
__all__ = ["WORKER_ENV", "Config", "ConfigError", "ModelRoute", "UpstreamConfig", "find_route",
           "load", "parse", "with_overrides"]

UPSTREAM_KINDS = ("openai", "vllm", "sglang", "llamacpp", "ollama")
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(Exception):
    """Bad configuration; the message names the file and the key."""


INLINE_THINKING = ("auto", "opened", "off")
BALANCE = ("affinity", "round_robin", "least_busy")  # gateway/upstream/replicas.py's policies
BALANCE = ("affinity", "round_robin", "least_busy")  # gateway/upstream/replicas.py's policies
KEEPALIVE = {True: "auto", False: "never", "auto": "auto", "always": "always", "never": "never"}
CAPABILITY_SETTINGS = ("auto", "yes", "no")
CAPABILITY_KNOBS = ("images", "tool_references", "named_tool_choice")


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
# a result's snippet, at most: a result is sealed whole in its encrypted_content, which the
# gateway opens again only up to 64 K characters (gateway/messages/web_search.py)
MAX_RESULT_CHARS = 8000


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
    if w["max_result_chars"] > MAX_RESULT_CHARS:
        raise ConfigError(f"{src}: web_search.max_result_chars: must be at most "
                          f"{MAX_RESULT_CHARS}, got {w['max_result_chars']}")
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
