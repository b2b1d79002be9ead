"""Claude Code signs in to Anthropic's ``claude gateway`` (in Claude Code's own binary), which
forwards to this gateway with ``forward_user_identity: true``; inside a loopback-only network
namespace.

    unshare -n python tests/clients/claude_gateway_run.py OUT.json

Everything is real except the identity provider, tests/oidc_issuer.py (one user, ``sub``
``00u-alice``, approved without a form):

* PostgreSQL (tests/pg.py), which ``claude gateway`` requires (``store.postgres_url``);
* this gateway in front of the scripted stub (tests/stub_upstream.py), with three clients:
  ``claude-gateway`` (``forwards_identity = true``; its key is the ``anthropic`` upstream's
  ``auth.api_key`` in ``claude gateway``'s config), ``alice`` (``forwarded_ids =
  ["00u-alice"]``) and ``dev``; ``auth.trusted_forwarders = ["127.0.0.1/32"]``;
* ``claude gateway --config`` whose ``anthropic`` upstream's ``base_url`` is
  ``http://localhost:PORT/llm`` (it refuses an IP literal on loopback as a metadata address
  and loopback at all unless ``CLAUDE_GATEWAY_ALLOW_LOOPBACK=1``);
* Claude Code: ``claude auth login --gateway-json`` against ``claude gateway`` (its
  verification page's form posted, then the redirects to the issuer and back followed, as a
  browser would), then ``claude -p`` with the session it stored.

Writes one JSON object to OUT.json: the login, the prompt's result, ``claude gateway``'s
startup log tail, the identity headers this gateway's upstream (the stub) was sent (none
expected), this gateway's per-client request counts and forwarded-identity outcomes, a
spoofed request's outcome, and this gateway's access lines.
"""

from __future__ import annotations

import http.client
import http.cookiejar
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.clients.claude_signin_run import CLAUDE, login, run_claude  # noqa: E402
from tests.logs import access_lines  # noqa: E402
from tests.pg import PgServer  # noqa: E402
from tests.procs import Proc, free_port, get, metric, start_gateway, wait_http  # noqa: E402

FORWARDER_KEY = "cg-forwarder-key-1"
DEV_KEY = "dev-key-2"
SUB, EMAIL = "00u-alice", "alice@example.com"
JWT_SECRET = "test-session-secret-0123456789abcdef-0123456789"
CLIENTS = ("claude-gateway", "alice", "dev")


def _config(stub_url: str, ops_port: int) -> str:
    return f"""
[server]
host = "127.0.0.1"
port = 8080
prefix = "/llm"
metrics_port = {ops_port}

[upstreams.stub]
base_url = "{stub_url}/v1"

[[models]]
name = "claude-*"
upstream = "stub"
upstream_model = "ok"

[auth]
trusted_forwarders = ["127.0.0.1/32"]

[[clients]]
name = "claude-gateway"
key_env = "FORWARDER_KEY"
forwards_identity = true

[[clients]]
name = "alice"
key_env = "ALICE_KEY"
forwarded_ids = ["{SUB}"]

[[clients]]
name = "dev"
key_env = "DEV_KEY"
"""


def _claude_gateway_config(port: int, ours: int, issuer: str, postgres: str) -> str:
    return f"""
listen:
  host: 127.0.0.1
  port: {port}
session:
  jwt_secret: {JWT_SECRET}
store:
  postgres_url: {postgres}
oidc:
  issuer: {issuer}
  client_id: claude-gateway-test
  client_secret: test-secret
upstreams:
  - name: ours
    provider: anthropic
    base_url: http://localhost:{ours}/llm
    auth:
      api_key: {FORWARDER_KEY}
    forward_user_identity: true
"""


