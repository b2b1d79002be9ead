"""The verification page's "Sign in with <provider>", end to end against a real OpenID Connect
provider (tests/clients/oidc_provider.mjs: panva's oidc-provider on 127.0.0.1).

A real gateway process with ``[auth] oidc_issuer`` and two clients mapped by email; the
"browser" here is an aiohttp session with a cookie jar that follows redirects as a browser
does (the headless-browser test, tests/e2e/test_signin_browser.py, drives the same path in
Chromium): device authorization -> the page -> the provider button -> the provider's login
-> the gateway's callback -> the code approved for the mapped client -> the token works on
``/v1/messages`` as that client. Then the refusals, each a page that says why.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import aiohttp
import pytest

from tests.conftest import stub_config
from tests.oidc_provider import CLIENT_ID, SECRET, Provider, oidc_provider
from tests.procs import form_post, free_port, get, post, start_gateway
from tests.signin_client import device, poll

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

KEYS = {"alice": "alice-key-1", "bob": "bob-key-2", "ops": "ops-key-3"}
ENV = {**{f"{k.upper()}_KEY": v for k, v in KEYS.items()}, "OIDC_SECRET": SECRET}


def _config(stub_url: str, issuer: str, claim: str) -> str:
    return (
        stub_config(stub_url, models=("ok",))
        + f"""
[[clients]]
name = "alice"
key_env = "ALICE_KEY"
models = ["m-ok"]
oidc_values = ["alice@example.com"]

[[clients]]
name = "bob"
key_env = "BOB_KEY"
models = ["m-none"]
oidc_values = ["bob@example.com"]

[[clients]]
name = "ops"
key_env = "OPS_KEY"
models = ["m-ok"]
oidc_values = ["ops-team"]

