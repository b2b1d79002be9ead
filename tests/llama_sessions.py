"""Claude Code-like sessions against real llama.cpp engines, and which engine served each turn.

Shared by the tests that put several demo llama.cpp servers behind one model
(tests/e2e/test_replicas_llama.py: the gateway's own replicas; tests/e2e/test_router_upstream.py:
sglang-router in front). Which engine served a request is read from the engines' own
``/metrics`` (requests go one at a time; the one whose counters moved served it), and whether
it read the session's conversation from its prompt cache from the same counters.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tests.anthropic_stream_check import check_stream
from tests.procs import get, post

COUNTERS = (
    "llamacpp:prompt_tokens_total",
    "llamacpp:prompt_tokens_cached_total",
    "llamacpp:tokens_predicted_total",
)
HEADERS = {"anthropic-version": "2023-06-01"}


def counters(root: str) -> dict[str, float]:
    """The engine's token counters (its server root's ``/metrics``)."""
    status, _, body = get(f"{root}/metrics")
    assert status == 200
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in body.decode().splitlines():
        name, _, value = line.partition(" ")
        if name in out:
            out[name] = float(value)
    return out


def served_by(
    roots: list[str | None], before: list[dict[str, float] | None]
) -> tuple[int, dict[str, float]]:
    """The one live engine whose counters moved since ``before`` (it updates them as its slot
    is released, which may be just after the reply's last byte): its index and the deltas."""
    deadline = time.monotonic() + 10
    while True:
        moved = {}
        for i, (root, was) in enumerate(zip(roots, before, strict=True)):
            if root is None or was is None:
                continue
            now = counters(root)
            if now != was:
                moved[i] = {k: now[k] - was[k] for k in COUNTERS}
        if len(moved) == 1:
            return next(iter(moved.items()))
        assert len(moved) < 2 and time.monotonic() < deadline, moved
        time.sleep(0.02)


def config(upstream: str) -> str:
    """A gateway config routing model ``m`` to the ``[upstreams.fleet]`` lines given."""
    return f"""
[server]
host = "127.0.0.1"
prefix = "/llm"

[upstreams.fleet]
{upstream}
kind = "llamacpp"

[[models]]
name = "m"
upstream = "fleet"
upstream_model = "demo"
"""


class Session:
    """One session: Claude Code's session header and a system prompt of its own (some hundred
    tokens: a router's prefix tree tells the sessions apart by it from the first characters)."""

    def __init__(self, s: int) -> None:
        self.sid = f"6a1f0c2e-0000-4000-8000-{s:012d}"
        self.system = f"You are agent {s}. " + " ".join(
            f"rule {s}.{i}: be exact." for i in range(40)
        )
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {s}: begin"}]


def turn(base: str, session: Session, n: int, *, stream: bool = True) -> None:
    """Turn ``n``, streamed or buffered; asserts a 200 and a well-formed reply ending
    end_turn, then adds the answer and a tool result to the session."""
    body = {
        "model": "m",
        "max_tokens": 200,
        "stream": stream,
        "system": session.system,
        "messages": session.messages,
    }
    status, _, raw = post(
        f"{base}/llm/v1/messages",
        body,
        {**HEADERS, "x-claude-code-session-id": session.sid},
        timeout=60,
    )
    assert status == 200, (session.sid, n, status, raw[:300])
    if stream:
        events = check_stream(raw)
        assert not [e for e in events if e["type"] == "error"], raw[-300:]
        delta = next(e for e in events if e["type"] == "message_delta")
        stop = delta["delta"]["stop_reason"]
        text = "".join(
            e["delta"]["text"]
            for e in events
            if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta"
        )
    else:
        reply = json.loads(raw)
        assert reply["type"] == "message" and reply["role"] == "assistant", reply
        assert reply["model"] == "m" and reply["id"].startswith("msg_"), reply
        assert reply["usage"]["input_tokens"] > 0 and reply["usage"]["output_tokens"] > 0
        stop = reply["stop_reason"]
        text = "".join(b["text"] for b in reply["content"] if b["type"] == "text")
    assert stop == "end_turn", (stream, raw[-300:])
    assert text
    session.messages += [
        {"role": "assistant", "content": text},
        {"role": "user", "content": f"tool result {n}: 3 tests pass"},
    ]


def play(
    base: str,
    sessions: list[Session],
    turns: range,
    roots: list[str | None],
    placement: dict[int, list[int]],
    *,
    mixed: bool = False,
) -> None:
    """Every session's ``turns``, interleaved, one request at a time; appends the engine that
    served each to ``placement`` and asserts that a turn on the engine of the session's
    previous turn was read from its cache. ``mixed``: streamed and buffered in turn."""
    for n in turns:
        for s, session in enumerate(sessions):
            before = [counters(r) if r is not None else None for r in roots]
            turn(base, session, n, stream=not mixed or (s + n) % 2 == 0)
            index, moved = served_by(roots, before)
            placement[s].append(index)
            if n and placement[s][-1] == placement[s][-2]:
                computed = moved["llamacpp:prompt_tokens_total"]
                cached = moved["llamacpp:prompt_tokens_cached_total"]
                assert cached > computed, (s, n, moved)
