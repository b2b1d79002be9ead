"""One Claude Code 2.1.332 turn traced end to end (docs/telemetry.md): Claude Code exports its
OTLP to the gateway (``{prefix}/v1/traces``, the environment the gateway's managed settings
push), sends its ``llm_request`` span's ``traceparent`` on each Messages request
(``CLAUDE_CODE_PROPAGATE_TRACEPARENT``), and the collector sees the client's spans and the
gateway's (server, translate, upstream call) under one trace id, the client's forwarded with
its identity. Runs in a loopback-only namespace (tests/clients/claude_code_run.py)."""

from __future__ import annotations

import pytest

from tests.node import claude_code_brief, claude_code_posts, run_claude_code

pytestmark = [pytest.mark.e2e, pytest.mark.clients]


def test_one_claude_code_turn_is_one_trace_at_the_collector(tmp_path) -> None:
    run = run_claude_code(tmp_path, "telemetry", "Read the file hello.txt and tell me what it says")
    assert run["exit_code"] == 0, claude_code_brief(run)
    posts = claude_code_posts(run)
    assert posts and all(a["status"] == 200 for a in posts), posts
    spans = run["spans"]
    mine = [s for s in spans if s["resource"].get("service.name") == "llm-gateway"]
    theirs = [s for s in spans if s["resource"].get("service.name") != "llm-gateway"]
    assert theirs, "Claude Code's spans did not reach the collector"
    # forwarded by the gateway with the client's identity (no keys: the anonymous client)
    assert all(s["resource"]["gateway.client.name"] == "anonymous" for s in theirs)
    servers = [s for s in mine if s["kind"] == 2 and s["name"].startswith("chat ")]
    assert len(servers) == len(posts)
    by_id = {s["span_id"]: s for s in spans}
    for server in servers:
        parent = by_id.get(server["parent_id"])
        # the gateway's server span is the child of a Claude Code span, in its trace
        assert parent is not None and parent in theirs, (server, sorted(by_id))
        assert parent["trace_id"] == server["trace_id"]
        children = [s for s in mine if s["parent_id"] == server["span_id"]]
        names = {s["name"] for s in children}
        assert "translate" in names
        upstream = [s for s in children if s["kind"] == 3]
        assert len(upstream) == 1 and upstream[0]["attributes"]["server.address"] == "127.0.0.1"
    # the engine got the upstream span's context
    sent = [r for r in run["upstream_requests"] if r["path"].endswith("/chat/completions")]
    assert all(
        {k.lower(): v for k, v in r["headers"].items()}["traceparent"].split("-")[1]
        in {s["trace_id"] for s in servers}
        for r in sent
    )
