"""Claude Code in full mode against ``llm-gateway --demo``, exactly as the README says to run it.

Only ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_AUTH_TOKEN`` are set (and the variables that keep
Claude Code offline): no ``--bare``, its own tools, no model variable. Every request names Claude
Code's default model, which only the demo's ``claude-*`` route can answer, and carries its whole
system prompt and tool list: about 49 KB with tool search (its default), 78 KB with every tool
inline. The demo's slots hold 131,072 tokens, and its tokenizer makes about 14k and 23k tokens
of these; a byte-per-token tokenizer made 49k and 78k, and a 4,096-token slot refused them
("Prompt is too long").

Everything runs inside a loopback-only network namespace (``unshare -n``, needs root), so nothing
can leave the machine. The issue's targets: the first full-mode answer within 15 s, later turns
(llama.cpp's prompt cache holding the system prompt and tools) within a few seconds.

The demo model answers a turn that offers tools with a Bash call (``echo demo-tool-loop``,
written as text and parsed by the gateway): in the ``tool_loop`` run Claude Code may run it, and
its stream-json events show the call, the command's output and the text answer after it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.demo.tinymodel import ANSWER_TEXT
from gateway.demo.toolcall import BASH_ARGUMENTS
from tests.node import need_claude_code

pytestmark = [pytest.mark.e2e, pytest.mark.clients, pytest.mark.llamacpp, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
FIRST_TURN_SECONDS = 15  # a cold first answer (the README says 1-2 s on two cores)
LATER_TURN_SECONDS = 5


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    need_claude_code(demo=True)
    out = tmp_path_factory.mktemp("cc-demo") / "report.json"
    proc = subprocess.run(
        [
            "unshare",
            "-n",
            sys.executable,
            str(REPO / "tests" / "clients" / "claude_code_demo_run.py"),
            str(out),
            "Say hi",
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.exists(), proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    print("\nClaude Code full mode on --demo:", json.dumps(_figures(report)))
    return report


def _figures(report: dict) -> dict:
    figures = {"startup_s": report.get("startup_seconds"), "rss_kib": report.get("rss_kib")}
    for name, run in report["runs"].items():
        posts = [a for a in run["access"] if a["route"] == "messages"]
        figures[name] = {
            "claude_s": run["seconds"],
            "gateway_ms": [a["duration_ms"] for a in posts],
            "input_tokens": ((run["result"] or {}).get("usage") or {}).get("input_tokens"),
        }
    return figures


def _check_run(
    run: dict, *, min_input_tokens: int, max_seconds: float, min_cache_read: int = 0
) -> None:
    assert run["exit_code"] == 0, run
    result = run["result"]
    assert result["is_error"] is False, result
    assert result["result"] == ANSWER_TEXT
    posts = [a for a in run["access"] if a["route"] == "messages"]
    assert posts and all(a["status"] == 200 for a in posts), run["access"]
    assert all(a["model"] == "claude-*" for a in posts)  # the pattern route answered
    # the full-mode request: system prompt and tools (--bare with no tools is under 2k tokens);
    # the prompt is input_tokens plus what llama.cpp read from its cache, as the API counts
    usage = result["usage"]
    prompt = usage["input_tokens"] + (usage.get("cache_read_input_tokens") or 0)
    assert prompt >= min_input_tokens, usage
    assert (usage.get("cache_read_input_tokens") or 0) >= min_cache_read, usage
    assert run["seconds"] < max_seconds, run["seconds"]


def test_first_answer_from_a_cold_demo(demo_runs: dict) -> None:
    assert demo_runs["startup_seconds"] < 60
    _check_run(demo_runs["runs"]["first"], min_input_tokens=10_000, max_seconds=FIRST_TURN_SECONDS)


def test_every_tool_inline_fits_and_is_answered(demo_runs: dict) -> None:
    """ENABLE_TOOL_SEARCH=false: the 78 KB request the README's demo section measures."""
    _check_run(
        demo_runs["runs"]["all_tools"], min_input_tokens=20_000, max_seconds=FIRST_TURN_SECONDS
    )


@pytest.mark.parametrize("name", ["second", "continued"])
def test_later_turns_reuse_the_prompt_cache(demo_runs: dict, name: str) -> None:
    """A later turn's prompt is mostly llama.cpp's cached prefix, and Claude Code is told so
    (``cache_read_input_tokens``, from the upstream's ``cached_tokens``)."""
    _check_run(
        demo_runs["runs"][name],
        min_input_tokens=10_000,
        max_seconds=LATER_TURN_SECONDS,
        min_cache_read=5_000,
    )


def test_memory_stays_small(demo_runs: dict) -> None:
    rss = demo_runs["rss_kib"]
    assert 0 < rss["llama"] < 512 * 1024, rss  # two 131,072-token slots of the tiny model
    assert 0 < rss["gateway"] < 256 * 1024, rss


def _blocks(run: dict, event_type: str, block_type: str) -> list[dict]:
    return [
        block
        for event in run["events"]
        if event.get("type") == event_type
        for block in (event.get("message") or {}).get("content") or []
        if isinstance(block, dict) and block.get("type") == block_type
    ]


def test_claude_code_runs_the_demo_models_bash_call(demo_runs: dict) -> None:
    """The tool loop: the model's call, written as text (gateway/demo/toolcall.py), reaches Claude
    Code as a tool_use block, its Bash runs the command, and the reply to the result is text."""
    run = demo_runs["runs"]["tool_loop"]
    assert run["exit_code"] == 0, run
    uses = _blocks(run, "assistant", "tool_use")
    assert [(u["name"], u["input"]) for u in uses] == [("Bash", BASH_ARGUMENTS)], run["events"]
    results = _blocks(run, "user", "tool_result")
    assert len(results) == 1 and results[0]["tool_use_id"] == uses[0]["id"], results
    assert not results[0].get("is_error"), results
    output = results[0]["content"]
    if isinstance(output, list):
        output = "".join(part.get("text", "") for part in output)
    assert output.strip() == "demo-tool-loop"  # what `echo demo-tool-loop` printed
    result = run["result"]
    assert result["type"] == "result" and result["is_error"] is False, result
    assert result["result"] == ANSWER_TEXT and result["num_turns"] == 2, result
    posts = [a for a in run["access"] if a["route"] == "messages"]
    assert len(posts) == 2 and all(a["status"] == 200 for a in posts), run["access"]
    assert run["seconds"] < FIRST_TURN_SECONDS, run["seconds"]
    # every run's first request got a call (refused in the others), each parsed from text
    parsed = sum(
        value
        for labels, value in demo_runs["local_fixes"].items()
        if 'fix="text_tool_call"' in labels
    )
    assert parsed == len(demo_runs["runs"]), demo_runs["local_fixes"]
