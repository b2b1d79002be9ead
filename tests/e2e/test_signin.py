"""Claude Code's sign-in (the gateway protocol's device flow), end to end over HTTP as a script
would run it: a real gateway process with two named clients, an admin key and ``[auth]`` on,
the scripted stub upstream, the official Python SDK with the bearer (``auth_token``).

device authorization -> the verification page (a wrong key refused, then the developer's key)
-> the token endpoint -> ``/v1/messages`` with the bearer, its usage recorded under the client
whose key approved it -> refresh (rotated) -> revocation -> 401 with ``x-should-retry: false``.
The token endpoint's errors are table-driven; keys keep working as before.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import anthropic
import pytest

from tests import sdk
from tests.batch_client import batches_toml, create, wait_ended
from tests.conftest import stub_config
from tests.procs import form_post, get, send_request, start_gateway

SIGNIN_METRICS = (
    ("llm_gateway_signin_device_codes_total", "outcome"),
    ("llm_gateway_signin_tokens_total", "event"),
    ("llm_gateway_signin_bearer_refused_total", "reason"),
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

KEYS = {"alice": "alice-key-1", "bob": "bob-key-2"}
ADMIN = "admin-key-3"
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
CONFIG = """
[[clients]]
name = "alice"
key_env = "ALICE_KEY"
email = "alice@example.com"

[[clients]]
name = "bob"
key_env = "BOB_KEY"

