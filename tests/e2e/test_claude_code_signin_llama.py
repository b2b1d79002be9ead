"""Issue 35's done-when with the real Claude Code 2.1.332 and a real llama.cpp engine.

tests/clients/claude_signin_llama_run.py (in a loopback-only network namespace): Claude Code
signs in to the gateway over https (a private CA, ``NODE_EXTRA_CA_CERTS``), fetches its
managed settings, runs two turns of one session with a tool call each (``-p``, then
``--continue``) on llama.cpp's tiny demo model with 32,768 tokens a slot, and reports that
window as its own; then the sign-in is revoked and the next request is refused at once.

Nothing in Claude Code's environment names a model or a window: the model id, the window
(``CLAUDE_CODE_MAX_CONTEXT_TOKENS``) and the output cap come from ``/managed/settings``,
which the gateway fills from the engine's ``/props``. Without them Claude Code would send
its own default model (no route here) and assume a window of 1M for an id it does not know.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gateway.demo.tinymodel import ANSWER_TEXT
from gateway.demo.toolcall import BASH_ARGUMENTS
from tests.node import CLIENTS, need_claude_code

pytestmark = [pytest.mark.e2e, pytest.mark.clients, pytest.mark.llamacpp, pytest.mark.timeout(500)]

MODEL = "claude-local-demo"
SLOT_CONTEXT = 32_768  # the runner's llama.cpp: 65,536 tokens over 2 slots


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    need_claude_code(demo=True)
    out = tmp_path_factory.mktemp("cc-signin-llama") / "run.json"
    proc = subprocess.run(
        ["unshare", "-n", sys.executable, str(CLIENTS / "claude_signin_llama_run.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=480,
    )
    assert out.exists(), proc.stdout + proc.stderr
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def _routes(run: dict) -> list[tuple[str, int]]:
    return [(a["route"], a["status"]) for a in run["access"]]


def test_the_gateway_read_the_engines_window_and_pushes_it(run: dict) -> None:
    assert run["slot_context"] == SLOT_CONTEXT
    assert (run["model"]["id"], run["model"]["max_input_tokens"]) == (MODEL, SLOT_CONTEXT)
    env = run["settings"]["settings"]["env"]
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == str(SLOT_CONTEXT)
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "4096"
    assert env["ANTHROPIC_MODEL"] == MODEL


def test_claude_code_signs_in_over_https_and_fetches_its_settings(run: dict) -> None:
    login = run["login"]
    assert login["exit_code"] == 0, login
    states = [m["state"] for m in login["lines"] if isinstance(m, dict) and "state" in m]
    assert states[-1] == "done" and "trust_prompt" in states, states
    assert login["page"] == {"status": 200, "approved": True}
    routes = _routes(run)
    signed_in = routes.index(("oauth_token", 200))
    # Claude Code's own fetches of its policy, on the sign-in's token (this script's one came
    # before the sign-in, with the client key)
    assert routes[signed_in:].count(("managed_settings", 200)) >= 2, routes


@pytest.mark.parametrize("turn", [0, 1], ids=["first", "continued"])
def test_a_turn_calls_a_tool_and_reports_the_engines_window(run: dict, turn: int) -> None:
    step = run["turns"][turn]
    result = step["result"]
    assert step["exit_code"] == 0 and result["is_error"] is False, step["stderr"]
    assert result["result"] == ANSWER_TEXT
    # the model (pushed in the settings) called Bash, Claude Code ran it and sent the result
    calls = [
        block
        for e in step["events"]
        if e["type"] == "assistant"
        for block in e["message"]["content"]
        if block["type"] == "tool_use"
    ]
    assert [(c["name"], c["input"]) for c in calls] == [("Bash", BASH_ARGUMENTS)]
    results = [
        block
        for e in step["events"]
        if e["type"] == "user"
        for block in e["message"]["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]
    assert [(r["tool_use_id"], r["is_error"]) for r in results] == [(calls[0]["id"], False)]
    # the measure: the window Claude Code works with is the engine's, not 200k or 1M
    assert list(result["modelUsage"]) == [MODEL]
    assert result["modelUsage"][MODEL]["contextWindow"] == SLOT_CONTEXT


def test_the_second_turn_goes_on_with_the_same_session(run: dict) -> None:
    first, second = (t["result"] for t in run["turns"])
    assert second["session_id"] == first["session_id"]
    # its prompt holds the first turn: more input than the first turn's
    assert second["modelUsage"][MODEL]["inputTokens"] > first["modelUsage"][MODEL]["inputTokens"]
    posts = [(a["route"], a["status"]) for a in run["access"] if a["route"] == "messages"]
    assert posts[:4] == [("messages", 200)] * 4  # a tool call and an answer, twice


def test_a_revoked_sign_in_is_refused_at_once(run: dict) -> None:
    assert run["revoked"] == 200
    routes = _routes(run)
    after = routes[routes.index(("oauth_revoke", 200)) + 1 :]
    # Claude Code's first request after it (its settings poll) is refused, and it stops: no
    # retry, no refresh, no Messages request let through; the last one is this script's own
    assert after == [("managed_settings", 401), ("messages", 401)], after
    refused = run["after_revoke"]
    assert refused["exit_code"] != 0
    assert "sign in again" in (refused["result"] or {}).get("result", "") + refused["stderr"]
    assert run["direct"] == {
        "status": 401,
        "x_should_retry": "false",
        "error_type": "authentication_error",
    }
