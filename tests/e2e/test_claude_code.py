"""Claude Code itself (`claude -p`, npm @anthropic-ai/claude-code) through the gateway, offline.

Everything runs inside a loopback-only network namespace (`unshare -n`, needs root), so nothing
can leave the machine. Claude Code silently retries without streaming when a stream is
malformed, so a success only counts with exactly one streamed request per turn and no
non-streaming fallback; every request it sends must be accepted (no 4xx), except where a test
says which one is refused and why.

The tool loops run Claude Code 2.1.332 in its full mode (its own tools and subagents) against
the scripted stub (tests/clients/claude_code_run.py says what each mode scripts); the runner
records what Claude Code sent (``client_requests``), so the tests check Claude Code's own
model names, thinking config and tools, not only what reached the upstream.
"""

from __future__ import annotations

import base64
import json
import re

import pytest

from tests.node import (
    claude_code_brief,
    claude_code_posts,
    claude_code_sent,
    content_text,
    run_claude_code,
)

pytestmark = [pytest.mark.e2e, pytest.mark.clients]


@pytest.mark.llamacpp
def test_claude_code_one_turn_against_real_upstream(tmp_path, tiny_model) -> None:
    run = run_claude_code(tmp_path, "llama", "Say hi")
    result = run["result"]
    assert run["exit_code"] == 0, run
    assert result["is_error"] is False
    assert result["result"] == tiny_model[1]["answer"]
    assert result["usage"]["input_tokens"] > 0 and result["usage"]["output_tokens"] > 0
    posts = claude_code_posts(run)
    assert all(a["status"] == 200 for a in posts), posts  # every request accepted
    streamed = [i for i, a in enumerate(posts) if a["stream"]]
    assert len(streamed) == 1 and posts[streamed[0]]["query"] == "beta"  # names only
    # a non-streaming request after the stream would be Claude Code's fallback
    assert all(a["stream"] for a in posts[streamed[0] :]), posts


@pytest.mark.llamacpp
def test_claude_code_resumed_session_reads_its_prompt_from_the_engine_cache(
    tmp_path, tiny_model
) -> None:
    """Issue 35: a resumed session (``--continue``) must not re-prefill its whole prompt. A
    full Claude Code session (its tools and system prompt, ~23k tokens of the tiny model) on a
    real llama.cpp, then ``Go on`` resumed: the resumed step's prompt comes from the engine's
    cache but for the new exchange (measured with 2.1.197, ``CLAUDE_CODE_BIN``: 365 tokens
    prefilled, 45,810 read from the cache; the installed 2.1.332 by default)."""
    run = run_claude_code(tmp_path, "llama-resume", "Say hi", timeout=600)
    steps = run["steps"]
    assert [s["exit_code"] for s in steps] == [0, 0], claude_code_brief(run)
    first, resumed = (s["result"]["usage"] for s in steps)
    assert first["input_tokens"] > 10_000, first  # the whole prompt, prefilled once
    assert resumed["cache_read_input_tokens"] >= first["input_tokens"], resumed
    assert resumed["input_tokens"] < first["input_tokens"] // 10, (first, resumed)


def test_claude_code_tool_round_trip_in_full_mode(tmp_path) -> None:
    run = run_claude_code(tmp_path, "tool", "Read the file hello.txt and tell me what it says")
    assert run["exit_code"] == 0, run
    assert run["file_text"] in run["result"]["result"]
    posts = claude_code_posts(run)
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


def test_claude_code_explore_subagent_with_only_anthropic_model(tmp_path) -> None:
    """Only ``ANTHROPIC_MODEL`` set: a subagent's tier is a name Claude Code was never told.

    In 2.1.332 the built-in Explore agent inherits the parent's model (``model: "inherit"``,
    2.1.197 used haiku), but the Agent tool lets the model pick a tier (``model``: sonnet /
    opus / haiku / fable), and with no ``ANTHROPIC_DEFAULT_HAIKU_MODEL`` Claude Code sends its
    own haiku id (``claude-haiku-5-5`` in 2.1.332). Only a ``claude-*`` pattern route serves it.
    """
    run = run_claude_code(
        tmp_path, "explore", "Use an Explore agent to find out what hello.txt says"
    )
    assert run["exit_code"] == 0, claude_code_brief(run)
    assert run["file_text"] in run["result"]["result"]  # the subagent's report came back
    posts = claude_code_posts(run)
    assert posts and all(a["status"] == 200 for a in posts), posts
    sent = claude_code_sent(run)
    call = next(
        b
        for m in sent[-1]["messages"]
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] == "tool_use"
    )
    assert call["name"] == "Agent" and call["input"]["subagent_type"] == "Explore"
    sub = [b for b in sent if b["model"] != "tiny-demo"]
    assert sub and all(b["model"].startswith("claude-haiku-") for b in sub), [
        b["model"] for b in sent
    ]
    assert all("file search specialist" in json.dumps(b["system"]) for b in sub)
    # the access log names the configured route, so the haiku requests went through claude-*
    assert sorted(a["model"] for a in posts) == sorted(
        "claude-*" if b in sub else "tiny-demo" for b in sent
    )
    # the subagent's Read loop ran on the upstream the claude-* route names
    upstream = [r["body"] for r in run["upstream_requests"]]
    assert [b["model"].startswith("cc-tool:") for b in upstream] == [b in sub for b in sent]
    report = next(m for m in upstream[-1]["messages"] if m["role"] == "tool")
    assert report["tool_call_id"] == call["id"]
    assert run["file_text"] in content_text(report["content"])


