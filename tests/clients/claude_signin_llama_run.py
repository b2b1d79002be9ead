"""Issue 35's done-when, in one run: Claude Code signs in to the gateway over https, gets its
managed settings, runs a two-turn session with tools on a real llama.cpp engine, reports the
engine's window as its own, and is refused at once when its sign-in is revoked.

    unshare -n python tests/clients/claude_signin_llama_run.py OUT.json

Everything inside a loopback-only network namespace (``unshare -n``, root):

* a real llama.cpp server (the tiny demo model) with 65,536 tokens over 2 slots, so one
  request may use 32,768 (``n_ctx`` per slot in ``/props``), a window Claude Code does not
  assume for any model;
* the gateway over https (a throwaway CA from tests/certs.py; ``NODE_EXTRA_CA_CERTS`` for
  Claude Code), ``[auth]`` on, one client ``dev``, one model ``claude-local-demo`` with no
  ``context_window`` in the config: the gateway reads the engine's, and pushes it as
  ``CLAUDE_CODE_MAX_CONTEXT_TOKENS`` (and the model names) in ``/managed/settings``;
* ``claude auth login --gateway-json`` (tests/clients/claude_signin_run.py answers its
  questions and approves the code with ``dev``'s key); no model and no window in Claude
  Code's environment: both come from the gateway;
* ``claude -p "Say hi" --allowedTools Bash --output-format stream-json --verbose``: the demo
  model calls Bash (``echo demo-tool-loop``, written as text, parsed by the gateway), Claude
  Code runs it and sends the result back, the model answers; then the same with ``--continue``
  (the second turn of the session, the first in its history);
* the gateway revokes the stored access token; one more ``claude -p --continue`` (Claude
  Code's own retries on) is refused at once; a request of this script with the revoked token
  shows the refusal's status and headers.

Writes one JSON object to OUT.json: the login, the window the gateway learnt (``/v1/models``),
the settings document, both turns (their stream-json events), the refused run, the direct
refusal (status, ``x-should-retry``, error type) and the gateway's access lines.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests import certs  # noqa: E402
from tests.clients.claude_signin_run import (  # noqa: E402
    DEV_KEY,
    login,
    revoke,
    run_claude,
    stored_credential,
)
from tests.logs import access_lines  # noqa: E402
from tests.procs import Proc, free_port, get, post, wait_http  # noqa: E402

MODEL = "claude-local-demo"
SLOT_CONTEXT = 32_768  # tokens per slot
SLOTS = 2
PROMPT = "Say hi"


def _config(llama_url: str, leaf: certs.Leaf, ops_port: int, database: Path) -> str:
    return f"""
[server]
host = "127.0.0.1"
port = 8080
prefix = "/llm"
metrics_port = {ops_port}
tls_cert_file = "{leaf.cert}"
tls_key_file = "{leaf.key}"

[upstreams.llama]
base_url = "{llama_url}"
kind = "llamacpp"

[[models]]
name = "{MODEL}"
upstream = "llama"
upstream_model = "demo"
claude_code_tier = "sonnet"

[[clients]]
name = "dev"
key_env = "DEV_KEY"

[batches]
database = {json.dumps(str(database))}

[auth]
enabled = true
poll_seconds = 1
"""


def _learnt_window(base: str) -> dict[str, Any]:
    """``/v1/models``' entry once the gateway has read the engine's window (bounded wait)."""
    headers = {"x-api-key": DEV_KEY, "anthropic-version": "2023-06-01"}
    deadline = time.monotonic() + 30
    model: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status, _, body = get(f"{base}/llm/v1/models", headers)
        if status == 200:
            model = json.loads(body)["data"][0]
            if model.get("max_input_tokens"):
                break
        time.sleep(0.2)
    return model


def _refusal(base: str, token: str) -> dict[str, Any]:
    """One Messages request of this script with the revoked access token."""
    status, headers, body = post(
        f"{base}/llm/v1/messages",
        {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        {"Authorization": f"Bearer {token}", "anthropic-version": "2023-06-01"},
    )
    error = json.loads(body).get("error", {}) if body.startswith(b"{") else {}
    return {
        "status": status,
        "x_should_retry": headers.get("x-should-retry"),
        "error_type": error.get("type"),
    }


def main() -> int:
    out_path = sys.argv[1]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    from gateway.demo.llama import LlamaServer
    from gateway.demo.tinymodel import ensure_model

    tmp = Path(tempfile.mkdtemp(prefix="cc-signin-llama-"))
    home, work = tmp / "home", tmp / "work"
    (home / ".claude").mkdir(parents=True)
    work.mkdir()
    ca = certs.make_ca(tmp / "pki")
    leaf = certs.make_leaf(tmp / "pki")
    # this script's own https requests (the page's approval, the revocation) trust the CA
    context = ssl.create_default_context(cafile=str(ca))
    urllib.request.install_opener(
        urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
    )
    model_path, _ = ensure_model(str(tmp / "model"))
    llama = LlamaServer(
        model_path, ctx_size=SLOT_CONTEXT * SLOTS, parallel=SLOTS, threads=1, alias="demo"
    )
    record: dict[str, Any] = {"slot_context": SLOT_CONTEXT}
    gateway = None
    try:
        llama_url = llama.start(timeout=60)
        port, ops_port = free_port(), free_port()
        cfg = tmp / "gateway.toml"
        cfg.write_text(_config(llama_url, leaf, ops_port, tmp / "gw.sqlite3"))
        gateway = Proc(
            [sys.executable, "-m", "gateway", "--config", str(cfg), "--port", str(port)],
            env={"STATE_DIRECTORY": str(tmp / "state"), "DEV_KEY": DEV_KEY},
        )
        wait_http(f"http://127.0.0.1:{ops_port}/health", proc=gateway.popen)
        base = f"https://127.0.0.1:{port}"
        record["model"] = _learnt_window(base)
        _, _, body = get(f"{base}/llm/managed/settings", {"Authorization": f"Bearer {DEV_KEY}"})
        record["settings"] = json.loads(body)
        (home / ".claude" / "settings.json").write_text(
            json.dumps({"forceLoginMethod": "gateway", "forceLoginGatewayUrl": f"{base}/llm"})
        )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "NODE_EXTRA_CA_CERTS": str(ca),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_MAX_RETRIES": "0",
        }
        record["login"] = login(env, work, base)
        turn = ["--allowedTools", "Bash", "--output-format", "stream-json", "--verbose"]
        record["turns"] = [
            run_claude(["-p", PROMPT, *turn], env, work, timeout=150),
            run_claude(["-p", "Go on", "--continue", *turn], env, work, timeout=150),
        ]
        token = stored_credential(home).get("jwt", "")
        record["revoked"] = revoke(base, token)
        retrying = {k: v for k, v in env.items() if k != "CLAUDE_CODE_MAX_RETRIES"}
        record["after_revoke"] = run_claude(
            ["-p", "And then?", "--continue", "--output-format", "json"], retrying, work
        )
        record["direct"] = _refusal(base, token)
    finally:
        if gateway is not None:
            gateway.stop()
            record["access"] = access_lines(gateway.output())
        llama.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    Path(out_path).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
