"""Claude Code itself (`claude -p`, npm @anthropic-ai/claude-code) through the gateway, offline.

Everything runs inside a loopback-only network namespace (`unshare -n`, needs root), so nothing
can leave the machine. Claude Code silently retries without streaming when a stream is
malformed, so a success only counts with exactly one streamed request per turn and no
non-streaming fallback; every request it sends must be accepted (no 4xx).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.clients]

REPO = Path(__file__).resolve().parents[2]
CLAUDE = REPO / "tests" / "clients" / "node_modules" / ".bin" / "claude"


def _run(tmp_path: Path, mode: str, prompt: str) -> dict:
    missing = []
    if not CLAUDE.exists():
        missing.append("Claude Code (cd tests/clients && npm install)")
    if os.geteuid() != 0 or not shutil.which("unshare"):
        missing.append("root and unshare, for a loopback-only network namespace")
    if missing:
        if os.environ.get("CI"):
            pytest.fail("; ".join(missing))
        pytest.skip("; ".join(missing))
    out = tmp_path / "cc.json"
    proc = subprocess.run(["unshare", "-n", sys.executable,
                           str(REPO / "tests" / "clients" / "claude_code_run.py"), str(out),
                           mode, prompt], capture_output=True, text=True, timeout=280)
    assert out.exists(), proc.stdout + proc.stderr
    return json.loads(out.read_text())


def _messages_posts(run: dict) -> list[dict]:
    return [a for a in run["access"] if a["route"] == "messages"]


@pytest.mark.llamacpp
def test_claude_code_one_turn_against_real_upstream(tmp_path, tiny_model) -> None:
    run = _run(tmp_path, "llama", "Say hi")
    result = run["result"]
    assert run["exit_code"] == 0, run
    assert result["is_error"] is False
    assert result["result"] == tiny_model[1]["answer"]
    assert result["usage"]["input_tokens"] > 0 and result["usage"]["output_tokens"] > 0
    posts = _messages_posts(run)
    assert all(a["status"] == 200 for a in posts), posts  # every request accepted
    streamed = [i for i, a in enumerate(posts) if a["stream"]]
    assert len(streamed) == 1 and posts[streamed[0]]["query"] == "beta=true"
    # a non-streaming request after the stream would be Claude Code's fallback
    assert all(a["stream"] for a in posts[streamed[0]:]), posts


def test_claude_code_tool_round_trip_in_full_mode(tmp_path) -> None:
    run = _run(tmp_path, "tool", "Read the file hello.txt and tell me what it says")
    assert run["exit_code"] == 0, run
    assert run["file_text"] in run["result"]["result"]
    posts = _messages_posts(run)
    assert all(a["status"] == 200 for a in posts), posts  # every request accepted
    assert [a["stream"] for a in posts] == [True, True]  # two turns, both streamed, no fallback
    first, second = (r["body"] for r in run["upstream_requests"])
    # Claude Code's full-mode request was translated: system turns, tools, streaming usage
    assert first["messages"][0]["role"] == "system"
    assert any(t["function"]["name"] == "Read" for t in first["tools"])
    assert first["stream"] is True and first["stream_options"]["include_usage"] is True
    assert "metadata" not in first and "context_management" not in first
    call = next(m for m in second["messages"] if m.get("tool_calls"))["tool_calls"][0]
    assert call["function"]["name"] == "Read"
    assert json.loads(call["function"]["arguments"]) == {"file_path": run["file_path"]}
    tool = next(m for m in second["messages"] if m["role"] == "tool")
    assert tool["tool_call_id"] == call["id"]
    assert run["file_text"] in json.dumps(tool["content"])