def test_claude_code_with_no_model_variables(tmp_path) -> None:
    """No ``ANTHROPIC_MODEL`` nor ``ANTHROPIC_DEFAULT_*``: every request names Claude Code's own
    default (``claude-opus-5-5`` in 2.1.332), which a ``claude-*`` route serves."""
    run = run_claude_code(tmp_path, "no-model", "Read the file hello.txt and tell me what it says")
    assert run["exit_code"] == 0, claude_code_brief(run)
    assert run["file_text"] in run["result"]["result"]
    posts = claude_code_posts(run)
    assert [(a["status"], a["stream"], a["model"]) for a in posts] == [(200, True, "claude-*")] * 2
    models = {b["model"] for b in claude_code_sent(run)}
    assert len(models) == 1 and models.pop().startswith("claude-opus-")
    assert all(r["body"]["model"].startswith("cc-tool:") for r in run["upstream_requests"])


def test_claude_code_web_search_is_refused_and_the_session_goes_on(tmp_path) -> None:
    """WebSearch runs as a side request whose only tool is the ``web_search_20250305`` server
    tool. The gateway cannot run it, so it answers 400 naming ``tools.0`` instead of letting the
    model invent search results; Claude Code hands the error to the model as the tool's result
    (``is_error``) and the session goes on."""
    run = run_claude_code(tmp_path, "websearch", "Search the web for the gateway's release notes")
    assert run["exit_code"] == 0, claude_code_brief(run)
    assert run["result"]["is_error"] is False
    sent, posts = claude_code_sent(run), claude_code_posts(run)
    side = [
        b for b in sent if [t.get("type") for t in b.get("tools", [])] == ["web_search_20250305"]
    ]
    assert side, [[t.get("type", t.get("name")) for t in b.get("tools", [])] for b in sent]
    refused = [a for a in posts if a["status"] != 200]
    assert len(refused) == len(side) and len(posts) == len(sent), posts  # only the side ones
    for a in refused:
        assert a["status"] == 400 and a["error_type"] == "invalid_request_error", a
        assert a["error"].startswith("tools.0"), a
    # nothing of the side request reached the upstream: no server tool, not its prompt
    upstream = [r["body"] for r in run["upstream_requests"]]
    assert len(upstream) == len(sent) - len(side)
    for body in upstream:
        assert all(
            t["type"] == "function" and t["function"]["name"] != "web_search" for t in body["tools"]
        )
        assert "Perform a web search" not in json.dumps(body["messages"])
    # 2.1.332 sends a tool marked defer_loading ("DeferredToolPlaceholder", never to be
    # called): no tool_reference loads it, so the engine is never offered it
    # called), and WebSearch deferred too: each is offered only once a tool_reference in the
    # conversation loaded it (ToolSearch's result loads WebSearch)
    for body, up in zip([b for b in sent if b not in side], upstream, strict=True):
        deferred = {t["name"] for t in body["tools"] if t.get("defer_loading") is True}
        loaded = set(re.findall(r'"tool_name": "([^"]+)"', json.dumps(body["messages"])))
        offered = {t["function"]["name"] for t in up["tools"]}
        assert "DeferredToolPlaceholder" in deferred - offered, (deferred, offered)
        assert deferred & offered == deferred & loaded, (deferred, loaded, offered)
    assert "WebSearch" in offered  # the last request: ToolSearch had loaded it
    assert all("defer_loading" not in t["function"] for b in upstream for t in b["tools"])
    # Claude Code passed the refusal to the model as WebSearch's result; the stub answered
    result = next(b for b in sent[-1]["messages"][-1]["content"] if b["type"] == "tool_result")
    assert result["is_error"] is True and "tools.0" in json.dumps(result["content"])
    tool = upstream[-1]["messages"][-1]
    assert tool["role"] == "tool" and tool["tool_call_id"] == result["tool_use_id"]
    told = content_text(tool["content"])
    assert "server tool" in told and "tools.0" in told
    assert run["result"]["result"] == "The tool said: " + content_text(tool["content"])


