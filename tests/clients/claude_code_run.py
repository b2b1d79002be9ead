"""Run Claude Code (`claude -p`) against the gateway, inside a loopback-only network namespace.

    unshare -n python tests/clients/claude_code_run.py OUT.json llama "Say hi"
    unshare -n python tests/clients/claude_code_run.py OUT.json tool  "Read hello.txt"

``llama``: the gateway in front of a real llama.cpp server with the tiny model, Claude Code in
``--bare`` mode with no tools. ``tool``: the gateway in front of the scripted stub, which asks
for the ``Read`` tool on a file in Claude Code's working directory and then answers with the
file's text; Claude Code runs in its full (non-bare) mode, so its requests carry its usual
``role: "system"`` turns, thinking, context_management, output_config, metadata and
cache_control. Writes one JSON object to OUT.json: exit code, Claude Code's JSON result, the
gateway's access-log lines and (``tool``) the requests the stub received.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.conftest import llama_config, stub_config  # noqa: E402
from tests.procs import Proc, free_port, start_gateway, wait_http  # noqa: E402

CLAUDE = REPO / "tests" / "clients" / "node_modules" / ".bin" / "claude"
FILE_TEXT = "hello from the file 42"


def main() -> int:
    out_path, mode, prompt = sys.argv[1], sys.argv[2], sys.argv[3]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="cc-"))
    home, work = tmp / "home", tmp / "work"
    home.mkdir()
    work.mkdir()
    stopper = []
    stub_url = None
    if mode == "llama":
        from gateway.demo.llama import LlamaServer
        from gateway.demo.tinymodel import ensure_model

        model_path, _ = ensure_model(str(tmp / "model"))
        llama = LlamaServer(model_path, ctx_size=16384, parallel=1, threads=1, alias="demo")
        cfg = llama_config(llama.start(timeout=60), name="tiny-demo")
        stopper.append(llama.stop)
        args = ["--bare", "--tools", ""]
    else:
        (work / "hello.txt").write_text(FILE_TEXT + "\n")
        port = free_port()
        stub = Proc([sys.executable, str(REPO / "tests" / "stub_upstream.py"), str(port)])
        stopper.append(stub.stop)
        wait_http(f"http://127.0.0.1:{port}/health")
        stub_url = f"http://127.0.0.1:{port}"
        cfg = stub_config(stub_url + "/v1", models=(f"cc-tool:{work / 'hello.txt'}",))
        cfg = cfg.replace(f'name = "m-cc-tool:{work / "hello.txt"}"', 'name = "tiny-demo"')
        args = ["--allowedTools", "Read", "--max-turns", "3"]
    gateway, url = start_gateway(cfg, tmp)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": url + "/llm",
        "ANTHROPIC_API_KEY": "test-key",
        "ANTHROPIC_MODEL": "tiny-demo",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
    }
    seen = None
    try:
        proc = subprocess.run(
            [str(CLAUDE), "-p", prompt, *args, "--output-format", "json",
             "--no-session-persistence"],
            cwd=work, env=env, capture_output=True, text=True, timeout=150,
        )
        result = None
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                result = json.loads(line)
        if stub_url:
            with urllib.request.urlopen(stub_url + "/_requests", timeout=5) as resp:
                seen = json.loads(resp.read())
    finally:
        gateway.stop()
        for stop in stopper:
            stop()
    access = [json.loads(ln) for ln in gateway.output().splitlines()
              if ln.startswith("{") and '"access"' in ln]
    Path(out_path).write_text(json.dumps({
        "exit_code": proc.returncode, "result": result, "stdout": proc.stdout[-2000:],
        "stderr": proc.stderr[-2000:], "access": access, "upstream_requests": seen,
        "file_path": str(work / "hello.txt"), "file_text": FILE_TEXT,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
