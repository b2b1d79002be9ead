"""A minimal OpenID Connect issuer for tests: one user, approved without a login form.

    python tests/oidc_issuer.py PORT SUB EMAIL

What an OIDC relying party (``claude gateway``'s ``oidc:``) needs of an issuer, and nothing
else: discovery (``/.well-known/openid-configuration``), the authorization endpoint (which
redirects straight back with a code, as if the user had signed in), the token endpoint (the
code for an RS256 ID token holding ``sub``, ``email`` and the request's ``nonce``; PKCE
checked when a challenge was sent) and the JWKS. Any client id and secret are taken. The key
is made at start; ``/health`` answers 200 once serving. Not a real provider: it exists so a
test can run a relying party's whole sign-in offline.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import sys
import time
from typing import Any

from aiohttp import web
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

KID = "test-key-1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _int(n: int) -> str:
    return _b64(n.to_bytes((n.bit_length() + 7) // 8, "big"))


class Issuer:
    def __init__(self, base: str, sub: str, email: str) -> None:
        self.base, self.sub, self.email = base, sub, email
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.codes: dict[str, dict[str, str]] = {}  # code -> the authorization request
        self.log: list[dict[str, Any]] = []  # what was asked, for the test to read

    def jwt(self, claims: dict[str, Any]) -> str:
        head = _b64(json.dumps({"alg": "RS256", "typ": "JWT", "kid": KID}).encode())
        body = _b64(json.dumps(claims).encode())
        signed = f"{head}.{body}".encode()
        sig = self.key.sign(signed, padding.PKCS1v15(), hashes.SHA256())
        return f"{head}.{body}.{_b64(sig)}"

    async def discovery(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "issuer": self.base,
                "authorization_endpoint": self.base + "/authorize",
                "token_endpoint": self.base + "/token",
                "jwks_uri": self.base + "/jwks",
                "userinfo_endpoint": self.base + "/userinfo",
                "response_types_supported": ["code"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "scopes_supported": ["openid", "email", "profile"],
                "token_endpoint_auth_methods_supported": [
                    "client_secret_basic",
                    "client_secret_post",
                ],
                "code_challenge_methods_supported": ["S256"],
                "grant_types_supported": ["authorization_code"],
                "claims_supported": ["sub", "email", "email_verified", "name"],
            }
        )

    async def jwks(self, _: web.Request) -> web.Response:
        pub = self.key.public_key().public_numbers()
        jwk = {
            "kty": "RSA",
            "use": "sig",
            "alg": "RS256",
            "kid": KID,
            "n": _int(pub.n),
            "e": _int(pub.e),
        }
        return web.json_response({"keys": [jwk]})

    async def authorize(self, request: web.Request) -> web.Response:
        query = dict(request.query)
        self.log.append({"endpoint": "authorize", "query": sorted(query)})
        code = secrets.token_urlsafe(16)
        self.codes[code] = query
        back = f"{query['redirect_uri']}?code={code}&state={query.get('state', '')}"
        if "iss" in query.get("response_mode", ""):  # never asked: kept simple
            back += f"&iss={self.base}"
        raise web.HTTPFound(back)

    async def token(self, request: web.Request) -> web.Response:
        form = dict(await request.post())
        asked = self.codes.pop(str(form.get("code", "")), None)
        self.log.append({"endpoint": "token", "form": sorted(form), "known": asked is not None})
        if asked is None:
            return web.json_response({"error": "invalid_grant"}, status=400)
        challenge = asked.get("code_challenge")
        if challenge:
            verifier = str(form.get("code_verifier", ""))
            if _b64(hashlib.sha256(verifier.encode()).digest()) != challenge:
                return web.json_response({"error": "invalid_grant"}, status=400)
        client_id = asked.get("client_id", "")
        now = int(time.time())
        claims = {
            "iss": self.base,
            "sub": self.sub,
            "aud": client_id,
            "iat": now,
            "exp": now + 600,
            "email": self.email,
            "email_verified": True,
            "name": self.email.split("@")[0],
        }
        if "nonce" in asked:
            claims["nonce"] = asked["nonce"]
        return web.json_response(
            {
                "access_token": secrets.token_urlsafe(24),
                "token_type": "Bearer",
                "expires_in": 600,
                "id_token": self.jwt(claims),
                "scope": asked.get("scope", "openid"),
            },
            headers={"Cache-Control": "no-store"},
        )

    async def userinfo(self, _: web.Request) -> web.Response:
        return web.json_response({"sub": self.sub, "email": self.email, "email_verified": True})

    async def requests(self, _: web.Request) -> web.Response:
        return web.json_response(self.log)


def app(base: str, sub: str, email: str) -> web.Application:
    issuer = Issuer(base, sub, email)
    application = web.Application()
    application.router.add_get("/.well-known/openid-configuration", issuer.discovery)
    application.router.add_get("/jwks", issuer.jwks)
    application.router.add_get("/authorize", issuer.authorize)
    application.router.add_post("/token", issuer.token)
    application.router.add_get("/userinfo", issuer.userinfo)
    application.router.add_get("/_requests", issuer.requests)
    application.router.add_get("/health", lambda _: web.Response(text="ok"))
    return application


if __name__ == "__main__":
    port, sub, email = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    host = sys.argv[4] if len(sys.argv) > 4 else "localhost"
    web.run_app(app(f"http://{host}:{port}", sub, email), host="127.0.0.1", port=port, print=None)
