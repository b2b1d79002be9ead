"""SIGHUP: re-read the config file and replace the clients and keys of a running gateway.

The file the process started with (the same path) is read again, with the environment, in a
thread off the event loop. A good file replaces ``app[STATE].tenants`` whole: a request
identifies its client once, in the middleware, and keeps that :class:`Client` to its end, so
no request in flight and no connection sees the swap; the next request is identified by the
new table. A bad file (unreadable, not TOML, a :class:`ConfigError`, a variable it names
unset) keeps the previous table and logs ``config_reload_failed`` with the refusal's one
line (it names the file and the key, never a key's value). What a reload may change, and
what waits for a restart: gateway/ops/config_reload.py.

Signals arriving while a reload runs are coalesced into one more reload after it, so the file
read last is the one applied.

With TLS (``server.tls_cert_file``), a good file's certificate and key are read again (the
loader has checked the pair) into a new context that the API listener's next handshakes use:
a renewed certificate is served without a restart, and open connections keep theirs. A pair
that cannot be read keeps the previous one (``tls_reload_failed``). Turning TLS on or off
needs a restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog
from aiohttp import web

from gateway.http.keys import METRICS, SECRETS, STATE
from gateway.http.listener import Listener
from gateway.ops import tls
from gateway.ops.config import Config, ConfigError
from gateway.ops.config_reload import changes, tenancy_of
from gateway.tenancy.clients import Tenants
from gateway.upstream.known import known_secrets

_log = structlog.get_logger("gateway.reload")


class Reloader:
    """Re-reads the config with ``reread`` and applies its tenancy part to ``app``.

    ``started``: the config as loaded at start (before anything the process derived from it,
    such as ``--demo``'s routes): what a new file is compared with for changes that need a
    restart."""

    def __init__(
        self,
        app: web.Application,
        started: Config,
        reread: Callable[[], Config],
        *,
        listener: Listener | None = None,
    ):
        self._app = app
        self._listener = listener  # the API listener when it serves TLS
        self._fingerprint = started.server.tls_fingerprint
        self._started = started
        self._applied = started
        self._reread = reread
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def request(self) -> None:
        """The signal handler: start a reload, or ask for one more after the running one."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            self._again = False
            await self.reload()
            if not self._again:
                return

    async def reload(self) -> bool:
        """One re-read; True when it was applied."""
        metrics = self._app[METRICS]
        try:
            new = await asyncio.to_thread(self._reread)
        except ConfigError as exc:
            metrics.config_reloads.labels("failed").inc()
            _log.error("config_reload_failed", detail=str(exc), kept="the previous clients")
            return False
        except Exception as exc:  # a bug must not take down a serving gateway
            metrics.config_reloads.labels("failed").inc()
            _log.error(
                "config_reload_failed",
                detail=f"unexpected {type(exc).__name__}",
                kept="the previous clients",
            )
            return False
        if self._listener is not None and new.server.tls:
            await self._reload_certificate(new)
        applied = tenancy_of(self._applied, new)
        tenants = Tenants(applied)
        diff = changes(self._started, self._applied, new)
        self._app[STATE].tenants = tenants
        # the new keys are scrubbed from upstream error text as the old ones were
        self._app[SECRETS].adopt(known_secrets(applied))
        self._applied = applied
        metrics.config_reloads.labels("ok").inc()
        _log.info(
            "config_reloaded",
            clients=len(new.clients),
            added=list(diff.added),
            removed=list(diff.removed),
            changed=list(diff.changed),
            server_keys_changed=diff.server_keys,
            needs_restart=list(diff.needs_restart),
        )
        if diff.needs_restart:
            _log.warning(
                "config_needs_restart",
                tables=list(diff.needs_restart),
                detail="changed in the file but not applied: only [[clients]], "
                "server.api_keys_env and server.admin_keys_env are re-read on SIGHUP",
            )
        return True

    async def _reload_certificate(self, new: Config) -> None:
        assert self._listener is not None
        server = new.server
        try:
            served = await asyncio.to_thread(tls.load, *server.tls_files)
        except tls.TLSError as exc:  # the files changed again since the loader read them
            _log.error(
                "tls_reload_failed", detail=f"server.{exc.key}: {exc}", kept="the previous pair"
            )
            return
        self._listener.tls = served.context
        _log.info(
            "tls_certificate_reloaded",
            cert_file=server.tls_cert_file,
            fingerprint_sha256=served.fingerprint,
            fingerprint_sha256_colons=served.fingerprint_colons,
            changed=served.fingerprint != self._fingerprint,
        )
        self._fingerprint = served.fingerprint
