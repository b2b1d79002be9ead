"""The real JavaScript clients the tests drive (``tests/clients``, installed with npm ci): the
TypeScript SDK scripts and Claude Code."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CLIENTS = Path(__file__).resolve().parent / "clients"


def ts_sdk_ready() -> None:
    """Skip (fail under CI) unless node and the TypeScript SDK are installed."""
    if shutil.which("node") and (CLIENTS / "node_modules" / "@anthropic-ai" / "sdk").is_dir():
        return
    message = "TypeScript SDK not installed: (cd tests/clients && npm ci)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def run_ts(base: str, model: str, mode: str = "ok") -> dict:
    """tests/clients/ts_sdk.mjs against ``base``: its last JSON line."""
    ts_sdk_ready()
    proc = subprocess.run(
        ["node", str(CLIENTS / "ts_sdk.mjs"), base, model, mode],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=CLIENTS,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout + proc.stderr
    return json.loads(lines[-1])  # type: ignore[no-any-return]


# --- Claude Code -------------------------------------------------------------------------

CLAUDE = CLIENTS / "node_modules" / ".bin" / "claude"


def need_claude_code(*more: str | None, demo: bool = False) -> None:
    """Skip (fail under CI) unless Claude Code, root and ``unshare`` (its loopback-only network
    namespace) are here, and with ``demo`` the demo extra; ``more``: what else a test found
    missing (None: present)."""
    missing = []
    if not CLAUDE.exists():
        missing.append("Claude Code (cd tests/clients && npm ci)")
    if os.geteuid() != 0 or not shutil.which("unshare"):
        missing.append("root and unshare, for a loopback-only network namespace")
    if demo:
        missing += [
            f"{m} (pip install '.[demo]')"
            for m in ("xllamacpp", "gguf", "numpy")
            if importlib.util.find_spec(m) is None
        ]
    missing += [m for m in more if m is not None]
    if missing:
        if os.environ.get("CI"):
            pytest.fail("; ".join(missing))
        pytest.skip("; ".join(missing))


def run_claude_code(tmp_path: Path, mode: str, prompt: str, timeout: float = 280) -> dict:
    """Claude Code (``claude -p``) driven by tests/clients/claude_code_run.py in ``mode``, in a
    loopback-only network namespace; -> the run's record (exit code, result, access lines,
    what Claude Code and the upstream were sent). Skips (fails under CI) without Claude Code,
    root or unshare."""
    need_claude_code()
    out = tmp_path / "cc.json"
    proc = subprocess.run(
        [
            "unshare",
            "-n",
            sys.executable,
            str(CLIENTS / "claude_code_run.py"),
            str(out),
            mode,
            prompt,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.exists(), proc.stdout + proc.stderr
    return json.loads(out.read_text())


def claude_code_posts(run: dict) -> list[dict]:
    """The run's access lines for /v1/messages."""
    return [a for a in run["access"] if a["route"] == "messages"]


def claude_code_sent(run: dict) -> list[dict]:
    """The bodies of Claude Code's own POST /v1/messages requests, in order."""
    return [
        r["body"]
        for r in run["client_requests"]
        if r["method"] == "POST" and r["path"].split("?")[0].endswith("/v1/messages")
    ]


def claude_code_brief(run: dict) -> dict:
    """A failed run, short enough to read in an assertion message."""
    return {
        "exit_code": run["exit_code"],
        "result": run["result"],
        "stderr": run["stderr"],
        "access": [(a["model"], a["status"], a["error"]) for a in run["access"]],
    }


def content_text(content: str | list[dict]) -> str:
    """An OpenAI message's content as text (a string, or a list of parts)."""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content)
