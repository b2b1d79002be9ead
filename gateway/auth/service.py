"""The sign-in as the application holds it (:class:`SignIn`): its config, store, token cache
and page throttle, and the bearer check the middleware calls for a credential that is not a
configured key (:meth:`SignIn.identify`).

A token maps to a client by name: a client removed from the config (SIGHUP) takes its
tokens' access with it at once, a client whose key is rotated keeps its signed-in
developers. Access tokens live ``auth.access_token_seconds``; refresh tokens
``auth.refresh_token_seconds`` and are rotated on each use.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from gateway import errors
from gateway.auth.cache import TokenCache, TokenEntry
from gateway.auth.codes import digest, is_access_token
from gateway.auth.oidc_client import OidcClient
from gateway.auth.oidc_state import StateKey
from gateway.auth.throttle import Throttle
from gateway.ops.config_schema import AuthConfig
from gateway.ops.metrics import Metrics
from gateway.tenancy.clients import Client, Tenants

if TYPE_CHECKING:  # the SQL layer is imported only when sign-in is on
    from gateway.auth.signin_store import AuthStore

__all__ = ["SIGNIN", "SignIn", "TokenRefused", "signin_ctx"]

# Claude Code asks the developer to sign in again at once on a 401 saying so; without
# ``x-should-retry: false`` it retries with backoff for about three minutes first
_REFUSED = "The gateway sign-in has expired or was revoked; sign in again (/login)"


class TokenRefused(errors.AuthenticationFailed):
    """A gateway token the gateway no longer honours: expired, revoked, unknown, or its
    client is no longer configured."""

    should_retry = False
    default_message = _REFUSED

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason  # llm_gateway_signin_bearer_refused_total's (metrics.py)


class SignIn:
    __slots__ = (
        "base_url",
        "cache",
        "cfg",
        "device_throttle",
        "metrics",
        "oidc",
        "oidc_key",
        "prefix",
        "store",
        "tenants",
        "throttle",
    )

    def __init__(
        self,
        cfg: AuthConfig,
        store: AuthStore,
        tenants: Callable[[], Tenants],
        prefix: str = "",
        base_url: str = "",
        signing_key: bytes = b"",
        metrics: Metrics | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.tenants = tenants  # the current ones (a reload swaps them)
        self.prefix = prefix  # server.prefix: where the routes are
        self.base_url = base_url  # the public origin, or "": the request's own
        self.metrics = metrics  # the sign-in's counters (None: not counted, in unit tests)
        self.cache = TokenCache(cfg.cache_seconds)
        self.throttle = Throttle(cfg.page_tries_per_minute)  # the verification page's tries
        # new device codes, counted apart: one address cannot fill max_pending_codes alone
        self.device_throttle = Throttle(cfg.page_tries_per_minute)
        # the verification page's "Sign in with <provider>" (auth.oidc_issuer), or None
        self.oidc = OidcClient(cfg) if cfg.oidc else None
        self.oidc_key = StateKey(signing_key or secrets.token_bytes(32))

    async def identify(self, presented: bytes, tenants: Tenants) -> Client | None:
        """The client of a gateway access token; None: not a gateway token (the caller's
        ordinary 401); :class:`TokenRefused` for one not honoured."""
        if not is_access_token(presented):
            return None
        key = digest(presented)
        now = time.monotonic()
        entry = self.cache.get(key, now)
        if entry is None:
            from gateway.batches.schema import StoreError  # loaded with the store already

            try:
                row = await self.store.lookup(key)
            except StoreError:
                raise errors.GatewayError(
                    "The gateway could not check the sign-in token; try again", status=503
                ) from None
            if row is None or row.kind != "access":
                raise self.refused("unknown")
            if row.revoked:
                raise self.refused("revoked")
            entry = TokenEntry(row.client, row.session, row.expires_at, now)
            self.cache.put(key, entry)
        if entry.expires_at <= time.time():
            raise self.refused("expired")
        client = tenants.clients.get(entry.client)
        if client is None:
            raise self.refused("client_removed")
        return client

    def refused(self, reason: str) -> TokenRefused:
        """The 401 of a bearer token not honoured, counted by ``reason``."""
        if self.metrics is not None:
            self.metrics.signin_refused.labels(reason).inc()
        return TokenRefused(reason)

    def count(self, codes: str | None = None, tokens: str | None = None) -> None:
        """A device code's outcome and/or a token event (metrics.py SIGNIN_CODES,
        SIGNIN_TOKENS)."""
        if self.metrics is None:
            return
        if codes is not None:
            self.metrics.signin_codes.labels(codes).inc()
        if tokens is not None:
            self.metrics.signin_tokens.labels(tokens).inc()


SIGNIN = web.AppKey("signin", SignIn)


async def signin_ctx(app: web.Application) -> AsyncIterator[None]:
    """The store and the provider's client are closed with the application."""
    yield
    signin = app[SIGNIN]
    if signin.oidc is not None:
        await signin.oidc.close()
    await signin.store.close()
