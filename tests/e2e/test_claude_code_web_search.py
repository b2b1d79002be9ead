"""Claude Code 2.1.332's WebSearch, served by the gateway's ``web_search`` tool (#27), offline.

Claude Code in full mode (tests/clients/claude_code_run.py, mode ``websearch-session``) against
the scripted stub and the SearXNG stand-in: the main model loads WebSearch with ToolSearch
and calls it; Claude Code then sends its side request (read from its bundle: one user
message ``Perform a web search for the query: Q``, the only tool
``web_search_20250305`` with ``max_uses: 8``; ``tool_choice`` ``auto`` as observed, though
its code asks for one naming ``web_search``),
which the gateway now serves: the stub model searches, the gateway asks SearXNG and
streams back ``server_tool_use`` + ``web_search_tool_result`` + the model's text. Claude Code
turns that into WebSearch's result (``Links: [{title, url}...]`` and the text) for the main
model, whose answer shows the backend's pages. Two more turns with ``--continue`` carry the
search in the session's history.

Without ``[web_search]`` the side request is still refused:
tests/e2e/test_claude_code.py::test_claude_code_web_search_is_refused_and_the_session_goes_on.
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
from tests.searxng_stub import HOSTS, slug

pytestmark = [pytest.mark.e2e, pytest.mark.clients]

QUERY = "gateway release notes"  # what the scripted main model passes to WebSearch
URLS = [f"https://{h}/{slug(QUERY)}/{n}" for n, h in enumerate(HOSTS, 1)]


def _offers_search(body: dict) -> bool:
    return any(t["function"]["name"] == "web_search" for t in body.get("tools") or ())


def test_claude_code_web_search_runs_and_the_session_goes_on(tmp_path) -> None:
    run = run_claude_code(
        tmp_path, "websearch-session", "Search the web for the gateway's release notes", timeout=400
    )
    steps = run["steps"]
    assert [s["exit_code"] for s in steps] == [0, 0, 0], claude_code_brief(run)
    assert all(s["result"]["is_error"] is False for s in steps), steps
    sent, posts = claude_code_sent(run), claude_code_posts(run)
    assert posts and all(a["status"] == 200 for a in posts), posts  # nothing refused now
    assert len(posts) == len(sent)

    # the side request: only the server tool, forced; served, streamed
    side = [
        b for b in sent if [t.get("type") for t in b.get("tools", [])] == ["web_search_20250305"]
    ]
    assert len(side) == 1, [
        [t.get("type", t.get("name")) for t in b.get("tools", [])] for b in sent
    ]
    (request,) = side
    assert request["tools"][0]["name"] == "web_search" and request["tools"][0]["max_uses"] == 8
    # its code asks for tool_choice naming web_search; 2.1.332 sent "auto" here (observed)
    assert request["tool_choice"] in ({"type": "auto"}, {"type": "tool", "name": "web_search"})
    assert request["stream"] is True
    assert json.dumps(request["messages"][-1]).count(f"for the query: {QUERY}") == 1
    # what Claude Code read: one well-formed stream, the search, its results, the answer
    (record,) = [r for r in run["client_requests"] if r["body"] == request]
    events = check_stream(record["response"].encode())
    blocks = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert [b["type"] for b in blocks] == ["server_tool_use", "web_search_tool_result", "text"]
    assert [r["url"] for r in blocks[1]["content"]] == URLS
    assert blocks[1]["tool_use_id"] == blocks[0]["id"]

    # SearXNG was asked once, for the query; the upstream model saw its pages
    assert [(s["params"]["q"], s["params"]["format"]) for s in run["searches"]] == [(QUERY, "json")]
    upstream = [r["body"] for r in run["upstream_requests"]]
    searching = [b for b in upstream if _offers_search(b)]
    assert len(searching) == 2, [len(b["messages"]) for b in searching]
    call = searching[1]["messages"][-2]["tool_calls"][0]
    assert call["function"]["name"] == "web_search"
    assert json.loads(call["function"]["arguments"]) == {"query": QUERY}
    told = searching[1]["messages"][-1]
    assert told["role"] == "tool" and told["tool_call_id"] == call["id"]
    assert all(url in content_text(told["content"]) for url in URLS)
    # after the search the model is free to answer: not forced to search again
    assert "web_search" not in json.dumps(searching[1].get("tool_choice"))

    # Claude Code made WebSearch's result of the blocks: the links and the model's text
    result = next(
        b
        for m in sent[-1]["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result" and "Web search results" in json.dumps(b)
    )
    shown = json.dumps(result["content"])
    assert not result.get("is_error") and "Links:" in shown
    assert all(url in shown for url in URLS)
    assert f"According to {URLS[0]}, that is the answer." in shown
    # ... and the answer of turn 1 cites the backend's page
    assert URLS[0] in steps[0]["result"]["result"]

    # turns 2 and 3 (--continue): the search is in the history the upstream gets, as the
    # WebSearch call and its result; no new search
    main = [b for b in upstream if not _offers_search(b)]
    for body in main[-2:]:
        calls = [c for m in body["messages"] for c in m.get("tool_calls") or ()]
        web = [c for c in calls if c["function"]["name"] == "WebSearch"]
        assert len(web) == 1 and json.loads(web[0]["function"]["arguments"])["query"] == QUERY
        answer = next(
            m for m in body["messages"] if m["role"] == "tool" and m["tool_call_id"] == web[0]["id"]
        )
        assert URLS[0] in content_text(answer["content"])
    assert "Go on" in json.dumps(main[-2]["messages"]) and "And then?" in json.dumps(
        main[-1]["messages"]
    )
    assert all(URLS[0] in s["result"]["result"] for s in steps[1:])


def test_claude_code_shows_a_failed_search_and_goes_on(tmp_path) -> None:
    """The backend fails (500): the side request is still a whole 200 reply whose result
    block is the error ``unavailable``; Claude Code hands the model ``Web search error:
    unavailable`` as WebSearch's result, and the session goes on."""
    run = run_claude_code(
        tmp_path, "websearch-fail", "Search the web for the gateway's release notes"
    )
    assert run["exit_code"] == 0, claude_code_brief(run)
    assert run["result"]["is_error"] is False
    posts = claude_code_posts(run)
    assert posts and all(a["status"] == 200 for a in posts), posts
    assert [s["params"]["q"] for s in run["searches"]] == [QUERY + " #fail"]
    (side,) = [r for r in run["client_requests"] if "response" in r]
    events = check_stream(side["response"].encode())
    blocks = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert [b["type"] for b in blocks] == ["server_tool_use", "web_search_tool_result", "text"]
    assert blocks[1]["content"] == {
        "type": "web_search_tool_result_error",
        "error_code": "unavailable",
    }
    sent = claude_code_sent(run)
    result = next(
        b
        for m in sent[-1]["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result" and "Web search results" in json.dumps(b)
    )
    shown = json.dumps(result["content"])
    assert "Web search error: unavailable" in shown
    assert "The search found nothing: " in shown  # the model was told, and said so
    assert "Web search error: unavailable" in run["result"]["result"]
