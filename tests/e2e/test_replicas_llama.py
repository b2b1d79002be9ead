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
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.fixtures_llama import *  # noqa: F403 - the pytest fixtures (tiny_model)
from tests.llama_sessions import Session, config, play
from tests.procs import Proc, get, require_demo_extra

pytestmark = [pytest.mark.e2e, pytest.mark.llamacpp, pytest.mark.timeout(240)]

REPLICAS = 3
SESSIONS = 9
TURNS_BEFORE, TURNS_AFTER = 2, 2


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
            server = LlamaServer(
                tiny_model[0],
                ctx_size=8192,
                parallel=4,
                threads=1,
                alias="demo",
                extra_args=("endpoint_metrics=true",),
            )
            server.start(timeout=60)
            started.append(server)
        yield started
    finally:
        for server in started:
            server.stop()


def test_sessions_keep_to_one_engine_and_survive_one_being_killed(
    engines: list[Any], gateway_factory: Callable[..., tuple[Proc, str]]
) -> None:
    urls = [e.base_url for e in engines]
    roots: list[str | None] = [e.root_url for e in engines]
    listed = ", ".join(f'"{u}"' for u in urls)
    _, base = gateway_factory(config(f"base_urls = [{listed}]"))
    sessions = [Session(s) for s in range(SESSIONS)]
    placement: dict[int, list[int]] = {s: [] for s in range(SESSIONS)}

    play(base, sessions, range(TURNS_BEFORE), roots, placement)
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

    play(base, sessions, range(TURNS_BEFORE, TURNS_BEFORE + TURNS_AFTER), roots, placement)
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
    health = {
        s.labels["replica"]: s.value
        for f in text_string_to_metric_families(metrics.decode())
        for s in f.samples
        if s.name == "llm_gateway_upstream_replica_healthy"
    }
    assert health[label] == 0 and sum(health.values()) == REPLICAS - 1, health
    retries = sum(
        s.value
        for f in text_string_to_metric_families(metrics.decode())
        for s in f.samples
        if s.name == "llm_gateway_upstream_retries_total"
    )
    assert retries >= 1  # a turn was sent to the dead engine, and retried on another
