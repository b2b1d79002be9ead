"""The verification page in a real headless browser (Chromium over the DevTools protocol,
tests/browser.py), as a developer uses it: the link from the terminal opens the form with
the code filled in and approves nothing by itself; a wrong key shows the refusal; the right
key signs in; too many tries from one address show the limited page; and "Sign in with
<provider>" goes through a real OpenID Connect provider (tests/clients/oidc_provider.mjs)
and back, approving the code for the client the provider's account maps to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.browser import chromium, chromium_path
from tests.conftest import stub_config
from tests.oidc_provider import CLIENT_ID, SECRET, Provider, oidc_provider
from tests.procs import Proc, free_port, post, start_gateway
from tests.signin_client import device, poll

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

KEYS = {"alice": "alice-key-1", "bob": "bob-key-2"}
ASK = {"model": "m-ok", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
CLIENTS = """
[[clients]]
name = "alice"
key_env = "ALICE_KEY"
oidc_values = ["alice@example.com"]

[[clients]]
name = "bob"
key_env = "BOB_KEY"
oidc_values = ["bob@example.com"]
"""
ENV = {"ALICE_KEY": KEYS["alice"], "BOB_KEY": KEYS["bob"], "OIDC_SECRET": SECRET}


@pytest.fixture(scope="module")
def oidc_gateway(
    stub_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Provider]]:
    chromium_path()  # skip (fail under CI) before starting anything
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with oidc_provider(f"{base}/llm/oauth/device/oidc/callback") as provider:
        cfg = (
            stub_config(stub_url, models=("ok",))
            + CLIENTS
            + f"""
[auth]
enabled = true
poll_seconds = 1
page_tries_per_minute = 100
oidc_issuer = "{provider.issuer}"
oidc_client_id = "{CLIENT_ID}"
oidc_client_secret_env = "OIDC_SECRET"
oidc_name = "Test IdP"
"""
        )
        proc, url = start_gateway(cfg, tmp_path_factory.mktemp("browser"), env=ENV, port=port)
        try:
            yield url, provider
        finally:
            proc.stop()


def _works_as_a_bearer(base: str, device_code: str) -> None:
    status, tokens = poll(base, device_code)
    assert status == 200, tokens
    bearer = {"authorization": f"Bearer {tokens['access_token']}"}
    status, _, body = post(f"{base}/llm/v1/messages", ASK, bearer)
    assert status == 200, body


async def test_the_link_shows_the_form_and_only_the_developers_key_approves(
    oidc_gateway: tuple[str, Provider],
) -> None:
    base, _ = oidc_gateway
    grant = device(base)
    async with chromium() as browser, browser.tab() as tab:
        await tab.open(grant["verification_uri_complete"])
        assert tab.status == 200
        assert "Sign in to the gateway" in await tab.text()
        assert await tab.value("#user_code") == grant["user_code"]
        assert await tab.has("#key") and await tab.has("#approve") and await tab.has("#oidc")
        # opening a link that carries the code approved nothing
        assert poll(base, grant["device_code"])[1]["error"] == "authorization_pending"

        await tab.type("#key", "not-a-key")
        await tab.click("#approve", "/oauth/device")
        assert tab.status == 400
        assert "That code and key were not accepted" in await tab.text()
        assert await tab.value("#user_code") == grant["user_code"]  # kept for the next try
        assert await tab.value("#key") == ""  # the key is never echoed back
        assert poll(base, grant["device_code"])[1]["error"] == "authorization_pending"

        await tab.type("#key", KEYS["alice"])
        await tab.click("#approve", "/oauth/device")
        assert tab.status == 200
        text = await tab.text()
        assert "Signed in" in text and "approved for the client alice" in text
    _works_as_a_bearer(base, grant["device_code"])


async def test_sign_in_with_the_provider_in_the_browser(
    oidc_gateway: tuple[str, Provider],
) -> None:
    base, provider = oidc_gateway
    provider.set_user("bob-sub", "bob@example.com")
    grant = device(base)
    async with chromium() as browser, browser.tab() as tab:
        await tab.open(grant["verification_uri_complete"])
        assert "Sign in with Test IdP" in await tab.text()
        # the provider's login, its redirect back, the gateway's callback
        await tab.click("#oidc", "/oauth/device/oidc/callback")
        assert tab.status == 200, await tab.text()
        text = await tab.text()
        assert f"The code {grant['user_code']} is approved for the client bob" in text
    _works_as_a_bearer(base, grant["device_code"])


async def test_an_account_that_names_no_client_is_told_so(
    oidc_gateway: tuple[str, Provider],
) -> None:
    base, provider = oidc_gateway
    provider.set_user("carol-sub", "carol@example.com")
    grant = device(base)
    async with chromium() as browser, browser.tab() as tab:
        await tab.open(grant["verification_uri_complete"])
        await tab.click("#oidc", "/oauth/device/oidc/callback")
        assert tab.status == 403
        assert "this gateway has no client for that account" in await tab.text()
    assert poll(base, grant["device_code"])[1]["error"] == "authorization_pending"


async def test_too_many_tries_from_one_address_show_the_limited_page(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]], tmp_path: Path
) -> None:
    chromium_path()
    cfg = stub_config(stub_url, models=("ok",)) + CLIENTS.replace(
        'oidc_values = ["alice@example.com"]\n', ""
    ).replace('oidc_values = ["bob@example.com"]\n', "")
    cfg += "\n[auth]\nenabled = true\npage_tries_per_minute = 2\n"
    _, base = gateway_factory(cfg, env=ENV)
    grant = device(base)
    async with chromium() as browser, browser.tab() as tab:
        await tab.open(grant["verification_uri_complete"])
        assert not await tab.has("#oidc")  # no provider configured: the key form alone
        for _ in range(2):
            await tab.type("#key", "not-a-key")
            await tab.click("#approve", "/oauth/device")
            assert tab.status == 400
        await tab.type("#key", KEYS["alice"])  # even the right key, past the limit
        await tab.click("#approve", "/oauth/device")
        assert tab.status == 429
        assert "Too many tries from this address" in await tab.text()
    assert poll(base, grant["device_code"])[1]["error"] == "authorization_pending"
