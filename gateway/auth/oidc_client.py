"""The gateway as an OpenID Connect relying party: what it asks of the provider over the
back channel, each call bounded.

* **Discovery** (OpenID Connect Discovery 1.0 §4): ``GET {issuer}/.well-known/openid-
  configuration``; its ``issuer`` must equal the configured one exactly (§4.3), and it must
  name ``authorization_endpoint``, ``token_endpoint`` and ``jwks_uri``. Kept for
  ``CACHE_SECONDS``; a failed fetch is retried at the next sign-in.
* **Keys**: ``GET jwks_uri`` (RFC 7517 §5), kept likewise; an ID token naming a ``kid`` the
  set lacks fetches the set again (the provider rotated), at most once a ``REFETCH_SECONDS``.
* **Token** (OpenID Connect Core §3.1.3.1): ``POST token_endpoint`` with
  ``grant_type=authorization_code``, ``code``, ``redirect_uri``, ``code_verifier`` and the
  client's credentials: ``client_secret_basic`` (RFC 6749 §2.3.1: id and secret form-encoded,
  then Basic) unless the provider lists only ``client_secret_post``; a public client sends
  ``client_id`` alone. The answer's ``id_token`` is verified (gateway/auth/id_token.py).

Every call has ``auth.oidc_timeout`` seconds in all and reads at most ``MAX_BODY_BYTES``;
each failure is an :class:`OidcFailed` whose text is safe to show the developer (it never
holds the provider's answer, a URL or a secret), its cause logged.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import aiohttp
import structlog

from gateway.auth.id_token import IdTokenError, check_id_token, verify_jws
from gateway.ops.config_schema import AuthConfig

__all__ = ["OidcClient", "OidcFailed"]

CACHE_SECONDS = 3600.0
REFETCH_SECONDS = 60.0
MAX_BODY_BYTES = 1024 * 1024
_log = structlog.get_logger("gateway.signin")


class OidcFailed(Exception):
    """The sign-in with the provider did not work; ``str()`` is what the page says."""


def _http_url(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


class OidcClient:
    """One provider (``auth.oidc_issuer``): its discovery document and keys, cached."""

    __slots__ = ("_cfg", "_discovery", "_jwks", "_lock", "_session")

    def __init__(self, cfg: AuthConfig) -> None:
        self._cfg = cfg
        self._session: aiohttp.ClientSession | None = None
        self._discovery: tuple[float, dict[str, Any]] | None = None
        self._jwks: tuple[float, list[dict[str, Any]]] | None = None
        self._lock = asyncio.Lock()

    @property
    def name(self) -> str:
        return self._cfg.oidc_name or urlsplit(self._cfg.oidc_issuer).netloc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(self, what: str, method: str, url: str, **kw: Any) -> tuple[int, Any]:
        """(status, JSON body) of one bounded call; OidcFailed when it cannot be had."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._cfg.oidc_timeout)
            )
        try:
            async with self._session.request(method, url, allow_redirects=False, **kw) as resp:
                status = resp.status
                raw = bytearray()
                while len(raw) <= MAX_BODY_BYTES:  # read() returns what has arrived
                    chunk = await resp.content.read(MAX_BODY_BYTES + 1 - len(raw))
                    if not chunk:
                        break
                    raw += chunk
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            _log.warning("oidc_call_failed", call=what, error=type(e).__name__)
            raise OidcFailed(f"The identity provider could not be reached ({what}).") from None
        if len(raw) > MAX_BODY_BYTES:
            _log.warning("oidc_call_failed", call=what, error="answer too large")
            raise OidcFailed(f"The identity provider's answer was too large ({what}).")
        try:
            return status, json.loads(raw)
        except ValueError:
            _log.warning("oidc_call_failed", call=what, status=status, error="not JSON")
            raise OidcFailed(
                f"The identity provider's answer was not understood ({what})."
            ) from None

    async def discovery(self) -> dict[str, Any]:
        now = time.monotonic()
        if self._discovery is not None and now - self._discovery[0] < CACHE_SECONDS:
            return self._discovery[1]
        issuer = self._cfg.oidc_issuer
        url = issuer.rstrip("/") + "/.well-known/openid-configuration"
        status, doc = await self._call("discovery", "GET", url)
        ok = (
            status == 200
            and isinstance(doc, dict)
            and doc.get("issuer") == issuer
            and all(
                _http_url(doc.get(k))
                for k in ("authorization_endpoint", "token_endpoint", "jwks_uri")
            )
        )
        if not ok:
            _log.warning("oidc_call_failed", call="discovery", status=status, error="unusable")
            raise OidcFailed("The identity provider's configuration is not usable (discovery).")
        self._discovery = (now, doc)
        return doc  # type: ignore[no-any-return]

    async def keys(self, refetch: bool) -> list[dict[str, Any]]:
        now = time.monotonic()
        cached = self._jwks
        if cached is not None:
            age = now - cached[0]
            if age < (REFETCH_SECONDS if refetch else CACHE_SECONDS):
                return cached[1]
        async with self._lock:  # one fetch for the sign-ins arriving together
            if self._jwks is not cached and self._jwks is not None:
                return self._jwks[1]
            doc = await self.discovery()
            status, body = await self._call("keys", "GET", doc["jwks_uri"])
            keys = body.get("keys") if isinstance(body, dict) else None
            if status != 200 or not isinstance(keys, list):
                _log.warning("oidc_call_failed", call="keys", status=status, error="unusable")
                raise OidcFailed("The identity provider's keys could not be read.")
            self._jwks = (now, [k for k in keys if isinstance(k, dict)])
            return self._jwks[1]

    async def authorization_url(
        self, state: str, nonce: str, code_challenge: str, redirect: str
    ) -> str:
        doc = await self.discovery()
        query = urlencode(
            {
                "response_type": "code",
                "client_id": self._cfg.oidc_client_id,
                "redirect_uri": redirect,
                "scope": " ".join(self._cfg.oidc_scopes),
                "state": state,
                "nonce": nonce,
                "code_challenge": code_challenge,
                "code_challenge_method": "S256",
            }
        )
        endpoint: str = doc["authorization_endpoint"]
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"

    async def redeem(self, code: str, verifier: str, redirect: str, nonce: str) -> dict[str, Any]:
        """The verified claims of the ID token the code is exchanged for."""
        cfg = self._cfg
        doc = await self.discovery()
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect,
            "code_verifier": verifier,
        }
        headers = {"Accept": "application/json"}
        methods = doc.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
        if not cfg.oidc_client_secret:
            form["client_id"] = cfg.oidc_client_id
        elif "client_secret_basic" not in methods and "client_secret_post" in methods:
            form["client_id"] = cfg.oidc_client_id
            form["client_secret"] = cfg.oidc_client_secret
        else:
            pair = f"{quote(cfg.oidc_client_id, safe='')}:{quote(cfg.oidc_client_secret, safe='')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        status, body = await self._call(
            "token", "POST", doc["token_endpoint"], data=form, headers=headers
        )
        token = body.get("id_token") if isinstance(body, dict) else None
        if status != 200 or not isinstance(token, str):
            error = body.get("error") if isinstance(body, dict) else None
            _log.warning("oidc_call_failed", call="token", status=status, error=str(error)[:64])
            raise OidcFailed("The identity provider did not accept the sign-in (token).")
        try:
            claims, known = verify_jws(token, await self.keys(refetch=False))
            if not known:  # a key the cached set lacks: the provider may have rotated
                claims, known = verify_jws(token, await self.keys(refetch=True))
            if not known:
                raise IdTokenError("the ID token is signed with a key the provider does not list")
            check_id_token(
                claims,
                issuer=cfg.oidc_issuer,
                client_id=cfg.oidc_client_id,
                nonce=nonce,
                now=time.time(),
            )
        except IdTokenError as e:
            _log.warning("oidc_id_token_refused", reason=str(e))
            raise OidcFailed(f"The sign-in was refused: {e}.") from None
        return claims
