"""The gateway's OpenID Connect client (gateway/auth/oidc_client.py) against a provider
stand-in served on 127.0.0.1 by aiohttp: answers read whole however they are cut, bounded in
size, cached, and the keys fetched again when an ID token names one the set lacks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.auth.oidc_client import MAX_BODY_BYTES, OidcClient, OidcFailed
from gateway.ops.config_schema import AuthConfig


class Stand:
    """What the stand-in serves; each route counts its calls."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.jwks: bytes = b'{"keys": []}'
        self.issuer = ""


async def _chunked(request: web.Request, body: bytes) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    for i in range(0, len(body), 4096):  # many small writes: many reads on the other side
        await resp.write(body[i : i + 4096])
    await resp.write_eof()
    return resp


@pytest.fixture
async def stand() -> AsyncIterator[tuple[Stand, str]]:
    s = Stand()

    async def discovery(request: web.Request) -> web.Response:
        s.calls["discovery"] = s.calls.get("discovery", 0) + 1
        base = s.issuer
        return web.json_response(
            {
                "issuer": base,
                "authorization_endpoint": f"{base}/auth",
                "token_endpoint": f"{base}/token",
                "jwks_uri": f"{base}/jwks",
            }
        )

    async def jwks(request: web.Request) -> web.StreamResponse:
        s.calls["jwks"] = s.calls.get("jwks", 0) + 1
        return await _chunked(request, s.jwks)

    app = web.Application()
    app.router.add_get("/.well-known/openid-configuration", discovery)
    app.router.add_get("/jwks", jwks)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    s.issuer = str(server.make_url("")).rstrip("/")
    try:
        yield s, s.issuer
    finally:
        await server.close()


def _client(issuer: str) -> OidcClient:
    return OidcClient(AuthConfig(oidc_issuer=issuer, oidc_client_id="gw", oidc_timeout=5))


def _keys(n: int) -> bytes:
    keys: list[dict[str, Any]] = [
        {"kty": "RSA", "kid": f"k{i}", "n": "A" * 342, "e": "AQAB"} for i in range(n)
    ]
    return json.dumps({"keys": keys}).encode()


async def test_a_key_set_cut_in_many_pieces_is_read_whole_and_cached(
    stand: tuple[Stand, str],
) -> None:
    s, issuer = stand
    s.jwks = _keys(400)  # about 150 KB, in 4 KB writes
    client = _client(issuer)
    try:
        assert len(await client.keys(refetch=False)) == 400
        assert len(await client.keys(refetch=False)) == 400
        # a kid the set lacks asks again, but not sooner than a minute after the last fetch
        await client.keys(refetch=True)
        assert s.calls == {"discovery": 1, "jwks": 1}
    finally:
        await client.close()


async def test_an_answer_past_the_bound_is_refused(stand: tuple[Stand, str]) -> None:
    s, issuer = stand
    s.jwks = b'{"keys": [' + b" " * MAX_BODY_BYTES + b"]}"
    client = _client(issuer)
    try:
        with pytest.raises(OidcFailed, match="too large"):
            await client.keys(refetch=False)
    finally:
        await client.close()


async def test_discovery_for_another_issuer_is_not_used(stand: tuple[Stand, str]) -> None:
    s, issuer = stand
    s.issuer = "https://idp.elsewhere"  # what the document says its issuer is
    client = _client(issuer)
    try:
        with pytest.raises(OidcFailed, match="not usable"):
            await client.discovery()
    finally:
        await client.close()
