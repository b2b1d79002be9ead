"""Claude Code signs in to the gateway (the protocol's device flow), inside a loopback-only
network namespace, then runs a prompt with the credential it stored.

    unshare -n python tests/clients/claude_signin_run.py OUT.json [telemetry]

The gateway (``[auth]`` on, one named client ``dev``, an admin key for the usage report) sits
in front of the scripted stub; ``$HOME/.claude/settings.json`` holds ``forceLoginMethod:
"gateway"`` and ``forceLoginGatewayUrl`` (honoured from the user's own settings on a
machine without managed settings). Steps:

1. ``claude auth login --gateway-json``: Claude Code writes its questions as JSON lines; each
   is answered ``accept`` (the gateway URL, trusting it); when it says ``polling`` with its
   ``userCode``, this script approves the code on the verification page with ``dev``'s key,
   as a developer would in the browser.
2. ``claude -p PROMPT`` with no key in its environment: the stored sign-in is its credential.
   Then ``claude -p PROMPT --output-format stream-json``: its ``rate_limit_event`` lines,
   what it read of the ``anthropic-ratelimit-unified-*`` headers of ``dev``'s daily budget.
3. The gateway revokes the stored access token (its revocation endpoint, as an operator
   would); ``claude -p`` again: refused at once (401, ``x-should-retry: false``).
4. ``claude auth logout``: sign-out revokes the tokens at the gateway.

With ``telemetry``: the gateway has ``[telemetry]`` (a collector written in tests) and serves
managed settings; after the sign-in, one ``claude -p`` with no OpenTelemetry variable of its own
but the export intervals, then sign-out. The record has what the collector received of
Claude Code's own OTLP (forwarded by the gateway with the client's name) instead of steps 2-3.

Writes one JSON object to OUT.json: each step's exit code, stdout and stderr (the login's
JSON lines parsed), the page's answer, the usage report of ``dev``, and the gateway's
access-log lines.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.logs import access_lines  # noqa: E402
from tests.otlp_collector import Collector, value_of  # noqa: E402
from tests.procs import Proc, free_port, send_request, start_gateway, wait_http  # noqa: E402

CLAUDE = REPO / "tests" / "clients" / "node_modules" / ".bin" / "claude"
DEV_KEY = "dev-key-7"
ADMIN_KEY = "admin-key-8"
PROMPT = "Say hi"
# the questions the login asks; each is answered "yes"
QUESTIONS = ("url_input", "trust_prompt", "confirm_account")


def _config(stub_url: str, database: Path, collector: str | None = None) -> str:
    telemetry = (
        f'\n[telemetry]\notlp_endpoint = "{collector}"\nexport_interval = 1\n' if collector else ""
    )
    return f"""
[server]
host = "127.0.0.1"
port = 8080
prefix = "/llm"
admin_keys_env = "ADMIN_KEYS"
{telemetry}

[upstreams.stub]
base_url = "{stub_url}/v1"
connect_timeout = 2
header_timeout = 3
idle_timeout = 3

[[models]]
name = "tiny-demo"
upstream = "stub"
upstream_model = "ok"

[[models]]
name = "claude-*"
upstream = "stub"
upstream_model = "ok"

[[clients]]
name = "dev"
key_env = "DEV_KEY"
email = "dev@example.com"
# a daily budget the second prompt's request takes most of: Claude Code's full-mode prompt
# is estimated at about 12,000 tokens (its bytes / 4; the first prompt's reply used 17)
tokens_per_day = 14000

[batches]
database = {json.dumps(str(database))}