def _browser_approves(base: str, user_code: str) -> dict[str, Any]:
    """What a developer's browser does: the verification page's form (``user_code``) posted,
    then the redirects to the issuer and back to ``/oauth/callback`` followed."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    with opener.open(f"{base}/device?user_code={user_code}", timeout=10) as page:
        page.read()
    form = urllib.request.Request(
        f"{base}/device",
        data=urllib.parse.urlencode({"user_code": user_code}).encode(),
        headers={"Origin": base, "Content-Type": "application/x-www-form-urlencoded"},
    )
    try:
        with opener.open(form, timeout=10) as done:
            text = done.read().decode("utf-8", "replace")
            return {
                "status": done.status,
                "path": urllib.parse.urlsplit(done.url).path,
                "signed_in": "signed in" in text,
            }
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "path": urllib.parse.urlsplit(exc.url).path}


def _spoof(ours: str) -> int:
    """A client at an untrusted address (127.0.0.2) with its own key naming alice."""
    host, port = ours.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10, source_address=("127.0.0.2", 0))
    body = {"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    try:
        conn.request(
            "POST",
            "/llm/v1/messages",
            json.dumps(body),
            {
                "content-type": "application/json",
                "anthropic-version": "2023-06-01",
                "x-api-key": DEV_KEY,
                "x-claude-gateway-user-id": SUB,
                "x-claude-gateway-user-email": EMAIL,
            },
        )
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def main() -> int:
    out_path = sys.argv[1]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="cc-gateway-"))
    home, work = tmp / "home", tmp / "work"
    (home / ".claude").mkdir(parents=True)
    work.mkdir()
    record: dict[str, Any] = {}
    procs: list[Proc] = []
    pg = PgServer()
    gateway = claude_gw = None
    try:
        pg.start()
        stub_port, issuer_port, cg_port, ops_port = (free_port() for _ in range(4))
        procs.append(
            Proc([sys.executable, str(REPO / "tests" / "stub_upstream.py"), str(stub_port)])
        )
        issuer = f"http://localhost:{issuer_port}"
        procs.append(
            Proc(
                [
                    sys.executable,
                    str(REPO / "tests" / "oidc_issuer.py"),
                    str(issuer_port),
                    SUB,
                    EMAIL,
                ]
            )
        )
        wait_http(f"http://127.0.0.1:{stub_port}/health")
        wait_http(f"http://127.0.0.1:{issuer_port}/health")
        gateway, ours = start_gateway(
            _config(f"http://127.0.0.1:{stub_port}", ops_port),
            tmp,
            env={"FORWARDER_KEY": FORWARDER_KEY, "ALICE_KEY": "alice-own-key", "DEV_KEY": DEV_KEY},
        )
        ours_port = int(ours.rsplit(":", 1)[1])
        cfg = tmp / "claude-gateway.yaml"
        cfg.write_text(
            _claude_gateway_config(cg_port, ours_port, issuer, pg.create_db("claude_gateway"))
        )
        claude_gw = Proc(
            [str(CLAUDE), "gateway", "--config", str(cfg)],
            env={"CLAUDE_GATEWAY_ALLOW_LOOPBACK": "1", "HOME": str(tmp / "cg-home")},
        )
        base = f"http://127.0.0.1:{cg_port}"
        wait_http(
            f"{base}/.well-known/oauth-authorization-server", timeout=60, proc=claude_gw.popen
        )
        record["protocol_served"] = get(f"{base}/protocol")[0]
        (home / ".claude" / "settings.json").write_text(
            json.dumps({"forceLoginMethod": "gateway", "forceLoginGatewayUrl": base})
        )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_MAX_RETRIES": "0",
        }
        record["login"] = login(env, work, base, lambda code: _browser_approves(base, code))
        record["prompt"] = run_claude(
            ["-p", "Say hi", "--output-format", "json", "--no-session-persistence"], env, work
        )
        record["spoof"] = _spoof(ours)
        ops = f"http://127.0.0.1:{ops_port}"
        record["clients"] = {
            c: metric(ops, "llm_gateway_client_requests_total", client=c) for c in CLIENTS
        }
        record["forwarded"] = {
            o: metric(ops, "llm_gateway_forwarded_identities_total", outcome=o)
            for o in ("named", "unnamed", "ignored")
        }
        _, _, sent = get(f"http://127.0.0.1:{stub_port}/_requests")
        record["upstream_identity_headers"] = sorted(
            {
                k.lower()
                for r in json.loads(sent)
                for k in r["headers"]
                if "gateway-user" in k.lower()
            }
        )
        record["upstream_requests"] = len(json.loads(sent))
    finally:
        if claude_gw is not None:
            claude_gw.stop()
            record["claude_gateway_log"] = claude_gw.output()[-4000:]
        if gateway is not None:
            gateway.stop()
            record["access"] = access_lines(gateway.output())
        for proc in procs:
            proc.stop()
        pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    Path(out_path).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