[auth]
enabled = true
poll_seconds = 1
page_tries_per_minute = 10
"""
ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gateway_proc(stub_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp_path = tmp_path_factory.mktemp("signin")
    cfg = stub_config(stub_url, extra_server='admin_keys_env = "ADMIN_KEYS"', models=("ok",))
    cfg += CONFIG + batches_toml(tmp_path / "gw.sqlite3")
    env = {"ALICE_KEY": KEYS["alice"], "BOB_KEY": KEYS["bob"], "ADMIN_KEYS": ADMIN}
    proc, base = start_gateway(cfg, tmp_path, env=env)
    yield proc, base
    proc.stop()


@pytest.fixture(scope="module")
def gateway(gateway_proc: Any) -> str:
    return gateway_proc[1]  # type: ignore[no-any-return]


def _device(base: str) -> dict[str, Any]:
    status, headers, body = form_post(
        f"{base}/llm/oauth/device_authorization", {"surface": "claude_code"}
    )
    assert status == 200, body
    assert headers["cache-control"] == "no-store"
    return json.loads(body)  # type: ignore[no-any-return]


def _poll(base: str, device_code: str) -> tuple[int, dict[str, Any]]:
    status, _, body = form_post(
        f"{base}/llm/oauth/token", {"grant_type": DEVICE_GRANT, "device_code": device_code}
    )
    return status, json.loads(body)


def _approve(base: str, user_code: str, key: str) -> tuple[int, dict[str, str], str]:
    status, headers, body = form_post(
        f"{base}/llm/oauth/device", {"user_code": user_code, "key": key}
    )
    return status, headers, body.decode()


def _signed_in(base: str, who: str) -> dict[str, Any]:
    grant = _device(base)
    assert _approve(base, grant["user_code"], KEYS[who])[0] == 200
    status, tokens = _poll(base, grant["device_code"])
    assert status == 200, tokens
    return tokens


def test_metadata_names_every_endpoint_on_the_requests_origin(gateway: str) -> None:
    status, _, body = get(f"{gateway}/llm/.well-known/oauth-authorization-server")
    assert status == 200
    meta = json.loads(body)
    assert meta["issuer"] == f"{gateway}/llm"
    assert meta["device_authorization_endpoint"] == f"{gateway}/llm/oauth/device_authorization"
    assert meta["token_endpoint"] == f"{gateway}/llm/oauth/token"
    assert meta["revocation_endpoint"] == f"{gateway}/llm/oauth/revoke"
    assert meta["grant_types_supported"] == [DEVICE_GRANT, "refresh_token"]
    assert "authorization_endpoint" not in meta


def test_the_whole_flow_as_a_script_runs_it(gateway: str) -> None:
    base = gateway
    grant = _device(base)
    assert re.fullmatch(r"[B-Z]{4}-[B-Z]{4}", grant["user_code"])
    assert len(grant["device_code"]) >= 43
    assert grant["verification_uri"] == f"{base}/llm/oauth/device"
    assert grant["verification_uri_complete"] == (
        f"{base}/llm/oauth/device?user_code={grant['user_code']}"
    )
    assert grant["expires_in"] == 600 and grant["interval"] == 1
    assert _poll(base, grant["device_code"]) == (400, _error("authorization_pending"))

    # the page: the code filled in, nothing submitted by itself, no script
    status, headers, page = get(grant["verification_uri_complete"])
    text = page.decode()
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert f'value="{grant["user_code"]}"' in text
    assert "<script" not in text and "frame-ancestors 'none'" in headers["content-security-policy"]
    # a wrong key and an unknown code read the same
    wrong_key = _approve(base, grant["user_code"], "not-a-key")
    wrong_code = _approve(base, "BBBB-BBBB", KEYS["alice"])
    assert wrong_key[0] == wrong_code[0] == 400
    assert _message(wrong_key[2]) == _message(wrong_code[2]) != ""
    status, _, page_text = _approve(base, grant["user_code"].lower(), KEYS["alice"])
    assert status == 200 and "approved for the client alice" in page_text

    status, tokens = _poll(base, grant["device_code"])
    assert status == 200, tokens
    assert tokens["token_type"] == "Bearer" and tokens["expires_in"] == 3600
    assert tokens["access_token"].startswith("gwat_")
    assert tokens["refresh_token"].startswith("gwrt_")
    # the device code is single-use
    assert _poll(base, grant["device_code"]) == (400, _error("invalid_grant"))

    # the bearer on the Messages API, through the SDK: alice's usage
    as_alice = sdk.client(base + "/llm", auth_token=tokens["access_token"], max_retries=0)
    msg = as_alice.messages.create(model="m-ok", max_tokens=64, messages=ASK)
    assert _usage_of(base, "alice") == msg.usage.output_tokens > 0

    # refresh: a new pair, the spent refresh token refused with the deprovisioning answer
    status, _, body = form_post(
        f"{base}/llm/oauth/token",
        {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]},
    )
    assert status == 200, body
    fresh = json.loads(body)
    assert fresh["access_token"] != tokens["access_token"]
    assert fresh["refresh_token"] != tokens["refresh_token"]
    as_alice = sdk.client(base + "/llm", auth_token=fresh["access_token"], max_retries=0)
    as_alice.messages.create(model="m-ok", max_tokens=64, messages=ASK)

    # sign-out: revocation, then the bearer is refused at once, saying not to retry
    status, _, _ = form_post(f"{base}/llm/oauth/revoke", {"token": fresh["access_token"]})
    assert status == 200
    with pytest.raises(anthropic.AuthenticationError) as refused:
        as_alice.messages.create(model="m-ok", max_tokens=64, messages=ASK)
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    # the session's refresh token went with it
    status, _, body = form_post(
        f"{base}/llm/oauth/token",
        {"grant_type": "refresh_token", "refresh_token": fresh["refresh_token"]},
    )
    assert (status, json.loads(body)["error"]) == (401, "invalid_grant")
    # revoking what is unknown is still a 200 (RFC 7009)
    assert form_post(f"{base}/llm/oauth/revoke", {"token": "nothing"})[0] == 200


def test_the_token_reply_names_the_clients_email(gateway: str) -> None:
    """The protocol's ``email`` extension: the configured account of the client that
    approved the code (Claude Code asks the developer to confirm it, then shows it in
    /status); none for a client without one, none on a refresh."""
    alice = _signed_in(gateway, "alice")
    assert alice["email"] == "alice@example.com"
    assert "email" not in _signed_in(gateway, "bob")
    status, _, body = form_post(
        f"{gateway}/llm/oauth/token",
        {"grant_type": "refresh_token", "refresh_token": alice["refresh_token"]},
    )
    assert status == 200 and "email" not in json.loads(body)


def _signin_counts(base: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    _, _, raw = get(f"{base}/metrics", headers={"x-api-key": KEYS["alice"]})
    names = dict(SIGNIN_METRICS)
    return {
        (s.name, s.labels[names[s.name]]): s.value
        for f in text_string_to_metric_families(raw.decode())
        for s in f.samples
        if s.name in names
    }


def test_sign_in_metrics_count_each_step(gateway: str) -> None:
    before = _signin_counts(gateway)
    # every series is there from the start, at its value
    assert len(before) == 4 + 3 + 4, sorted(before)
    grant = _device(gateway)
    assert _approve(gateway, grant["user_code"], "not-a-key")[0] == 400
    assert _approve(gateway, grant["user_code"], KEYS["bob"])[0] == 200
    status, tokens = _poll(gateway, grant["device_code"])
    assert status == 200
    status, _, body = form_post(
        f"{gateway}/llm/oauth/token",
        {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]},
    )
    assert status == 200
    fresh = json.loads(body)
    # the old access token still works until it expires; the new one is revoked, then refused
    assert form_post(f"{gateway}/llm/oauth/revoke", {"token": fresh["access_token"]})[0] == 200
    bearer = {"authorization": f"Bearer {fresh['access_token']}"}
    assert _messages(gateway, bearer)[0] == 401
    unknown = {"authorization": "Bearer gwat_" + "A" * 43}
    assert _messages(gateway, unknown)[0] == 401
    after = _signin_counts(gateway)
    moved = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
    d, t, r = (name for name, _ in SIGNIN_METRICS)
    assert moved == {
        (d, "issued"): 1,
        (d, "denied"): 1,
        (d, "approved"): 1,
        (t, "issued"): 1,
        (t, "refreshed"): 1,
        (t, "revoked"): 1,
        (r, "revoked"): 1,
        (r, "unknown"): 1,
    }


def test_expiries_are_counted(stub_url: str, tmp_path: Any) -> None:
    """A gateway whose device codes and access tokens last a second: a poll after the
    code's second hears expired_token, a bearer after the token's is refused as expired."""
    cfg = stub_config(stub_url, models=("ok",)) + CONFIG.replace(
        "poll_seconds = 1", "poll_seconds = 1\ncode_seconds = 1\naccess_token_seconds = 1"
    )
    proc, base = start_gateway(
        cfg + batches_toml(tmp_path / "gw.sqlite3"),
        tmp_path,
        env={"ALICE_KEY": KEYS["alice"], "BOB_KEY": KEYS["bob"]},
    )
    try:
        tokens = _signed_in(base, "alice")
        late = _device(base)
        time.sleep(1.5)  # both past their second
        assert _poll(base, late["device_code"]) == (400, _error("expired_token"))
        assert _messages(base, {"authorization": f"Bearer {tokens['access_token']}"})[0] == 401
        counts = _signin_counts(base)
        assert counts[("llm_gateway_signin_device_codes_total", "expired")] == 1
        assert counts[("llm_gateway_signin_bearer_refused_total", "expired")] == 1
    finally:
        proc.stop()


def test_a_spent_refresh_token_presented_again_ends_the_sign_in(gateway: str) -> None:
    tokens = _signed_in(gateway, "bob")
    refresh = {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]}
    status, _, body = form_post(f"{gateway}/llm/oauth/token", refresh)
    assert status == 200
    fresh = json.loads(body)
    # the old one again (a copy): refused, and the sign-in it belongs to is revoked
    assert form_post(f"{gateway}/llm/oauth/token", refresh)[0] == 401
    status, headers, _ = _messages(gateway, {"authorization": f"Bearer {fresh['access_token']}"})
    assert (status, headers.get("x-should-retry")) == (401, "false")


def test_sign_ins_are_logged_without_their_secrets(gateway_proc: Any) -> None:
    proc, base = gateway_proc
    grant = _device(base)
    _approve(base, grant["user_code"], KEYS["bob"])
    status, tokens = _poll(base, grant["device_code"])
    assert status == 200, tokens
    form_post(f"{base}/llm/oauth/revoke", {"token": tokens["refresh_token"]})
    deadline = time.monotonic() + 10  # log lines are written in batches: wait for them
    while "signin_revoked" not in (out := proc.output()) and time.monotonic() < deadline:
        time.sleep(0.1)
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    assert "signin_approved" in names and "signin_revoked" in names
    assert {"event": "signin_tokens_issued", "client": "bob"}.items() <= next(
        e for e in events if e["event"] == "signin_tokens_issued" and e.get("client") == "bob"
    ).items()
    for secret in (
        KEYS["bob"],
        grant["device_code"],
        tokens["access_token"],
        tokens["refresh_token"],
        grant["user_code"],
    ):
        assert secret not in out


def test_a_batch_made_with_a_bearer_is_the_clients_across_refreshes(gateway: str) -> None:
    """A signed-in developer's batch belongs to their client, not to the access token that
    made it: still theirs after a refresh, its requests counted as that client's."""
    tokens = _signed_in(gateway, "bob")
    bearer = {"authorization": f"Bearer {tokens['access_token']}"}
    before = _usage_of(gateway, "bob")
    request = {"custom_id": "b1", "params": {"model": "m-ok", "max_tokens": 16, "messages": ASK}}
    status, batch = create(gateway + "/llm", [request], headers=bearer)
    assert status == 200, batch
    wait_ended(gateway + "/llm", batch["id"], headers=bearer)
    status, _, body = form_post(
        f"{gateway}/llm/oauth/token",
        {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]},
    )
    assert status == 200, body
    fresh = {"authorization": f"Bearer {json.loads(body)['access_token']}"}
    status, _, got = get(f"{gateway}/llm/v1/messages/batches/{batch['id']}", headers=fresh)
    assert status == 200, got
    assert json.loads(got)["request_counts"]["succeeded"] == 1
    assert _usage_of(gateway, "bob") > before  # the batch's reply: bob's, not anonymous'
    # another client's key does not see it
    other = {"x-api-key": KEYS["alice"]}
    assert get(f"{gateway}/llm/v1/messages/batches/{batch['id']}", headers=other)[0] == 404


