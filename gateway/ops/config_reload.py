"""What a config re-read (SIGHUP) may change, and what it did change.

Only the tenancy part is applied to a running gateway: ``[[clients]]`` (names, keys, models,
limits, weights) and the keys named by ``server.api_keys_env`` and ``server.admin_keys_env``;
and, on a gateway serving TLS, the certificate pair (``server.tls_cert_file``/``tls_key_file``
read again, from the new paths if they changed).
Everything else (listeners, upstreams, models, batches, web search, ``[limits]``' store, the
other ``server`` keys) is built into the running process once; a change there is reported as
needing a restart and not applied.

Tables are compared by their TOML keys' values only: the values derived at load (a random
signing key where none can be kept, a resolved database URL) are not the file's and would
differ between two loads of one file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from gateway.ops.config_knob import knobs
from gateway.ops.config_schema import ClientConfig, Config

# the server keys a reload applies (with the values the environment gives them)
RELOADABLE_SERVER = ("api_keys_env", "admin_keys_env")
_SERVER_DERIVED = {"api_keys_env": "api_keys", "admin_keys_env": "admin_keys"}


@dataclass(frozen=True, slots=True)
class Changes:
    """What a new config changes against the running one."""

    added: tuple[str, ...] = ()  # client names
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()  # a client whose key, models, limits or weight changed
    server_keys: bool = False  # the keys of api_keys_env or admin_keys_env changed
    # tables whose other keys changed: not applied until a restart
    needs_restart: tuple[str, ...] = ()


def tenancy_of(running: Config, new: Config) -> Config:
    """``running`` with the tenancy part of ``new``: what the new :class:`Tenants` is built
    from; the rest stays the process's."""
    server = replace(
        running.server,
        **{k: getattr(new.server, k) for k in (*RELOADABLE_SERVER, *_SERVER_DERIVED.values())},
    )
    return replace(running, server=server, clients=new.clients)


def changes(started: Config, applied: Config, new: Config) -> Changes:
    """``new`` against the tenancy ``applied`` last and, for the rest, the config the process
    ``started`` with (so a change needing a restart is reported at every reload until one)."""
    old = {c.name: c for c in applied.clients}
    now = {c.name: c for c in new.clients}
    return Changes(
        added=tuple(n for n in now if n not in old),
        removed=tuple(n for n in old if n not in now),
        changed=tuple(n for n in now if n in old and not _same_client(old[n], now[n])),
        server_keys=any(
            getattr(applied.server, k) != getattr(new.server, k) for k in _SERVER_DERIVED.values()
        ),
        needs_restart=_restart_tables(started, new),
    )


def _same_client(a: ClientConfig, b: ClientConfig) -> bool:
    return _values(a) == _values(b) and a.key_digest == b.key_digest


def _restart_tables(started: Config, new: Config) -> tuple[str, ...]:
    out = []
    skip = set(RELOADABLE_SERVER)
    if started.server.tls and new.server.tls:  # the pair is read again (gateway/http/reload.py)
        skip |= {"tls_cert_file", "tls_key_file"}
    if _values(started.server, skip) != _values(new.server, skip):
        out.append("server")
    if _by_name(started.upstreams) != _by_name(new.upstreams):
        out.append("upstreams")
    if _by_name(started.models) != _by_name(new.models):
        out.append("models")
    for table in ("batches", "web_search", "web_fetch", "limits"):
        a, b = getattr(started, table), getattr(new, table)
        if (a is None) != (b is None) or (a is not None and _values(a) != _values(b)):
            out.append(table)
    return tuple(out)


def _by_name(table: Mapping[str, Any]) -> dict[str, tuple[Any, ...]]:
    return {name: _values(v) for name, v in table.items()}


def _values(obj: Any, skip: set[str] | frozenset[str] = frozenset()) -> tuple[Any, ...]:
    """The TOML keys' values of one table (a nested table by its own keys' values)."""
    names = knobs(obj.__class__)
    out = []
    for f in fields(obj):
        if f.name in names and f.name not in skip:
            value = getattr(obj, f.name)
            if hasattr(value, "__dataclass_fields__"):
                value = _values(value)
            out.append(value)
    return tuple(out)