def test_claude_code_reads_a_pdf(tmp_path) -> None:
    """Claude Code's Read of a PDF puts a base64 ``application/pdf`` document into the
    tool_result; the upstream gets the PDF's text with page markers, never the bytes."""
    run = run_claude_code(tmp_path, "pdf", "Read doc.pdf and tell me what it says")
    assert run["exit_code"] == 0, claude_code_brief(run)
    posts = claude_code_posts(run)
    assert [(a["status"], a["stream"]) for a in posts] == [(200, True)] * 2, posts
    result = next(
        b
        for b in claude_code_sent(run)[-1]["messages"][-1]["content"]
        if b["type"] == "tool_result"
    )
    doc = next(b for b in result["content"] if b["type"] == "document")
    assert doc["source"]["media_type"] == "application/pdf"
    assert base64.b64decode(doc["source"]["data"]).startswith(b"%PDF-")
    tool = run["upstream_requests"][-1]["body"]["messages"][-1]
    assert tool["role"] == "tool" and tool["tool_call_id"] == result["tool_use_id"]
    text = content_text(tool["content"])
    assert "--- Page 1 of 1 ---\n" + "\n".join(run["pdf_lines"]) in text
    assert doc["source"]["data"][:40] not in run["upstream_requests"][-1]["raw"]
    assert run["pdf_lines"][0] in run["result"]["result"]


@pytest.mark.parametrize(("mode", "display"), [("think", "omitted"), ("think-updates", "updates")])
def test_claude_code_thinking_tool_loop_keeps_the_reasoning(
    tmp_path, mode: str, display: str
) -> None:
    """Claude Code 2.1.332 asks for adaptive thinking with ``display: "omitted"`` (``"updates"``
    when its connector-text experiment is on; forced here through ``CLAUDE_CODE_EXTRA_BODY``),
    gets empty signed thinking blocks and replays them as ``{"thinking": "", "signature"}``. The
    signature carries the reasoning sealed, so the upstream gets turn 1's reasoning back."""
    run = run_claude_code(tmp_path, mode, "Read the file hello.txt and tell me what it says")
    assert run["exit_code"] == 0, claude_code_brief(run)
    assert run["file_text"] in run["result"]["result"]
    posts = claude_code_posts(run)
    assert [(a["status"], a["stream"]) for a in posts] == [(200, True)] * 2, posts
    first, second = claude_code_sent(run)
    assert first["thinking"] == {"type": "adaptive", "display": display}
    replayed = next(m for m in second["messages"] if m["role"] == "assistant")["content"]
    assert replayed[0]["type"] == "thinking" and replayed[0]["thinking"] == ""
    assert replayed[0]["signature"] and replayed[1]["type"] == "tool_use"
    assistant = next(
        m for m in run["upstream_requests"][1]["body"]["messages"] if m["role"] == "assistant"
    )
    assert assistant.get("reasoning_content", "").startswith("REASONING_1"), assistant
    assert assistant["tool_calls"][0]["function"]["name"] == "Read"


# --- local engines without their parsers, and sessions (/compact, --continue) ---------------

READ_PROMPT = "Read the file hello.txt and tell me what it says"


def _read_round_trip(run: dict) -> None:
    """Checks a two-turn Read loop that Claude Code ran: every request accepted and streamed,
    Read called with hello.txt's path, its text sent upstream."""
    assert run["exit_code"] == 0, claude_code_brief(run)
    assert run["result"]["is_error"] is False
    assert run["file_text"] in run["result"]["result"]
    posts = claude_code_posts(run)
    assert [(a["status"], a["stream"]) for a in posts] == [(200, True)] * 2, posts
    sent = claude_code_sent(run)
    assert len(sent) == 2
    call = next(
        b
        for m in sent[1]["messages"]
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] == "tool_use"
    )
    assert call["name"] == "Read" and call["input"] == {"file_path": run["file_path"]}, call
    result = next(b for b in sent[1]["messages"][-1]["content"] if b["type"] == "tool_result")
    assert result["tool_use_id"] == call["id"] and not result.get("is_error"), result
    second = run["upstream_requests"][1]["body"]
    upcall = next(m for m in second["messages"] if m.get("tool_calls"))["tool_calls"][0]
    assert upcall["function"]["name"] == "Read"
    assert json.loads(upcall["function"]["arguments"]) == {"file_path": run["file_path"]}
    tool = next(m for m in second["messages"] if m["role"] == "tool")
    assert tool["tool_call_id"] == upcall["id"]
    assert run["file_text"] in content_text(tool["content"])


