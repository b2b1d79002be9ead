"""What an OpenID Connect login carries from the gateway to the provider and back (pure).

The login keeps no state in the gateway: ``state`` is sealed (HMAC-SHA256 under a key
derived from ``server.signing_key``, the one every worker and replica shares), so the
callback may land on any process. It holds the user code being approved, when the login
expires, and the SHA-256 of a random value kept in the browser as a cookie
(``SameSite=Lax``: it comes back on the provider's redirect): a callback whose browser does
not hold it is refused, so a login started in one browser cannot be finished in another
(someone mailing their own provider link to a victim gains nothing).

From ``state`` the gateway derives, with the same key, the PKCE ``code_verifier`` (RFC
7636: 43 characters, the challenge its SHA-256, ``S256``) and the ``nonce`` the ID token
must carry back: both known only to the gateway, neither stored.

:func:`client_for_claims` maps the ID token's claims to a configured client: the claim named
by ``auth.oidc_claim`` (a string, or a list such as ``groups``, any of whose values may
match), looked up in the clients' ``oidc_values``, the first client in config order wins.
An ``email`` counts only with ``email_verified`` true (an address the provider has not
checked names nobody).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["LoginState", "StateKey", "browser_matches", "challenge", "client_for_claims"]

_LABEL = b"llm-gateway oidc login v1"
MAX_STATE_CHARS = 512


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class LoginState:
    user_code: str  # the normalised code being approved
    expires: float  # unix time
    browser: str  # hex SHA-256 of the browser's cookie value


class StateKey:
    """Seals and opens ``state``; derives the verifier and nonce of each."""

    __slots__ = ("_key",)

    def __init__(self, signing_key: bytes) -> None:
        self._key = hmac.new(signing_key, _LABEL, hashlib.sha256).digest()

    def _mac(self, what: bytes, data: bytes) -> bytes:
        return hmac.new(self._key, what + b"\0" + data, hashlib.sha256).digest()

    def seal(self, user_code: str, expires: float, browser_secret: str) -> str:
        body = {
            "c": user_code,
            "e": int(expires),
            "b": hashlib.sha256(browser_secret.encode()).hexdigest(),
            "r": secrets.token_urlsafe(12),  # each login its own verifier and nonce
        }
        raw = json.dumps(body, separators=(",", ":")).encode()
        return f"{_b64(raw)}.{_b64(self._mac(b'state', raw))}"

    def open(self, state: str, now: float) -> LoginState | None:
        """The login ``state`` belongs to, or None: forged, malformed or expired."""
        if len(state) > MAX_STATE_CHARS or state.count(".") != 1:
            return None
        body, mac = state.split(".")
        try:
            raw, sent = _unb64(body), _unb64(mac)
            if not hmac.compare_digest(sent, self._mac(b"state", raw)):
                return None
            fields = json.loads(raw)
            login = LoginState(str(fields["c"]), float(fields["e"]), str(fields["b"]))
        except (ValueError, KeyError, TypeError):
            return None
        return login if login.expires > now else None

    def verifier(self, state: str) -> str:
        """The PKCE code verifier of this login (43 characters of base64url)."""
        return _b64(self._mac(b"pkce", state.encode()))

    def nonce(self, state: str) -> str:
        return _b64(self._mac(b"nonce", state.encode()))


def browser_matches(login: LoginState, cookie: str) -> bool:
    seen = hashlib.sha256(cookie.encode()).hexdigest()
    return hmac.compare_digest(seen, login.browser)


def challenge(verifier: str) -> str:
    """PKCE ``S256``: BASE64URL(SHA256(verifier))."""
    return _b64(hashlib.sha256(verifier.encode("ascii")).digest())


def _values(claims: Mapping[str, Any], claim: str) -> list[str]:
    value = claims.get(claim)
    if claim == "email" and claims.get("email_verified") is not True:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def client_for_claims(
    claims: Mapping[str, Any], claim: str, clients: Iterable[tuple[str, tuple[str, ...]]]
) -> str | None:
    """The name of the first client (``(name, oidc_values)`` in config order) that one of
    the claim's values names; None: nobody."""
    have = set(_values(claims, claim))
    if not have:
        return None
    for name, values in clients:
        if have.intersection(values):
            return name
    return None
