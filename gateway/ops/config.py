"""The one loader: TOML file + environment -> frozen dataclasses.

This is the only module that reads files or ``os.environ``. The dataclasses are the
schema (gateway/ops/config_schema.py): each key declares its types, default, value set,
bounds and format, and one generic pass (gateway/ops/config_check.py) checks every key of
every table against it. What :func:`parse` adds is only what no single key can say: the file's
shape (its tables), rules relating keys to one another (each marked ``cross-key``), references
between tables (a model's upstream, its fallbacks) and the values the environment holds. Any
refusal raises :class:`ConfigError`, whose one-line text names the file and the key.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, NoReturn

from gateway.ops import tls
from gateway.ops.config_check import ConfigError, check_format, check_table
from gateway.ops.config_default import DEFAULT_TOML
from gateway.ops.config_schema import (
    BALANCE,
    CAPABILITY_SETTINGS,
    DISCOVER,
    INLINE_THINKING,
    LOG_LEVELS,
    MAX_BATCH_IN_FLIGHT,
    MAX_CLIENTS,
    MAX_MODEL_NAME_CHARS,
    MAX_REPLICAS,
    MAX_RESULT_CHARS,
    MAX_SEARCH_RESULTS,
    UPSTREAM_KINDS,
    AuthConfig,
    BatchesConfig,
    ClientConfig,
    Config,
    LimitsConfig,
    ModelRoute,
    ServerConfig,
    TelemetryConfig,
    UpstreamConfig,
    WebFetchConfig,
    WebSearchConfig,
    find_route,
    knobs,
)
from gateway.ops.redis_url import parse_url
from gateway.ops.signing_key import default_signing_key, state_dir

# the schema's names most callers import from here (the rest: gateway/ops/config_schema.py)
__all__ = [
    "ANONYMOUS",
    "BALANCE",
    "CAPABILITY_SETTINGS",
    "DISCOVER",
    "INLINE_THINKING",
    "LOG_LEVELS",
    "MAX_BATCH_IN_FLIGHT",
    "MAX_MODEL_NAME_CHARS",
    "MAX_REPLICAS",
    "MAX_RESULT_CHARS",
    "MAX_SEARCH_RESULTS",
    "UPSTREAM_KINDS",
    "WORKER_ENV",
    "Config",
    "ConfigError",
    "ModelRoute",
    "UpstreamConfig",
    "find_route",
    "load",
    "parse",
    "with_overrides",
]

_TOP_KEYS = (
    "server",
    "upstreams",
    "models",
    "batches",
    "web_search",
    "web_fetch",
    "clients",
    "limits",
    "auth",
    "telemetry",
)
# the client of the keys of server.api_keys_env (and of every request when no key is set)
ANONYMOUS = "anonymous"
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
    server = _server(src, data.get("server", {}), env)
    raw_ups = data.get("upstreams", {})
    if not isinstance(raw_ups, dict):
        raise ConfigError(f"{src}: upstreams: must be a table of tables")
    upstreams = {name: _upstream(src, name, table, env) for name, table in raw_ups.items()}
    models = _fallbacks(src, _models(src, data.get("models", []), upstreams))
    batches = _batches(src, data.get("batches", {}), env)
    web_search = None
    if "web_search" in data:
        web_search = WebSearchConfig(
            **check_table(src, "web_search", data["web_search"], knobs(WebSearchConfig))
        )
    web_fetch = WebFetchConfig(
        **check_table(src, "web_fetch", data.get("web_fetch", {}), knobs(WebFetchConfig))
    )
    clients = _clients(src, data.get("clients", []), env, server)
    limits = _limits(src, data.get("limits", {}), env)
    auth = _auth(src, data.get("auth", {}), env, clients)
    _check_forwarding(src, clients, auth)
    telemetry = _telemetry(src, data["telemetry"], env) if "telemetry" in data else None
    return Config(
        server=server,
        upstreams=upstreams,
        models=models,
        batches=batches,
        web_search=web_search,
        web_fetch=web_fetch,
        clients=clients,
        limits=limits,
        auth=auth,
        telemetry=telemetry,
        source=src,
    )


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _telemetry(src: str, table: Any, env: Mapping[str, str]) -> TelemetryConfig:
    tel = check_table(src, "telemetry", table, knobs(TelemetryConfig))
    for module in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"):
        if not _has(module):
            raise ConfigError(
                f"{src}: telemetry: needs the OpenTelemetry SDK and its OTLP exporter "
                "(pip install 'llm-gateway[otel]')"
            )
    headers: list[tuple[str, str]] = []
    if tel["headers_env"] is not None:
        raw = _env(env, src, "telemetry.headers_env", tel["headers_env"])
        for part in raw.split(","):
            name, eq, value = part.partition("=")
            if not eq or not name.strip() or not _TOKEN_CHARS.fullmatch(name.strip()):
                # the value may hold a key: not echoed
                raise ConfigError(
                    f"{src}: telemetry.headers_env: {tel['headers_env']} must hold "
                    "name=value pairs separated by commas"
                )
            headers.append((name.strip(), value.strip()))
    return TelemetryConfig(**tel, headers=tuple(headers))


def _keys(env: Mapping[str, str], src: str, where: str, name: str) -> tuple[str, ...]:
    raw = _env(env, src, where, name)
    return tuple(k.strip() for k in raw.split(",") if k.strip())


def _clients(
    src: str, raw: Any, env: Mapping[str, str], server: ServerConfig
) -> tuple[ClientConfig, ...]:
    if not isinstance(raw, list):
        raise ConfigError(f"{src}: clients: must be an array of tables ([[clients]])")
    if len(raw) > MAX_CLIENTS:
        raise ConfigError(f"{src}: clients: at most {MAX_CLIENTS} clients")
    out: list[ClientConfig] = []
    names: set[str] = set()
    # the anonymous keys first: a client's key may not be one of them (whose would it be?)
    digests = {hashlib.sha256(k.encode()).digest(): "server.api_keys_env" for k in server.api_keys}
    for i, table in enumerate(raw):
        where = f"clients[{i}]"
        c = check_table(src, where, table, knobs(ClientConfig))
        # cross-entry: a name labels one client; "anonymous" is the unnamed keys' label
        if c["name"] == ANONYMOUS:
            raise ConfigError(
                f"{src}: {where}.name: {ANONYMOUS!r} is the name of the keys of server.api_keys_env"
            )
        if c["name"] in names:
            raise ConfigError(f"{src}: {where}.name: duplicate client name {c['name']!r}")
        names.add(c["name"])
        # cross-key: exactly one of key_env and key_sha256
        if (c["key_env"] is None) == (not c["key_sha256"]):
            raise ConfigError(f"{src}: {where}.key_env: set key_env or key_sha256 (one of them)")
        if c["key_env"] is not None:
            key = _env(env, src, f"{where}.key_env", c["key_env"]).strip()
            if not _TOKEN_CHARS.fullmatch(key):
                raise ConfigError(
                    f"{src}: {where}.key_env: the key in {c['key_env']} "
                    "must be printable ASCII without spaces"
                )
            digest = hashlib.sha256(key.encode()).digest()
        else:
            key = ""
            digest = bytes.fromhex(c["key_sha256"])
        # cross-entry: one key, one client
        if digest in digests:
            raise ConfigError(f"{src}: {where}: its key is also the key of {digests[digest]}")
        digests[digest] = f"clients[{i}]"
        out.append(ClientConfig(**c, key_digest=digest, key=key))
    return tuple(out)


def _auth(
    src: str, table: Any, env: Mapping[str, str], clients: tuple[ClientConfig, ...]
) -> AuthConfig:
    a = check_table(src, "auth", table, knobs(AuthConfig))
    secret = ""
    if a["oidc_issuer"]:
        if not a["oidc_client_id"]:
            raise ConfigError(f"{src}: auth.oidc_client_id: required with auth.oidc_issuer")
        if "openid" not in a["oidc_scopes"]:
            raise ConfigError(f"{src}: auth.oidc_scopes: must hold 'openid'")
        if a["oidc_client_secret_env"] is not None:
            secret = _env(env, src, "auth.oidc_client_secret_env", a["oidc_client_secret_env"])
    # cross-entry: one claim value, one client
    owner: dict[str, str] = {}
    for c in clients:
        for value in c.oidc_values:
            if value in owner:
                raise ConfigError(
                    f"{src}: clients: oidc_values {value!r} is listed by both "
                    f"{owner[value]!r} and {c.name!r}"
                )
            owner[value] = c.name
    return AuthConfig(**a, oidc_client_secret=secret)


def _check_forwarding(src: str, clients: tuple[ClientConfig, ...], auth: AuthConfig) -> None:
    """Forwarded identities (gateway/tenancy/forwarding.py): a forwarder needs a trusted
    address and an address a forwarder; one forwarded id or email names one client."""
    forwarders = [c.name for c in clients if c.forwards_identity]
    if forwarders and not auth.trusted_forwarders:
        raise ConfigError(
            f"{src}: clients.forwards_identity: set auth.trusted_forwarders, the addresses "
            f"{forwarders[0]!r} forwards from (else its identity headers are never believed)"
        )
    if auth.trusted_forwarders and not forwarders:
        raise ConfigError(
            f"{src}: auth.trusted_forwarders: no client has forwards_identity = true "
            "(the key a forwarder presents)"
        )
    seen: dict[tuple[str, str], str] = {}
    for c in clients:
        named = [("forwarded_ids", u) for u in c.forwarded_ids]
        named += [("forwarded_emails", e.lower()) for e in c.forwarded_emails]
        for key, value in named:
            if (key, value) in seen and seen[key, value] != c.name:
                raise ConfigError(
                    f"{src}: clients.{key}: {value!r} names both {seen[key, value]!r} "
                    f"and {c.name!r}"
                )
            seen[key, value] = c.name


def _limits(src: str, table: Any, env: Mapping[str, str]) -> LimitsConfig:
    lim = check_table(src, "limits", table, knobs(LimitsConfig))
    url = ""
    if lim["redis_url_env"] is not None:
        url = _env(env, src, "limits.redis_url_env", lim["redis_url_env"]).strip()
        if not url.startswith(("redis://", "rediss://", "unix://")):
            # the value may hold a password: not echoed
            raise ConfigError(
                f"{src}: limits.redis_url_env: the URL in {lim['redis_url_env']} must be "
                "redis://[:password@]host[:port][/db]"
            )
        try:
            parse_url(url)
        except ValueError as exc:  # its text names no part of the URL
            raise ConfigError(f"{src}: limits.redis_url_env: {exc}") from None
    return LimitsConfig(**lim, redis_url=url)


def _server(src: str, table: Any, env: Mapping[str, str]) -> ServerConfig:
    srv = check_table(src, "server", table, knobs(ServerConfig))
    # cross-key: the metrics listener is a second listener beside server.port's
    if srv["metrics_port"] and srv["metrics_port"] == srv["port"]:
        raise ConfigError(
            f"{src}: server.metrics_port: must differ from server.port "
            "(0 serves /metrics on the API listener)"
        )
    # cross-key: metrics_host is the address of metrics_port's listener, which 0 leaves out
    if srv["metrics_host"] and not srv["metrics_port"]:
        raise ConfigError(f"{src}: server.metrics_host: needs server.metrics_port")
    fingerprint = _tls(src, srv["tls_cert_file"], srv["tls_key_file"])
    api_keys: tuple[str, ...] = ()
    if srv["api_keys_env"] is not None:
        api_keys = _keys(env, src, "server.api_keys_env", srv["api_keys_env"])
    admin_keys: tuple[str, ...] = ()
    if srv["admin_keys_env"] is not None:
        admin_keys = _keys(env, src, "server.admin_keys_env", srv["admin_keys_env"])
    if srv["signing_key_env"] is not None:
        signing_key = _env(env, src, "server.signing_key_env", srv["signing_key_env"]).encode()
        key_source = "env"
    else:
        signing_key, key_source = default_signing_key(env)
    previous: tuple[bytes, ...] = ()
    if srv["previous_signing_keys_env"] is not None:
        raw = _env(env, src, "server.previous_signing_keys_env", srv["previous_signing_keys_env"])
        # cross-key: the current signing key is no previous one
        previous = tuple(
            dict.fromkeys(
                k.strip().encode()
                for k in raw.split(",")
                if k.strip() and k.strip().encode() != signing_key
            )
        )
    return ServerConfig(
        **srv,
        api_keys=api_keys,
        admin_keys=admin_keys,
        signing_key=signing_key,
        signing_key_source=key_source,
        previous_signing_keys=previous,
        tls_fingerprint=fingerprint,
    )


def _tls(src: str, cert_file: str | None, key_file: str | None) -> str:
    """The pair's leaf fingerprint ("" without TLS): read and checked here, so a bad pair
    stops the start (and --check-config, and a reload) with one line naming the key."""
    # cross-key: a certificate is served with its key
    if bool(cert_file) != bool(key_file):
        missing = "tls_key_file" if cert_file else "tls_cert_file"
        return _refuse(src, missing, "set tls_cert_file and tls_key_file together (or neither)")
    if not cert_file or not key_file:
        return ""
    try:
        return tls.load(cert_file, key_file).fingerprint
    except tls.TLSError as exc:
        return _refuse(src, exc.key, str(exc))


def _refuse(src: str, key: str, message: str) -> NoReturn:
    raise ConfigError(f"{src}: server.{key}: {message}")


def _upstream(src: str, name: str, table: Any, env: Mapping[str, str]) -> UpstreamConfig:
    where = f"upstreams.{name}"
    up = check_table(src, where, table, knobs(UpstreamConfig))
    _base_urls(src, where, table, up)
    # cross-key: "dns" follows one name, base_url's host
    if up["discover"] == "dns" and "base_urls" in table:
        raise ConfigError(
            f'{src}: {where}.discover: "dns" takes base_url (one name to resolve), not base_urls'
        )
    # cross-key: only these engines schedule by a request's priority
    if up["send_priority"] and up["kind"] not in ("vllm", "sglang"):
        raise ConfigError(f"{src}: {where}.send_priority: needs kind vllm or sglang")
    # cross-key: health_path's default depends on kind
    if not up["health_path"]:
        up["health_path"] = "/api/version" if up["kind"] == "ollama" else "/health"
    key_env = up["api_key_env"]
    api_key = _env(env, src, f"{where}.api_key_env", key_env) if key_env is not None else None
    if api_key is not None:
        api_key = api_key.strip()
        if not _TOKEN_CHARS.fullmatch(api_key):
            # the environment's value goes into an HTTP header line: a newline would end it
            raise ConfigError(
                f"{src}: {where}.api_key_env: the key in {key_env} "
                "must be printable ASCII without spaces"
            )
    return UpstreamConfig(name=name, api_key=api_key, **up)


def _base_urls(src: str, where: str, table: Mapping[str, Any], up: dict[str, Any]) -> None:
    """Cross-key: exactly one of base_url and base_urls (an empty list is neither), no URL
    twice; base_url set to the first. Each URL's format is the generic pass's."""
    if "base_url" in table and "base_urls" in table:
        raise ConfigError(f"{src}: {where}.base_urls: set base_url or base_urls, not both")
    if "base_url" not in table and "base_urls" not in table:
        raise ConfigError(f"{src}: {where}.base_url: missing (required, or base_urls)")
    if "base_url" in table:
        up["base_urls"] = ()
        return
    urls = up["base_urls"]
    if not urls:
        raise ConfigError(f"{src}: {where}.base_urls: must list at least one URL")
    if len(set(urls)) != len(urls):
        raise ConfigError(f"{src}: {where}.base_urls: lists a URL twice")
    up["base_url"] = urls[0]


def _models(src: str, raw: Any, upstreams: Mapping[str, UpstreamConfig]) -> dict[str, ModelRoute]:
    if not isinstance(raw, list):
        raise ConfigError(f"{src}: models: must be an array of tables ([[models]])")
    models: dict[str, ModelRoute] = {}
    for i, table in enumerate(raw):
        where = f"models[{i}]"
        m = check_table(src, where, table, knobs(ModelRoute))
        # cross-entry: a name routes to one model
        if m["name"] in models:
            raise ConfigError(f"{src}: {where}.name: duplicate model name {m['name']!r}")
        # cross-table: upstream names an [upstreams.NAME]
        if m["upstream"] not in upstreams:
            raise ConfigError(f"{src}: {where}.upstream: unknown upstream {m['upstream']!r}")
        upstream = upstreams[m.pop("upstream")]
        # cross-key: display_name's default is the name
        if "display_name" not in table:
            m["display_name"] = m["name"]
        models[m["name"]] = ModelRoute(upstream=upstream, **m)
    if not models:
        raise ConfigError(f"{src}: models: at least one [[models]] entry is required")
    return models


def _fallbacks(src: str, models: dict[str, ModelRoute]) -> dict[str, ModelRoute]:
    """Cross-entry: each model's ``fallbacks`` are other configured models, none twice,
    resolved to routes. Only a model's own list is followed, so chains and cycles of
    fallbacks cannot loop."""
    out = {}
    for i, (name, route) in enumerate(models.items()):
        where = f"models[{i}].fallbacks"
        for n, other in enumerate(route.fallbacks):
            if other not in models:
                raise ConfigError(f"{src}: {where}[{n}]: unknown model {other!r}")
            if other == name:
                raise ConfigError(f"{src}: {where}[{n}]: a model cannot fall back to itself")
        if len(set(route.fallbacks)) != len(route.fallbacks):
            raise ConfigError(f"{src}: {where}: names a model twice")
        out[name] = replace(route, fallback_routes=tuple(models[f] for f in route.fallbacks))
    return out


def _batches(src: str, table: Any, env: Mapping[str, str]) -> BatchesConfig:
    b = check_table(src, "batches", table, knobs(BatchesConfig))
    # cross-key: one location, written in the file or held by the environment
    if b["database"] and b["database_env"]:
        raise ConfigError(f"{src}: batches.database_env: set database or database_env, not both")
    url = b["database"]
    if b["database_env"]:
        url = _env(env, src, "batches.database_env", b["database_env"])
        url = check_format(src, "batches.database_env", url, "database")
    if not url:
        folder = state_dir(env)
        url = f"sqlite:///{folder}/batches.sqlite3" if folder else ""
    explicit = bool(b["database"] or b["database_env"])
    return BatchesConfig(**b, database_url=url, database_explicit=explicit)


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
