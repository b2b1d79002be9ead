"""Claude Code 2.1.332's WebFetch through the gateway, offline (#36).

2.1.332 has no ``web_fetch_20…`` server tool: WebFetch gets the page on the client's machine
and hands its text to the small, fast model in a side request through the gateway. Claude
Code in full mode (tests/clients/claude_code_run.py, mode ``webfetch-session``): the main
model loads WebFetch with ToolSearch and calls it on a page served over HTTPS on 127.0.0.1
inside the loopback-only namespace (2.1.332 turns ``http:`` into ``https:``; the user
settings carry ``skipWebFetchPreflight`` so it does not ask api.anthropic.com about the
host). Claude Code fetches the page, the side request carries the page as markdown and the
prompt, the stub answers, and that answer is WebFetch's result for the main model. Two more
turns with ``--continue`` carry the fetch in the session's history.
"""

from __future__ import annotations

import json

import pytest

from tests.anthropic_stream_check import check_stream
from tests.node import (
    claude_code_brief,
    claude_code_posts,
    claude_code_sent,
    content_text,
    run_claude_code,
)

pytestmark = [pytest.mark.e2e, pytest.mark.clients]

ANSWER = "Hello from the stub."  # the stub's ``ok`` reply: what the side request answers


def test_claude_code_web_fetch_runs_through_the_gateway(tmp_path) -> None:
    run = run_claude_code(
        tmp_path, "webfetch-session", "When does the heron release ship? Fetch the notes."
    )
    steps = run["steps"]
    assert [s["exit_code"] for s in steps] == [0, 0, 0], claude_code_brief(run)
    assert all(s["result"]["is_error"] is False for s in steps), steps
    sent, posts = claude_code_sent(run), claude_code_posts(run)
    assert posts and all(a["status"] == 200 for a in posts), posts
    assert len(posts) == len(sent)
    sentence, url = run["page_sentence"], run["page_url"]

    # Claude Code itself fetched the page, once, from the server in the namespace
    assert [p["path"] for p in run["pages"]] == ["/notes/release.html"]
    assert "claude-code/" in run["pages"][0]["user_agent"]

    # the side request: no tools, the page (as markdown) and the prompt, to the small model
    side = [b for b in sent if sentence in json.dumps(b)]
    assert len(side) == 1, [b["model"] for b in sent]
    (request,) = side
    assert request["model"] == "claude-haiku-4-5" and not request.get("tools")
    text = json.dumps(request["messages"])
    assert "Release notes\\n=============" in text  # the HTML became markdown
    assert "<p>" not in text and run["fetch_prompt"] in text
    # ... served: routed to claude-*, one well-formed stream holding the stub's answer
    (record,) = [r for r in run["client_requests"] if r["body"] == request]
    assert request["stream"] is True
    events = check_stream(record["response"].encode())
    deltas = "".join(
        e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta"
    )
    assert deltas == ANSWER
    assert [a["model"] for a in posts].count("claude-*") == 1

    # upstream: the side request went to the stub as its own turn, the page in it
    upstream = [r["body"] for r in run["upstream_requests"]]
    (side_up,) = [b for b in upstream if b["model"] == "ok"]
    assert sentence in json.dumps(side_up["messages"])
    main = [b for b in upstream if b["model"] != "ok"]
    # the main model's request after the fetch carries WebFetch's result: the answer
    fetch_calls = []
    for body in main:
        calls = [c for m in body["messages"] for c in m.get("tool_calls") or ()]
        fetch_calls.append([c for c in calls if c["function"]["name"] == "WebFetch"])
    first = next(i for i, calls in enumerate(fetch_calls) if calls)
    assert upstream.index(main[first]) > upstream.index(side_up)
    (call,) = fetch_calls[first]
    assert json.loads(call["function"]["arguments"]) == {
        "url": url,
        "prompt": run["fetch_prompt"],
    }
    told = main[first]["messages"][-1]
    assert told["role"] == "tool" and told["tool_call_id"] == call["id"]
    assert ANSWER in content_text(told["content"])
    assert steps[0]["result"]["result"] == "The tool said: " + ANSWER

    # turns 2 and 3 (--continue): the fetch is in the history; no new fetch, no side request
    for body in main[-2:]:
        (web,) = [
            c
            for m in body["messages"]
            for c in m.get("tool_calls") or ()
            if c["function"]["name"] == "WebFetch"
        ]
        assert json.loads(web["function"]["arguments"])["url"] == url
        result = next(
            m for m in body["messages"] if m["role"] == "tool" and m["tool_call_id"] == web["id"]
        )
        assert ANSWER in content_text(result["content"])
    assert "Go on" in json.dumps(main[-2]["messages"])
    assert "And then?" in json.dumps(main[-1]["messages"])
    assert len(run["pages"]) == 1


def test_claude_code_web_fetch_needs_the_preflight_skipped_offline(tmp_path) -> None:
    """Without ``skipWebFetchPreflight`` 2.1.332 first asks api.anthropic.com whether it may
    fetch the host; offline that fails, so the page is never asked for and no side request
    is sent: the setting is what lets the session above fetch."""
    run = run_claude_code(
        tmp_path, "webfetch-preflight", "When does the heron release ship? Fetch the notes."
    )
    assert run["exit_code"] == 0, claude_code_brief(run)
    assert run["pages"] == []
    sent = claude_code_sent(run)
    assert not [b for b in sent if run["page_sentence"] in json.dumps(b)]
    assert all(b["model"] != "claude-haiku-4-5" for b in sent)
    # WebFetch's result, as the main model quoted it: the lookup failed
    assert run["result"]["result"] == (
        "The tool said: Unable to verify if domain 127.0.0.1 is safe to fetch. This may be due"
        " to network restrictions or enterprise security policies blocking claude.ai."
    )