def test_claude_code_runs_a_tool_call_written_as_text(tmp_path) -> None:
    """An engine without its tool parser: the Read call arrives as Hermes text in content
    (``<tool_call>{...}</tool_call>``, finish "stop", no ``tool_calls``), in 7-character
    chunks that split the tags. Claude Code gets a tool_use block, runs Read, and the text
    before the call stays a text block."""
    run = run_claude_code(tmp_path, "text-tool", READ_PROMPT)
    _read_round_trip(run)
    assistant = next(m for m in claude_code_sent(run)[1]["messages"] if m["role"] == "assistant")
    texts = [b["text"] for b in assistant["content"] if b["type"] == "text"]
    # the newline before the call goes with it (gateway/local/normalise.py), whatever the split
    assert texts == ["I'll read it."], assistant["content"]
    assert "<tool_call>" not in json.dumps(claude_code_sent(run)[1]), assistant["content"]


def test_claude_code_runs_a_tool_call_with_broken_arguments(tmp_path) -> None:
    """A real ``tool_calls`` Read whose arguments are ``{'file_path': '<path>',}`` (Python
    quotes, trailing comma), streamed in 5 pieces: repaired into the JSON object Claude Code
    executes."""
    _read_round_trip(run_claude_code(tmp_path, "broken-args", READ_PROMPT))


def test_claude_code_inline_think_never_shows_the_tag(tmp_path) -> None:
    """``<think>...</think>`` in content before each turn (an engine without its reasoning
    parser). Claude Code asks for adaptive thinking with ``display: "omitted"``: the
    reasoning becomes a signed thinking block, never ``<think>`` text in the result or
    history; the Read call after it (written as text) still runs."""
    run = run_claude_code(tmp_path, "inline-think", READ_PROMPT)
    _read_round_trip(run)
    first, second = claude_code_sent(run)
    assert first["thinking"] == {"type": "adaptive", "display": "omitted"}
    assert "<think>" not in run["result"]["result"] and "</think>" not in run["result"]["result"]
    assert run["result"]["result"].startswith("The file says: ")
    assistant = next(m for m in second["messages"] if m["role"] == "assistant")["content"]
    assert [b["type"] for b in assistant] == ["thinking", "text", "tool_use"], assistant
    assert assistant[0]["thinking"] == "" and assistant[0]["signature"]
    assert "think>" not in json.dumps(second["messages"])
    # the sealed reasoning went back upstream as reasoning, not as content
    upstream = next(
        m for m in run["upstream_requests"][1]["body"]["messages"] if m["role"] == "assistant"
    )
    assert "I should read the file." in upstream.get("reasoning_content", ""), upstream
    assert "think>" not in json.dumps(upstream.get("content"))


def _is_control_entry(turn: dict) -> bool:
    return turn["role"] == "system" and turn["content"] == [] and bool(turn.get("output_config"))


