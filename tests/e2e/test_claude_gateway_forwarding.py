"""Behind Anthropic's gateway: Claude Code -> ``claude gateway`` -> this gateway, end to end.

tests/clients/claude_gateway_run.py runs, in a loopback-only network namespace, the
``claude gateway`` subcommand of Claude Code 2.1.332's own binary (with a real PostgreSQL
and tests/oidc_issuer.py as its OpenID Connect issuer), its ``anthropic`` upstream pointed at
this gateway with ``forward_user_identity: true``; Claude Code signs in to ``claude
gateway`` (device flow, the browser's part done by the script) and runs a prompt. This
gateway trusts forwarders at 127.0.0.1 and maps the forwarded ``sub`` to the client
``alice``; a request from 127.0.0.2 with another client's key and the same headers is a
spoof and stays that client's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.node import CLIENTS, need_claude_code
from tests.pg import unavailable

pytestmark = [pytest.mark.e2e, pytest.mark.clients, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    need_claude_code(unavailable())
    out = tmp_path_factory.mktemp("cc-gateway") / "run.json"
    proc = subprocess.run(
        ["unshare", "-n", sys.executable, str(CLIENTS / "claude_gateway_run.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert out.exists(), proc.stdout + proc.stderr
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def test_claude_code_signs_in_to_claude_gateway(run: dict) -> None:
    assert run["protocol_served"] == 200  # GET /protocol: the contract it serves
    login = run["login"]
    assert login["exit_code"] == 0, (login, run.get("claude_gateway_log"))
    states = [m["state"] for m in login["lines"] if isinstance(m, dict) and "state" in m]
    assert states[-1] == "done", states
    # the browser's part: the form, the issuer, back to claude gateway's callback
    assert login["page"] == {"status": 200, "path": "/oauth/callback", "signed_in": True}


def test_the_forwarded_developer_is_this_gateways_client(run: dict) -> None:
    prompt = run["prompt"]
    assert prompt["exit_code"] == 0, (prompt, run.get("claude_gateway_log"))
    assert prompt["result"]["result"] == "Hello from the stub."
    # Claude Code's request reached this gateway with claude gateway's key and alice's
    # forwarded sub: it is alice's, not the forwarder's; the spoof is dev's own
    assert run["clients"] == {"claude-gateway": 0, "alice": 1, "dev": 1}
    assert run["forwarded"] == {"named": 1, "unnamed": 0, "ignored": 1}
    assert run["spoof"] == 200
    assert [(a["route"], a["status"]) for a in run["access"]] == [("messages", 200)] * 2


def test_the_identity_headers_never_reach_the_engine(run: dict) -> None:
    assert run["upstream_requests"] == 2
    assert run["upstream_identity_headers"] == []