[auth]
enabled = true
poll_seconds = 1
# under Claude Code's 5-minute refresh margin: it refreshes before each request
access_token_seconds = 60
"""


def approve(base: str, user_code: str) -> dict[str, Any]:
    data = urllib.parse.urlencode({"user_code": user_code, "key": DEV_KEY}).encode()
    req = urllib.request.Request(
        f"{base}/llm/oauth/device",
        data=data,
        method="POST",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    status, _, body = send_request(req, 10)
    return {"status": status, "approved": b"is approved" in body}


def login(
    env: dict[str, str],
    cwd: Path,
    base: str,
    approve_code: Callable[[str], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``claude auth login --gateway-json``, every question answered yes, the code approved
    (on this gateway's page with ``dev``'s key, or by ``approve_code(user_code)``)."""
    proc = subprocess.Popen(
        [str(CLAUDE), "auth", "login", "--gateway-json"],
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[Any] = []
    page = None
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        try:
            msg = json.loads(line)
        except ValueError:
            seen.append(line.rstrip("\n"))
            continue
        seen.append(msg)
        state = msg.get("state") if isinstance(msg, dict) else None
        if state in QUESTIONS:
            answer = {"state": state, "shown": msg.get("shown"), "accept": True}
            proc.stdin.write(json.dumps(answer) + "\n")
            proc.stdin.flush()
        elif state == "polling" and page is None and msg.get("userCode"):
            page = (approve_code or (lambda code: approve(base, code)))(msg["userCode"])
    try:
        proc.stdin.close()
    except OSError:
        pass
    try:
        code: int | None = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = None
    return {"exit_code": code, "lines": seen, "stderr": proc.stderr.read()[-3000:], "page": page}


def run_claude(
    argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 90
) -> dict[str, Any]:
    """``claude ARGV``: exit code, output tails, ``result`` (the last JSON line) and
    ``events`` (every JSON line, for ``--output-format stream-json``)."""
    try:
        done = subprocess.run(
            [str(CLAUDE), *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
        code: int | None = done.returncode
        out, err = done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = None, str(exc.stdout or ""), str(exc.stderr or "")
    events = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
    result = events[-1] if events else None
    return {
        "exit_code": code,
        "stdout": out[-3000:],
        "stderr": err[-3000:],
        "result": result,
        "events": events,
    }


def _events(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The rate_limit_event lines of a stream-json run, and its exit code as the last."""
    out = [
        msg["rate_limit_info"]
        for msg in run.get("events", [])
        if isinstance(msg, dict) and msg.get("type") == "rate_limit_event"
    ]
    return [*out, {"exit_code": run.get("exit_code")}]


def _usage(base: str) -> int:
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 86400))
    query = urllib.parse.urlencode({"starting_at": start, "group_by[]": "api_key_id"})
    req = urllib.request.Request(
        f"{base}/llm/v1/organizations/usage_report/messages?{query}",
        headers={"x-api-key": ADMIN_KEY},
    )
    status, _, body = send_request(req, 10)
    if status != 200:
        return -status
    return sum(
        r["output_tokens"]
        for b in json.loads(body)["data"]
        for r in b["results"]
        if r["api_key_id"] == "dev"
    )


def stored_credential(home: Path) -> dict[str, Any]:
    """The gateway credential Claude Code stored (``enterpriseGateway``), or {}."""
    path = home / ".claude" / ".credentials.json"
    if not path.exists():
        return {}
    stored = json.loads(path.read_text()).get("enterpriseGateway")
    return stored if isinstance(stored, dict) else {}


def revoke(base: str, token: str) -> int:
    req = urllib.request.Request(
        f"{base}/llm/oauth/revoke",
        data=urllib.parse.urlencode({"token": token}).encode(),
        method="POST",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    return send_request(req, 10)[0]


def main() -> int:
    out_path = sys.argv[1]
    telemetry = sys.argv[2:] == ["telemetry"]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="cc-signin-"))
    home, work = tmp / "home", tmp / "work"
    (home / ".claude").mkdir(parents=True)
    work.mkdir()
    port = free_port()
    stub = Proc([sys.executable, str(REPO / "tests" / "stub_upstream.py"), str(port)])
    record: dict[str, Any] = {}
    gateway = None
    collector = Collector() if telemetry else None
    try:
        if collector is not None:
            collector.start()
        wait_http(f"http://127.0.0.1:{port}/health")
        gateway, base = start_gateway(
            _config(
                f"http://127.0.0.1:{port}",
                tmp / "gw.sqlite3",
                collector.url if collector is not None else None,
            ),
            tmp,
            env={
                "STATE_DIRECTORY": str(tmp / "state"),
                "DEV_KEY": DEV_KEY,
                "ADMIN_KEYS": ADMIN_KEY,
            },
        )
        (home / ".claude" / "settings.json").write_text(
            json.dumps({"forceLoginMethod": "gateway", "forceLoginGatewayUrl": f"{base}/llm"})
        )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "ANTHROPIC_MODEL": "tiny-demo",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_MAX_RETRIES": "0",
        }
        record["login"] = login(env, work, base)
        if collector is not None:
            record.update(_telemetry_steps(env, work, collector))
            return 0
        record["credentials"] = sorted(
            str(p.relative_to(home)) for p in (home / ".claude").rglob("*") if p.is_file()
        )
        record["prompt"] = run_claude(
            ["-p", PROMPT, "--output-format", "json", "--no-session-persistence"], env, work
        )
        record["usage_dev"] = _usage(base)
        # again, its events as JSON lines: the budget's standing (rate_limit_event). Before
        # `auth status`: a run after it presented a refresh token the gateway had already
        # rotated (seen with 2.1.332), which ends the sign-in as a copied token
        record["events"] = _events(
            run_claude(
                [
                    "-p",
                    PROMPT,
                    "--output-format",
                    "stream-json",
                    "--verbose",
                    "--no-session-persistence",
                ],
                env,
                work,
            )
        )
        record["status"] = run_claude(["auth", "status"], env, work)
        stored = stored_credential(home)
        record["stored"] = {k: v for k, v in stored.items() if k not in ("jwt", "idpRefreshToken")}
        # the gateway revokes the sign-in (as an admin would), then a second prompt
        record["revoked"] = revoke(base, stored.get("jwt", ""))
        # Claude Code's own retries on: x-should-retry false must stop them
        retrying = {k: v for k, v in env.items() if k != "CLAUDE_CODE_MAX_RETRIES"}
        record["after_revoke"] = run_claude(
            ["-p", PROMPT, "--output-format", "json"], retrying, work
        )
        record["logout"] = run_claude(["auth", "logout"], env, work)
    finally:
        if gateway is not None:
            gateway.stop()
            record["access"] = access_lines(gateway.output())
        if collector is not None:
            collector.stop()
        stub.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        Path(out_path).write_text(json.dumps(record, indent=1))
    return 0


def _forwarded(collector: Collector) -> list[dict[str, Any]]:
    """The resources of Claude Code's OTLP the collector got (the gateway's own excluded)."""
    out = []
    for signal, lists in (
        ("metrics", "resource_metrics"),
        ("logs", "resource_logs"),
        ("traces", "resource_spans"),
    ):
        for message in collector.of(signal):
            for item in getattr(message, lists):
                attrs = {kv.key: value_of(kv.value) for kv in item.resource.attributes}
                if attrs.get("service.name") != "llm-gateway":
                    out.append({"signal": signal, **attrs})
    return out


def _telemetry_steps(env: dict[str, str], work: Path, collector: Collector) -> dict[str, Any]:
    """Signed in, no OpenTelemetry variable but the export intervals: whatever switches
    Claude Code's telemetry on and where it goes comes from the gateway's managed settings;
    its exports carry no header this script gave it."""
    quick = {
        **{k: v for k, v in env.items() if k != "DISABLE_TELEMETRY"},
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
        "OTEL_LOGS_EXPORT_INTERVAL": "200",
    }
    prompt = run_claude(
        ["-p", PROMPT, "--output-format", "json", "--no-session-persistence"], quick, work
    )
    deadline = time.monotonic() + 20  # the gateway forwards as it receives
    while time.monotonic() < deadline and not _forwarded(collector):
        time.sleep(0.2)
    return {
        "prompt": prompt,
        "forwarded": _forwarded(collector),
        "logout": run_claude(["auth", "logout"], env, work),
    }


if __name__ == "__main__":
    sys.exit(main())