@pytest.mark.parametrize(
    ("headers", "status", "should_retry"),
    [
        ({"x-api-key": KEYS["bob"]}, 200, None),  # keys work as ever
        ({"authorization": f"Bearer {KEYS['bob']}"}, 200, None),
        ({"x-api-key": "wrong"}, 401, None),  # a wrong key: as before
        ({"authorization": "Bearer gwat_" + "A" * 43}, 401, "false"),  # a token not honoured
        ({}, 401, None),
    ],
)
def test_credentials(
    gateway: str, headers: dict[str, str], status: int, should_retry: str | None
) -> None:
    got, got_headers, body = _messages(gateway, headers)
    assert got == status, body
    assert got_headers.get("x-should-retry") == should_retry


@pytest.mark.parametrize(
    ("fields", "status", "error"),
    [
        ({}, 400, "invalid_request"),
        ({"grant_type": "password"}, 400, "unsupported_grant_type"),
        ({"grant_type": DEVICE_GRANT}, 400, "invalid_request"),
        ({"grant_type": DEVICE_GRANT, "device_code": "unknown"}, 400, "invalid_grant"),
        ({"grant_type": "refresh_token"}, 400, "invalid_request"),
        ({"grant_type": "refresh_token", "refresh_token": "gwrt_unknown"}, 401, "invalid_grant"),
        (b"grant_type=" + b"x" * 9000, 400, "invalid_request"),  # over the form's bound
    ],
    ids=[
        "empty",
        "password",
        "no device_code",
        "unknown device_code",
        "no refresh_token",
        "unknown refresh_token",
        "too large",
    ],
)
def test_token_endpoint_errors(
    gateway: str, fields: dict[str, str] | bytes, status: int, error: str
) -> None:
    got, headers, body = form_post(f"{gateway}/llm/oauth/token", fields)
    assert (got, json.loads(body)["error"]) == (status, error)
    assert headers["cache-control"] == "no-store"


