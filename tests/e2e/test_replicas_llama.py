"""Three real llama.cpp replicas (the demo model) behind one model name, default settings.

Which replica served a request is read from the engines themselves: requests go one at a time,
and after each the one engine whose ``/metrics`` counters (prompt tokens computed and read from
cache, tokens predicted) moved is the one that served it. Sessions are named by Claude Code's
``x-claude-code-session-id`` header and their turns interleaved (turn 0 of every session, then
turn 1, ...). Then the replica holding the most sessions is killed by its PID, and the later
turns go on: no client sees an error, every stream is well-formed and ends ``end_turn``, the
other replicas' sessions stay where they were, and the dead one's move once and stay.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.anthropic_stream_check import check_stream
from tests.fixtures_llama import *  # noqa: F403 - the pytest fixtures (tiny_model)
from tests.procs import Proc, get, post, require_demo_extra

pytestmark = [pytest.mark.e2e, pytest.mark.llamacpp, pytest.mark.timeout(240)]

REPLICAS = 3
SESSIONS = 9
TURNS_BEFORE, TURNS_AFTER = 2, 2
_COUNTERS = ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total",
             "llamacpp:tokens_predicted_total")


@pytest.fixture(scope="session")
def demo_extra() -> None:
    require_demo_extra()  # a skip where the demo extra is absent, a failure under CI


@pytest.fixture
def engines(demo_extra: None, tiny_model: tuple[str, dict[str, Any]]) -> Iterator[list[Any]]:
    from gateway.demo.llama import LlamaServer

    started: list[LlamaServer] = []
    try:
        for _ in range(REPLICAS):
            # 4 slots of 2,048 tokens each: every session a replica holds keeps its own slot
            server = LlamaServer(tiny_model[0], ctx_size=8192, parallel=4, threads=1,
                                 alias="demo", extra_args=("endpoint_metrics=true",))
            server.start(timeout=60)
            started.append(server)
        yield started
    finally:
        for server in started:
            server.stop()


def _counters(root: str) -> dict[str, float]:
    status, _, body = get(f"{root}/metrics")
    assert status == 200
    out = dict.fromkeys(_COUNTERS, 0.0)
    for line in body.decode().splitlines():
        name, _, value = line.partition(" ")
        if name in out:
            out[name] = float(value)
    return out


def _served_by(roots: list[str | None], before: list[dict[str, float] | None]
               ) -> tuple[int, dict[str, float]]:
    """The one live engine whose counters moved since ``before`` (it updates them as its slot
    is released, which may be just after the reply's last byte): its index and the deltas."""
    deadline = time.monotonic() + 10
    while True:
        moved = {}
        for i, (root, was) in enumerate(zip(roots, before, strict=True)):
            if root is None or was is None:
                continue
            now = _counters(root)
            if now != was:
                moved[i] = {k: now[k] - was[k] for k in _COUNTERS}
        if len(moved) == 1:
            return next(iter(moved.items()))
        assert len(moved) < 2 and time.monotonic() < deadline, moved
        time.sleep(0.02)


def _config(urls: list[str]) -> str:
    listed = ", ".join(f'"{u}"' for u in urls)
    return f"""
[server]
host = "127.0.0.1"
prefix = "/llm"

[upstreams.fleet]
base_urls = [{listed}]
kind = "llamacpp"

[[models]]
name = "m"
upstream = "fleet"
upstream_model = "demo"
"""


class _Session:
    def __init__(self, s: int) -> None:
        self.sid = f"6a1f0c2e-0000-4000-8000-{s:012d}"
        # a system prompt of some hundred tokens, the session's own
        self.system = f"You are agent {s}. " + " ".join(f"rule {s}.{i}: be exact." for i in
                                                        range(40))
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {s}: begin"}]


def _turn(base: str, session: _Session, turn: int) -> str:
    """One streamed turn; asserts a 200 and a well-formed stream ending end_turn."""
    body = {"model": "m", "max_tokens": 200, "stream": True, "system": session.system,
            "messages": session.messages}
    status, _, raw = post(f"{base}/llm/v1/messages", body,
                          {"x-claude-code-session-id": session.sid,
                           "anthropic-version": "2023-06-01"}, timeout=60)
    assert status == 200, (session.sid, turn, status, raw[:300])
    events = check_stream(raw)
    assert not [e for e in events if e["type"] == "error"], raw[-300:]
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] == "end_turn", delta
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta"
                   and e["delta"]["type"] == "text_delta")
    assert text
    session.messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": f"tool result {turn}: 3 tests pass"}]
    return text


def _round(base: str, sessions: list[_Session], turns: range, roots: list[str | None],
           placement: dict[int, list[int]]) -> None:
    for turn in turns:
        for s, session in enumerate(sessions):
            before = [_counters(r) if r is not None else None for r in roots]
            _turn(base, session, turn)
            index, moved = _served_by(roots, before)
            placement[s].append(index)
            if turn:  # the engine that holds the session read its conversation from cache
                computed = moved["llamacpp:prompt_tokens_total"]
                cached = moved["llamacpp:prompt_tokens_cached_total"]
                if placement[s][-1] == placement[s][-2]:
                    assert cached > computed, (s, turn, moved)


def test_sessions_keep_to_one_engine_and_survive_one_being_killed(
        engines: list[Any], gateway_factory: Callable[..., tuple[Proc, str]]) -> None:
    urls = [e.base_url for e in engines]
    roots: list[str | None] = [e.root_url for e in engines]
    _, base = gateway_factory(_config(urls))
    sessions = [_Session(s) for s in range(SESSIONS)]
    placement: dict[int, list[int]] = {s: [] for s in range(SESSIONS)}

    _round(base, sessions, range(TURNS_BEFORE), roots, placement)
    assert all(len(set(p)) == 1 for p in placement.values()), placement
    home = {s: p[0] for s, p in placement.items()}
    shares = Counter(home.values())
    assert len(shares) >= 2, shares  # the sessions spread over the engines

    victim = shares.most_common(1)[0][0]
    pid = engines[victim].pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    engines[victim].stop()  # reaped: gone before the next request
    roots[victim] = None

    _round(base, sessions, range(TURNS_BEFORE, TURNS_BEFORE + TURNS_AFTER), roots, placement)
    for s, p in placement.items():
        after = p[TURNS_BEFORE:]
        assert victim not in after, (s, p)
        if home[s] != victim:
            assert set(after) == {home[s]}, (s, p)  # the others' sessions stayed
        else:
            assert len(set(after)) == 1, (s, p)  # moved once, then stayed

    from prometheus_client.parser import text_string_to_metric_families

    _, _, metrics = get(f"{base}/metrics")
    label = urls[victim].split("://")[1].split("/")[0]
    health = {s.labels["replica"]: s.value for f in text_string_to_metric_families(
        metrics.decode()) for s in f.samples if s.name == "llm_gateway_upstream_replica_healthy"}
    assert health[label] == 0 and sum(health.values()) == REPLICAS - 1, health
    retries = sum(s.value for f in text_string_to_metric_families(metrics.decode())
                  for s in f.samples if s.name == "llm_gateway_upstream_retries_total")
    assert retries >= 1  # a turn was sent to the dead engine, and retried on another
