"""Run Claude Code in full mode against ``llm-gateway --demo``, inside a loopback-only namespace.

    unshare -n python tests/clients/claude_code_demo_run.py OUT.json "Say hi"

Starts the real ``python -m gateway --demo --port P`` (the tiny model generated into a fresh
cache folder, so the timing includes it), then runs Claude Code the way the README says, with
nothing but ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_AUTH_TOKEN`` set (plus the variables that keep
it from phoning home): no ``--bare``, its default tools, no model variable, so every request
names Claude Code's own default model and reaches the demo through the ``claude-*`` route.
Four runs:

1. ``first``: ``claude -p PROMPT --output-format json --no-session-persistence`` against the
   freshly started gateway: llama.cpp's prompt cache is empty. Claude Code 2.1.332 defers most
   of its tools behind its ToolSearch tool by default (about 49 KB, 12 tools);
2. ``second``: a new session (persisted, so that it can go on), same prompt;
3. ``continued``: ``claude -p ... --continue``, the next turn of that session, its history
   included;
4. ``all_tools``: ``ENABLE_TOOL_SEARCH=false``, every tool inline (about 78 KB, 21 tools), a
   prompt that shares little with the cached ones past the system prompt;
5. ``tool_loop``: ``--allowedTools Bash --output-format stream-json --verbose``: the demo model
   calls Bash (``echo demo-tool-loop``, written as text and parsed by the gateway), Claude Code
   runs it and sends the result back, and the model answers in text. Every event is kept.

In the first four runs the model calls Bash too (it does whenever tools are offered and no tool
result has come back since the last answer), and Claude Code in print mode, not allowed to run
it, sends back a refusal as the tool's result; the reply after it is the canned answer.

Writes one JSON object to OUT.json: per run the exit code, Claude Code's JSON result, its wall
time and the gateway access lines it caused; the gateway's start-up time, the resident memory of
the gateway and of its llama.cpp child after the runs, and the gateway's token counters and
local-fix counters (``text_tool_call``: calls its text parser found).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.logs import access_lines  # noqa: E402
from tests.procs import Proc, free_port, wait_http  # noqa: E402

CLAUDE = REPO / "tests" / "clients" / "node_modules" / ".bin" / "claude"
QUIET = {  # keep Claude Code from phoning home or retrying
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_MAX_RETRIES": "0",
}


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _access(gateway: Proc) -> list[dict[str, Any]]:
    return access_lines(gateway.output())


def _new_access(gateway: Proc, seen: int) -> list[dict[str, Any]]:
    """Access lines after the first ``seen``: the gateway writes one once its reply is sent,
    which can be just after Claude Code has read the reply and exited. A run may make several
    requests (a tool call and the reply to its result), so this waits until a messages line
    has come and no new line for half a second."""
    deadline = time.monotonic() + 5
    lines = _access(gateway)[seen:]
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = _access(gateway)[seen:]
        if len(now) != len(lines):
            lines, quiet_since = now, time.monotonic()
        elif any(a["route"] == "messages" for a in lines) and time.monotonic() - quiet_since > 0.5:
            break
    return lines


def _claude(args: list[str], work: Path, env: dict[str, str]) -> dict[str, Any]:
    """One run; ``result`` is the last JSON line (the result event, in stream-json too)."""
    streamed = "stream-json" in args
    if not streamed:
        args = [*args, "--output-format", "json"]
    start = time.monotonic()
    proc = subprocess.run(
        [str(CLAUDE), *args], cwd=work, env=env, capture_output=True, text=True, timeout=120
    )
    seconds = time.monotonic() - start
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    run = {
        "exit_code": proc.returncode,
        "result": events[-1] if events else None,
        "seconds": round(seconds, 2),
        "stdout": proc.stdout[-2000:],
        "stderr": proc.stderr[-2000:],
    }
    if streamed:
        run["events"] = events
    return run


def _counters(base: str, name: str) -> dict[str, float]:
    with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    counters: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            counters[labels] = float(value)
    return counters


def main() -> int:
    out_path, prompt = sys.argv[1], sys.argv[2]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="cc-demo-"))
    home, work = tmp / "home", tmp / "work"
    home.mkdir()
    work.mkdir()
    port = free_port()
    start = time.monotonic()
    gateway = Proc(
        [sys.executable, "-m", "gateway", "--demo", "--port", str(port)],
        env={"XDG_CACHE_HOME": str(tmp / "cache")},
    )
    report: dict[str, Any] = {"runs": {}}
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=120, proc=gateway.popen)
        report["startup_seconds"] = round(time.monotonic() - start, 2)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}/llm",
            "ANTHROPIC_AUTH_TOKEN": "any-token",
            **QUIET,
        }
        runs = {
            "first": (["-p", prompt, "--no-session-persistence"], {}),
            "second": (["-p", prompt], {}),
            "continued": (["-p", prompt, "--continue"], {}),
            "all_tools": (
                ["-p", prompt, "--no-session-persistence"],
                {"ENABLE_TOOL_SEARCH": "false"},
            ),
            "tool_loop": (
                [
                    "-p",
                    prompt,
                    "--no-session-persistence",
                    "--allowedTools",
                    "Bash",
                    "--output-format",
                    "stream-json",
                    "--verbose",
                ],
                {},
            ),
        }
        for name, (args, extra) in runs.items():
            seen = len(_access(gateway))
            run = _claude(args, work, {**env, **extra})
            run["access"] = _new_access(gateway, seen)
            report["runs"][name] = run
        report["rss_kib"] = {
            "gateway": _rss_kib(gateway.pid),
            "llama": sum(_rss_kib(c) for c in _children(gateway.pid)),
        }
        report["token_counters"] = _counters(f"http://127.0.0.1:{port}", "llm_gateway_tokens_total")
        report["local_fixes"] = _counters(
            f"http://127.0.0.1:{port}", "llm_gateway_local_fixes_total"
        )
    finally:
        gateway.stop()
        report["gateway_log_tail"] = gateway.output()[-3000:]
        Path(out_path).write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