def test_the_page_is_throttled_per_address(gateway: str) -> None:
    """Wrong tries past ``page_tries_per_minute`` (10, other tests' tries in this minute
    included) are refused with 429 and say so."""
    statuses = [_approve(gateway, "BBBB-BBBB", "wrong")[0] for _ in range(11)]
    assert statuses[-1] == 429 and set(statuses) <= {400, 429}
    status, headers, text = _approve(gateway, "BBBB-BBBB", KEYS["alice"])
    assert status == 429 and int(headers["retry-after"]) >= 1 and "Too many tries" in text


def test_the_page_echoes_only_a_well_formed_code(gateway: str) -> None:
    """``?user_code=`` is shown only as a normalised code; anything else is not echoed."""
    status, _, page = get(f"{gateway}/llm/oauth/device?user_code=%22%3E%3Cscript%3Ex")
    assert status == 200 and b"<script" not in page and b'value=""' in page


def _messages(base: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    import urllib.request

    body = json.dumps({"model": "m-ok", "max_tokens": 16, "messages": ASK}).encode()
    req = urllib.request.Request(
        f"{base}/llm/v1/messages",
        data=body,
        method="POST",
        headers={"content-type": "application/json", **headers},
    )
    return send_request(req, 10)


def _error(code: str) -> dict[str, Any]:
    from gateway.auth.oauth import _DESCRIPTIONS

    return {"error": code, "error_description": _DESCRIPTIONS[code]}


def _message(page: str) -> str:
    m = re.search(r'<p class="err">([^<]*)</p>', page)
    return m.group(1) if m else ""


def _usage_of(base: str, client: str) -> int:
    start = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    query = urlencode({"starting_at": start, "group_by[]": "api_key_id"})
    status, _, body = get(
        f"{base}/llm/v1/organizations/usage_report/messages?{query}", headers={"x-api-key": ADMIN}
    )
    assert status == 200, body
    return sum(
        r["output_tokens"]
        for bucket in json.loads(body)["data"]
        for r in bucket["results"]
        if r["api_key_id"] == client
    )


def test_new_device_codes_are_throttled_per_address(gateway: str) -> None:
    """Past ``page_tries_per_minute`` new codes from one address (other tests' included):
    429 ``slow_down``, what Claude Code reads as the gateway limiting sign-in attempts."""
    url = f"{gateway}/llm/oauth/device_authorization"
    answers = [form_post(url, {"surface": "claude_code"}) for _ in range(11)]
    assert {a[0] for a in answers} <= {200, 429} and answers[-1][0] == 429
    _, headers, body = answers[-1]
    assert json.loads(body)["error"] == "slow_down" and int(headers["retry-after"]) >= 1