[auth]
enabled = true
poll_seconds = 1
page_tries_per_minute = 100
oidc_issuer = "{issuer}"
oidc_client_id = "{CLIENT_ID}"
oidc_client_secret_env = "OIDC_SECRET"
oidc_scopes = ["openid", "email", "groups"]
oidc_claim = "{claim}"
oidc_name = "Test IdP"
"""
    )


@pytest.fixture(scope="module", params=["RS256", "ES256"])
def setup(
    request: pytest.FixtureRequest, stub_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Provider]]:
    tmp = tmp_path_factory.mktemp("oidc")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with oidc_provider(f"{base}/llm/oauth/device/oidc/callback", request.param) as provider:
        proc, url = start_gateway(
            _config(stub_url, provider.issuer, "email"), tmp, env=ENV, port=port
        )
        try:
            yield url, provider
        finally:
            proc.stop()


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]*)"', page)
    assert found, page
    return found.group(1)


def _refresh_target(page: str) -> str:
    found = re.search(r'http-equiv="refresh" content="0;url=([^"]+)"', page)
    assert found, page
    return html.unescape(found.group(1))


def _message(page: str) -> str:
    found = re.search(r'<p class="(?:err|ok)">(.*?)</p>', page, re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", found.group(1))) if found else ""


async def _browse(
    base: str, user_code: str, jar: aiohttp.CookieJar | None = None
) -> tuple[int, str, str]:
    """The developer's browser: the page, the provider button, the provider's login and the
    way back. -> (status, page text, the provider's authorization URL)."""
    async with aiohttp.ClientSession(cookie_jar=jar or aiohttp.CookieJar(unsafe=True)) as s:
        async with s.get(f"{base}/llm/oauth/device", params={"user_code": user_code}) as r:
            page = await r.text()
        start = {"user_code": user_code, "csrf": _csrf(page), "via": "oidc"}
        async with s.post(f"{base}/llm/oauth/device/oidc", data=start) as r:
            assert r.status == 200, await r.text()
            target = _refresh_target(await r.text())
        async with s.get(target) as r:  # the provider, then back to the gateway's callback
            return r.status, await r.text(), target


async def test_the_provider_signs_the_developer_in_as_the_mapped_client(
    setup: tuple[str, Provider],
) -> None:
    base, provider = setup
    approved = _approved_codes(base)
    provider.set_user("alice-sub", "alice@example.com")
    grant = device(base)
    status, page, target = await _browse(base, grant["user_code"])
    assert status == 200, page
    said = f"The code {grant['user_code']} is approved for the client alice"
    assert _message(page).startswith(said)
    # what the gateway asked of the provider: the code flow with PKCE (S256), state, nonce
    asked = {k: v[0] for k, v in parse_qs(urlsplit(target).query).items()}
    assert asked["response_type"] == "code" and asked["client_id"] == CLIENT_ID
    assert asked["code_challenge_method"] == "S256" and len(asked["code_challenge"]) == 43
    assert asked["state"] and asked["nonce"] and asked["scope"] == "openid email groups"
    assert asked["redirect_uri"] == f"{base}/llm/oauth/device/oidc/callback"

    status, tokens = poll(base, grant["device_code"])
    assert status == 200, tokens
    bearer = {"authorization": f"Bearer {tokens['access_token']}"}
    ask = {"model": "m-ok", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    status, _, body = post(f"{base}/llm/v1/messages", ask, bearer)
    assert status == 200, body  # alice may use m-ok
    # the same login, as bob (whose list lacks m-ok): his token is refused the model
    provider.set_user("bob-sub", "bob@example.com")
    grant = device(base)
    status, page, _ = await _browse(base, grant["user_code"])
    assert "approved for the client bob" in _message(page), page
    tokens = poll(base, grant["device_code"])[1]
    status, _, _ = post(
        f"{base}/llm/v1/messages", ask, {"authorization": f"Bearer {tokens['access_token']}"}
    )
    assert status == 403
    # both approvals counted as the key form's are
    assert _approved_codes(base) == approved + 2


def _approved_codes(base: str) -> float:
    _, _, raw = get(f"{base}/metrics", headers={"x-api-key": KEYS["alice"]})
    line = 'llm_gateway_signin_device_codes_total{outcome="approved"} '
    return next(float(x[len(line) :]) for x in raw.decode().splitlines() if x.startswith(line))


@pytest.mark.parametrize(
    ("sub", "email", "verified", "said"),
    [
        # an address no client lists: the page names it and says whom to ask
        ("carol-sub", "carol@example.com", True, "You signed in as carol@example.com, but"),
        # alice's address, unverified at the provider: it names nobody
        ("mallory-sub", "alice@example.com", False, "You signed in as alice@example.com, but"),
        # the developer declined at the provider
        ("deny", "", True, "Test IdP did not sign you in (access_denied)."),
    ],
)
async def test_a_login_that_names_no_client_is_refused_with_a_page_saying_why(
    setup: tuple[str, Provider], sub: str, email: str, verified: bool, said: str
) -> None:
    base, provider = setup
    provider.set_user(sub, email, verified)
    grant = device(base)
    status, page, _ = await _browse(base, grant["user_code"])
    assert status == 403, page
    assert _message(page).startswith(said), page
    assert "Traceback" not in page
    assert poll(base, grant["device_code"])[1]["error"] == "authorization_pending"


async def test_the_login_must_finish_in_the_browser_that_started_it(
    setup: tuple[str, Provider],
) -> None:
    """A provider link started by one browser (an attacker's, with their own code) and
    opened in another (the victim's, signed in at the provider) approves nothing."""
    base, provider = setup
    provider.set_user("alice-sub", "alice@example.com")
    grant = device(base)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as attacker:
        async with attacker.get(f"{base}/llm/oauth/device") as r:
            csrf = _csrf(await r.text())
        start = {"user_code": grant["user_code"], "csrf": csrf}
        async with attacker.post(f"{base}/llm/oauth/device/oidc", data=start) as r:
            target = _refresh_target(await r.text())
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as victim:
        async with victim.get(target) as r:
            page = await r.text()
            assert r.status == 403
    assert "started in another browser" in _message(page)
    assert poll(base, grant["device_code"])[1]["error"] == "authorization_pending"


@pytest.mark.parametrize(
    ("cookie", "sent"),
    [("", "x" * 32), ("a" * 32, "b" * 32), ("a" * 32, "")],
    ids=["no-cookie", "other-value", "no-field"],
)
async def test_starting_a_login_needs_the_pages_own_cookie(
    setup: tuple[str, Provider], cookie: str, sent: str
) -> None:
    """A post from another site (no SameSite=Strict cookie, or not its value) starts nothing."""
    base, _ = setup
    grant = device(base)
    headers = {"Cookie": f"gw_signin_csrf={cookie}"} if cookie else {}
    status, _, body = form_post(
        f"{base}/llm/oauth/device/oidc",
        {"user_code": grant["user_code"], "csrf": sent},
        headers,
    )
    assert status == 403
    assert "not started from the gateway's own page" in _message(body.decode())


async def test_a_forged_or_missing_state_is_refused(setup: tuple[str, Provider]) -> None:
    base, _ = setup
    for query in ({"code": "x", "state": "forged.state"}, {"code": "x"}):
        async with aiohttp.ClientSession() as s:
            url = f"{base}/llm/oauth/device/oidc/callback?{urlencode(query)}"
            async with s.get(url) as r:
                assert r.status == 400
                assert "not valid or has expired" in _message(await r.text())


class _Silent:
    """A provider that takes connections and never answers (its listen backlog accepts)."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"


async def test_a_provider_that_does_not_answer_gets_a_page_not_a_hang(
    stub_url: str, gateway_factory: Any
) -> None:
    """``auth.oidc_timeout`` bounds each call to the provider; the developer reads why."""
    silent = _Silent()
    try:
        cfg = _config(stub_url, silent.url, "email").replace(
            'oidc_name = "Test IdP"', 'oidc_name = "Test IdP"\noidc_timeout = 1'
        )
        _, base = gateway_factory(
            cfg, env={**{f"{k.upper()}_KEY": v for k, v in KEYS.items()}, "OIDC_SECRET": SECRET}
        )
        grant = device(base)
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as s:
            async with s.get(f"{base}/llm/oauth/device") as r:
                csrf = _csrf(await r.text())
            start = {"user_code": grant["user_code"], "csrf": csrf}
            async with s.post(f"{base}/llm/oauth/device/oidc", data=start) as r:
                page = await r.text()
                assert r.status == 502
        assert _message(page) == "The identity provider could not be reached (discovery)."
        assert silent.url not in page and "Traceback" not in page
    finally:
        silent.sock.close()


async def test_a_discovery_document_naming_another_issuer_is_not_used(
    stub_url: str, gateway_factory: Any
) -> None:
    """OpenID Connect Discovery §4.3: the document's issuer must be the configured one. The
    real provider's issuer is ``http://127.0.0.1:PORT``; configured as ``localhost`` (the
    same server) it answers a document whose issuer differs."""
    with oidc_provider("http://127.0.0.1:9/cb") as provider:
        cfg = _config(stub_url, provider.issuer.replace("127.0.0.1", "localhost"), "email")
        _, base = gateway_factory(cfg, env=ENV)
        grant = device(base)
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as s:
            async with s.get(f"{base}/llm/oauth/device") as r:
                csrf = _csrf(await r.text())
            start = {"user_code": grant["user_code"], "csrf": csrf}
            async with s.post(f"{base}/llm/oauth/device/oidc", data=start) as r:
                assert r.status == 502
                said = _message(await r.text())
    assert said == "The identity provider's configuration is not usable (discovery)."


async def test_a_groups_claim_maps_a_team_onto_one_client(
    stub_url: str, gateway_factory: Any
) -> None:
    """``oidc_claim = "groups"``: any of the account's groups that a client lists."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with oidc_provider(f"{base}/llm/oauth/device/oidc/callback", "ES256") as provider:
        gateway_factory(_config(stub_url, provider.issuer, "groups"), env=ENV, port=port)
        provider.set_user("dana-sub", "dana@example.com", groups=("staff", "ops-team"))
        grant = device(base)
        status, page, _ = await _browse(base, grant["user_code"])
        assert status == 200 and "approved for the client ops" in _message(page), page
        assert poll(base, grant["device_code"])[0] == 200