@pytest.mark.parametrize("mode", ["compact", "compact-effort", "compact-bare"])
def test_claude_code_session_with_compact_and_continue(tmp_path, mode: str) -> None:
    """A persisted session: a first ``claude -p``, then ``/compact`` and another turn, both
    with ``--continue``. Every request of the session is accepted (no 400).

    What 2.1.332 sends for the custom model name ``tiny-demo`` (read from its code and seen
    here): per-turn ``output_config`` and the beta ``per-turn-control-2026-07-01`` only for a
    model with the ``per_turn_effort`` capability (``CLAUDE_CODE_MODEL_CAPABILITIES``):
    ``compact`` has neither; ``compact-effort`` (full mode) puts ``output_config`` on its
    ``role: "system"`` turns, which carry text; ``compact-bare`` (``--bare``, no system turn
    of its own) sends it as a control entry ``{"role":"system","content":[],
    "output_config":{"effort":...}}`` right after the user turn it belongs to, on every
    request, the compaction's and the compacted session's too."""
    run = run_claude_code(tmp_path, mode, "Say hello", timeout=400)
    steps = run["steps"]
    assert [s["exit_code"] for s in steps] == [0, 0, 0], claude_code_brief(run)
    assert all(s["result"]["is_error"] is False for s in steps), steps
    posts, sent = claude_code_posts(run), claude_code_sent(run)
    assert posts and all(a["status"] == 200 for a in posts), posts
    assert len(posts) == len(sent) == len(run["upstream_requests"]), posts
    # one compaction request, then the next turn goes on from its summary
    compaction = [
        b for b in sent if "CRITICAL: Respond with TEXT ONLY" in json.dumps(b["messages"][-1])
    ]
    assert len(compaction) == 1, [json.dumps(b["messages"][-1])[:80] for b in sent]
    last = sent[-1]["messages"]
    assert "This session is being continued" in json.dumps(last[0])
    assert "Summary " in json.dumps(last[0]) and "Go on" in json.dumps(last)
    assert steps[2]["result"]["result"].startswith("Reply 1: ")
    betas = [
        r["beta"]
        for r in run["client_requests"]
        if r["path"].split("?")[0].endswith("/v1/messages")
    ]
    entries = [[m for m in b["messages"] if _is_control_entry(m)] for b in sent]
    with_config = [[m for m in b["messages"] if "output_config" in m] for b in sent]
    if mode == "compact":
        assert not any("per-turn-control-2026-07-01" in b for b in betas), betas
        assert not any(with_config), with_config
    elif mode == "compact-effort":
        assert all("per-turn-control-2026-07-01" in b for b in betas), betas
        assert all(
            turns and all(m["role"] == "system" and m["content"] for m in turns)
            for turns in with_config
        ), with_config
        assert not any(entries)
    else:
        assert all("per-turn-control-2026-07-01" in b for b in betas), betas
        assert all(len(e) == 1 and e[0]["output_config"].get("effort") for e in entries), [
            b["messages"] for b in sent
        ]
        # right after the user turn it belongs to (the first one in the compaction request)
        assert all(_is_control_entry(b["messages"][1]) for b in sent), [b["messages"] for b in sent]
    # nothing empty went upstream; the per-turn effort reached it
    for body in (r["body"] for r in run["upstream_requests"]):
        assert all(
            content_text(m.get("content") or "").strip() or m.get("tool_calls")
            for m in body["messages"]
        ), body["messages"]
        assert body["stream"] is True
    if mode != "compact":
        assert all(r["body"].get("reasoning_effort") == "high" for r in run["upstream_requests"])


def test_claude_code_retries_a_rate_limited_key(tmp_path) -> None:
    """A limited key: Claude Code's first request is refused with 429 ``rate_limit_error``
    (retry-after 1, the anthropic-ratelimit-* headers) and its own retry gets through."""
    run = run_claude_code(tmp_path, "limited", "Say hi")
    assert run["exit_code"] == 0, claude_code_brief(run)
    assert run["result"]["is_error"] is False
    assert run["spent"] >= 1  # the bucket was spent before Claude Code's request went on
    # the recorder's spending requests come first in the access log (the last refused);
    # then Claude Code's own: refused once, then its retry through
    posts = claude_code_posts(run)
    ours = posts[run["spent"] + 1 :]
    assert posts[run["spent"]]["status"] == 429
    assert [a["status"] for a in ours] == [429, 200], claude_code_brief(run)
    assert ours[0]["error_type"] == "rate_limit_error"
    assert "60 requests per minute" in ours[0]["error"]
    assert len(claude_code_sent(run)) == 2  # the same request, sent twice
    assert claude_code_sent(run)[0] == claude_code_sent(run)[1]


def test_claude_code_stops_at_a_spent_budget(tmp_path) -> None:
    """A client whose daily token budget is spent: Claude Code's request is refused with
    429 ``billing_error``, ``x-should-retry: false`` and the unified headers of a spent
    budget (no claim, so it prints the gateway's message); it does not retry (its retries are
    3 here) and exits with that message, at once."""
    run = run_claude_code(tmp_path, "budget", "Say hi")
    assert run["spent"] == 1  # the recorder's one request spent the 20-token day
    posts = claude_code_posts(run)
    ours = posts[run["spent"] + 1 :]
    assert [a["status"] for a in ours] == [429], claude_code_brief(run)
    assert ours[0]["error_type"] == "billing_error"
    assert len(claude_code_sent(run)) == 1  # sent once: no retry into the block
    assert run["exit_code"] == 1, claude_code_brief(run)
    assert run["result"]["is_error"] is True
    shown = run["result"]["result"]
    assert "daily budget of 20 tokens" in shown and "fits again in" in shown, shown
