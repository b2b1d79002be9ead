"""The real Claude Code 2.1.332 signs in to the gateway with the protocol's device flow, offline.

tests/clients/claude_signin_run.py runs it all inside a loopback-only network namespace
(``unshare -n``, root): ``claude auth login --gateway-json`` with ``forceLoginMethod:
"gateway"`` and ``forceLoginGatewayUrl`` in the fake home's settings, the code approved on
the gateway's verification page with the client ``dev``'s key while Claude Code polls; then
``claude -p`` with no key in its environment, on the stored credential (the gateway's
access tokens last 60 s, so Claude Code refreshes them first); then the gateway revokes it
and ``claude -p`` is refused at once; then ``claude auth logout``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.node import CLIENTS, need_claude_code

pytestmark = [pytest.mark.e2e, pytest.mark.clients, pytest.mark.timeout(400)]


def _run(tmp_path: Path, *mode: str) -> dict:
    need_claude_code()
    out = tmp_path / "signin.json"
    proc = subprocess.run(
        ["unshare", "-n", sys.executable, str(CLIENTS / "claude_signin_run.py"), str(out), *mode],
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert out.exists(), proc.stdout + proc.stderr
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def test_claude_code_signs_in_runs_a_prompt_and_is_refused_once_revoked(tmp_path: Path) -> None:
    run = _run(tmp_path)
    login = run["login"]
    assert login["exit_code"] == 0, login
    states = [m["state"] for m in login["lines"] if isinstance(m, dict) and "state" in m]
    assert states[0] == "url_input" and states[-1] == "done", states
    assert "trust_prompt" in states and "polling" in states
    polling = next(m for m in login["lines"] if isinstance(m, dict) and m.get("state") == "polling")
    assert polling["verificationUri"].endswith("/llm/oauth/device")
    assert polling["browserUrl"].endswith(f"?user_code={polling['userCode']}")
    assert login["page"] == {"status": 200, "approved": True}
    # the token reply's email (the client's configured account): Claude Code asks the
    # developer to confirm it before it stores the credential, and keeps it
    confirm = next(
        m for m in login["lines"] if isinstance(m, dict) and m.get("state") == "confirm_account"
    )
    assert confirm["shown"] == "dev@example.com" and confirm["shownLabel"] == "Account:"
    assert states.index("confirm_account") < states.index("done")
    # what Claude Code kept: the gateway's endpoints (same origin), an expiry
    stored = run["stored"]
    assert stored["tokenEndpoint"] == stored["url"] + "/oauth/token"
    assert stored["revocationEndpoint"] == stored["url"] + "/oauth/revoke"
    assert stored["email"] == "dev@example.com"

    prompt = run["prompt"]
    assert prompt["exit_code"] == 0, prompt
    assert prompt["result"]["is_error"] is False
    assert prompt["result"]["result"] == "Hello from the stub."
    assert run["usage_dev"] == prompt["result"]["usage"]["output_tokens"] > 0  # the client's

    # dev's daily budget, most of it taken by the second prompt's request: Claude Code read
    # the unified headers as the notice's figures ("You've used NN% of your usage credits")
    *events, ended = run["events"]
    assert ended["exit_code"] == 0, run["events"]
    assert len(events) == 1, events
    info = events[0]
    assert info["status"] == "allowed_warning" and info["overageStatus"] == "allowed_warning"
    assert info["rateLimitType"] == "overage"
    assert info["surpassedThreshold"] in (0.75, 0.95)
    assert info["surpassedThreshold"] <= info["utilization"] < 1
    assert info["resetsAt"] == info["overageResetsAt"] > time.time()

    access = run["access"]
    routes = [(a["route"], a["status"]) for a in access]
    assert ("oauth_meta", 200) in routes and ("oauth_device", 200) in routes
    assert ("messages", 200) in routes
    # 60-second access tokens, under Claude Code's 5-minute margin: it refreshed (rotating
    # the refresh token) before its requests, and each new pair worked
    tokens = [a["status"] for a in access if a["route"] == "oauth_token"]
    assert tokens[:3] == [200, 200, 200], tokens  # the device grant, then refreshes

    # revoked by the gateway: the next prompt is refused, and Claude Code does not retry
    assert run["revoked"] == 200
    after = run["after_revoke"]
    assert after["exit_code"] != 0
    # the refusal reaches the developer: from /v1/messages ("Failed to authenticate ... sign
    # in again"), or, where the gateway serves /managed/settings, from that first fetch
    # ("... no longer accepts this session ... sign in again with /login")
    said = (after["result"] or {}).get("result", "") + after["stderr"]
    assert "sign in again" in said, after
    revoke_at = [i for i, a in enumerate(access) if a["route"] == "oauth_revoke"]
    between = access[revoke_at[0] + 1 : revoke_at[1]]  # the gateway's revocation .. logout
    assert [a["status"] for a in between if a["route"] == "oauth_token"] == [401]  # refresh
    # x-should-retry: false: one refused request, no retries, nothing let through (a 404 is
    # /managed/settings on a gateway that does not serve it)
    refused = [a for a in between if not a["route"].startswith("oauth") and a["status"] != 404]
    assert [a["status"] for a in refused] == [401], refused

    # sign-out asks the gateway to revoke what it still holds
    assert run["logout"]["exit_code"] == 0
    revokes = [a["status"] for a in access if a["route"] == "oauth_revoke"]
    assert len(revokes) >= 2 and set(revokes) == {200}


def test_a_signed_in_claude_codes_telemetry_reaches_the_collector_as_its_client(
    tmp_path: Path,
) -> None:
    """Signed in, with no OpenTelemetry variable of its own: the gateway's managed settings
    switch its telemetry on, and Claude Code sends its OTLP to the gateway it signed in to
    with its sign-in bearer (as its 2.1.332 binary does for a gateway session), so the gateway
    forwards it under the client ``dev``; no key and no header was given to it."""
    run = _run(tmp_path, "telemetry")
    assert run["login"]["exit_code"] == 0, run["login"]
    assert run["prompt"]["exit_code"] == 0, run["prompt"]
    forwarded = run["forwarded"]
    assert {f["signal"] for f in forwarded} == {"metrics", "logs", "traces"}, forwarded
    assert all(f["service.name"] == "claude-code" for f in forwarded)
    assert all(f["gateway.client.name"] == f["enduser.id"] == "dev" for f in forwarded)
    otlp = [a["status"] for a in run["access"] if a["route"] == "otlp"]
    assert otlp and set(otlp) == {200}, otlp
    assert ("managed_settings", 200) in [(a["route"], a["status"]) for a in run["access"]]
