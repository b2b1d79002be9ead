"""A real sglang-router (``sglang_router.launch_router``, the Rust router of SGLang's
``sglang-router`` wheel) as the gateway's one upstream, in front of two real llama.cpp workers
(the demo model).

What the router needs of a worker, found by running it against llama-server: it registers
each ``--worker-urls`` entry after its ``/health`` answers 200; it asks ``/server_info`` then
``/get_server_info`` and ``/model_info`` then ``/get_model_info`` for metadata and carries on
when they are 404 (llama-server has none of them; the worker is registered with model
``unknown``, which is what the router's own ``/v1/models`` lists); ``/v1/chat/completions``
(buffered and streamed) is forwarded as is, ``model`` included, and so is the worker's
``X-Request-Id`` echo. It does not forward llama-server's own routes (``/tokenize``,
``/apply-template``, ``/props``: an empty 404 of its own, with no echo), so ``count_tokens`` on
a ``llamacpp`` route through it answers the estimate, flagged (checked below). The router's
Prometheus listener is on 0.0.0.0:29000 unless told otherwise: the test
binds it to 127.0.0.1.

Which worker served a request is read from the workers' own ``/metrics`` (requests go one at a
time; the one whose counters moved served it). Checked: buffered and streamed replies are
well-formed; under ``--policy cache_aware`` every session's turns stay on the worker of its
first turn and are read from that worker's prompt cache. A prompt that matches no worker's
tree above ``--cache-threshold`` goes to the least loaded worker; with requests one at a time
the loads tie and every session's first turn went to the same worker (not asserted: a
tie-break). Then the worker holding most sessions is killed by its PID:
the later turns see no error, and it is the router that retried (its
``smg_worker_retries_total`` moved, the gateway's ``llm_gateway_upstream_retries_total`` did
not). That needs ``--cb-failure-threshold 1``: with the defaults (10) cache_aware sends each of
the router's 5 attempts of a request to the dead worker that holds the prefix, and the client
gets a 500 until ten attempts have failed and the circuit opens (two requests, measured by hand
with sglang-router 0.3.2; the gateway does not retry a 500, which is not an overload).

The second test cuts a stream between the router and a worker and checks the gateway's
mid-stream continuation through the router.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.cutting_proxy import CuttingProxy
from tests.fixtures_llama import *  # noqa: F403 - the pytest fixtures (tiny_model)
from tests.llama_sessions import HEADERS, Session, play, turn
from tests.llama_sessions import config as _shared_config
from tests.procs import Proc, free_port, get, post, require_demo_extra, wait_http

pytestmark = [pytest.mark.e2e, pytest.mark.llamacpp, pytest.mark.timeout(120)]

WORKERS = 2
SESSIONS = 4
TURNS_BEFORE, TURNS_AFTER = 2, 2


def _require_router() -> None:
    """Skip where sglang-router is not installed, except under CI (which installs the bench
    extra, where it is)."""
    if importlib.util.find_spec("sglang_router") is None:
        reason = "sglang-router not installed (pip install '.[bench]')"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture
def workers(tiny_model: tuple[str, dict[str, Any]]) -> Iterator[list[Any]]:
    _require_router()
    require_demo_extra()
    from gateway.demo.llama import LlamaServer

    started: list[LlamaServer] = []
    try:
        for _ in range(WORKERS):
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


def _start_router(worker_roots: list[str]) -> tuple[Proc, str, str]:
    """The router on 127.0.0.1 in front of ``worker_roots``, its workers registered:
    (process, its root URL, its Prometheus URL)."""
    port, prom = free_port(), free_port()
    proc = Proc(
        [
            sys.executable,
            "-m",
            "sglang_router.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(prom),
            "--worker-urls",
            *worker_roots,
            "--policy",
            "cache_aware",
            "--cb-failure-threshold",
            "1",  # a worker that refuses is out at once
            "--log-level",
            "warn",
        ]
    )
    root, metrics = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{prom}/metrics"
    try:
        wait_http(f"{root}/health", timeout=30, proc=proc.popen)
        # /health answers before the workers are registered; a worker listed is one taken
        deadline = time.monotonic() + 30
        while _router_metric(metrics, "smg_worker_health") < len(worker_roots):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    except Exception:
        proc.stop()
        raise RuntimeError("router did not start:\n" + proc.output()[-2000:]) from None
    return proc, root, metrics


@pytest.fixture
def router(workers: list[Any]) -> Iterator[tuple[str, str]]:
    """The router in front of the workers: (its root URL, its Prometheus URL)."""
    proc, root, metrics = _start_router([w.root_url for w in workers])
    try:
        yield root, metrics
    finally:
        proc.stop()


def _samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            yield s.name, s.labels, s.value


def _router_metric(url: str, name: str, **labels: str) -> float:
    """The sum of a router metric's samples matching ``labels`` (0 when it has none yet)."""
    try:
        status, _, body = get(url)
    except OSError:
        return 0.0
    if status != 200:
        return 0.0
    return sum(
        v
        for n, ls, v in _samples(body.decode())
        if n == name and all(ls.get(k) == x for k, x in labels.items())
    )


def _config(router_root: str) -> str:
    # kind names the engine behind the router (llama.cpp here), not the router
    return _shared_config(f'base_url = "{router_root}/v1"')


def test_sessions_follow_cache_aware_routing_and_survive_a_worker_killed(
    workers: list[Any], router: tuple[str, str], gateway_factory: Callable[..., tuple[Proc, str]]
) -> None:
    router_root, router_metrics = router
    roots: list[str | None] = [w.root_url for w in workers]
    _, base = gateway_factory(_config(router_root))
    sessions = [Session(s) for s in range(SESSIONS)]
    placement: dict[int, list[int]] = {s: [] for s in range(SESSIONS)}

    play(base, sessions, range(TURNS_BEFORE), roots, placement, mixed=True)
    assert all(len(set(p)) == 1 for p in placement.values()), placement
    home = {s: p[0] for s, p in placement.items()}
    shares = Counter(home.values())

    victim = shares.most_common(1)[0][0]
    pid, victim_root = workers[victim].pid, str(workers[victim].root_url)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    workers[victim].stop()  # reaped: gone before the next request
    roots[victim] = None

    play(
        base,
        sessions,
        range(TURNS_BEFORE, TURNS_BEFORE + TURNS_AFTER),
        roots,
        placement,
        mixed=True,
    )
    for s, p in placement.items():
        after = p[TURNS_BEFORE:]
        assert victim not in after, (s, p)
        if home[s] != victim:
            assert set(after) == {home[s]}, (s, p)  # the live worker's sessions stayed

    # the router retried on the live worker; the gateway saw no failure to retry
    assert _router_metric(router_metrics, "smg_worker_retries_total") >= 1
    assert (
        _router_metric(router_metrics, "smg_worker_cb_state", worker=victim_root) == 1
    )  # its circuit is open
    _, _, metrics = get(f"{base}/metrics")
    retries = sum(
        v for n, _, v in _samples(metrics.decode()) if n == "llm_gateway_upstream_retries_total"
    )
    assert retries == 0


def test_count_tokens_through_the_router_is_the_flagged_estimate(
    workers: list[Any], router: tuple[str, str], gateway_factory: Callable[..., tuple[Proc, str]]
) -> None:
    """The router answers llama.cpp's tokenizer routes with a 404 of its own (no echo): the
    count is the estimate, flagged, and the next Messages request still goes through."""
    router_root, _ = router
    _, base = gateway_factory(_config(router_root))
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}]}
    for _ in range(2):
        status, headers, raw = post(f"{base}/llm/v1/messages/count_tokens", body, HEADERS)
        assert status == 200, raw
        assert headers["x-token-count-estimated"] == "true"
        assert 100 <= json.loads(raw)["input_tokens"] <= 120
    status, _, raw = post(f"{base}/llm/v1/messages", {**body, "max_tokens": 8}, HEADERS)
    assert status == 200, raw


def test_a_stream_cut_behind_the_router_is_continued_on_the_worker_that_began_it(
    workers: list[Any], gateway_factory: Callable[..., tuple[Proc, str]]
) -> None:
    """Each worker behind a proxy that cuts its next streamed chat completion after a few
    events (tests/cutting_proxy.py; the router sees the proxies as
    its workers). The router passes the cut on; the gateway continues the stream through the
    router, and cache_aware sends the continuation (the same messages plus the partial answer
    as an assistant prefill) to the worker whose tree holds that prefix: the one that began."""
    proxies = [CuttingProxy(str(w.root_url)) for w in workers]
    started: list[CuttingProxy] = []
    router_proc = None
    try:
        for p in proxies:
            p.start()
            started.append(p)
        router_proc, router_root, _ = _start_router(
            [p.base_url.removesuffix("/v1") for p in proxies]
        )
        _, base = gateway_factory(
            _config(router_root).replace(
                'kind = "llamacpp"', 'kind = "llamacpp"\nmax_continuations = 2'
            )
        )
        session = Session(0)
        for p in proxies:
            p.arm(cuts=1, after=6)
        turn(base, session, 0, stream=True)  # a 200, well-formed, end_turn, no error event

        [cutter] = [p for p in proxies if p.cut]
        assert cutter.cut == 1
        assert len(cutter.chats) == 2, cutter.chats  # the cut request, then its continuation
        assert not [p for p in proxies if p is not cutter and p.chats]
        prefill = cutter.chats[1]["messages"][-1]
        assert prefill["role"] == "assistant", prefill
        assert prefill.get("content") or prefill.get("reasoning_content"), prefill

        # the router passed the worker's reset on as a read that failed (its own chunked
        # body left unfinished), not as an error event or a clean end
        _, _, metrics = get(f"{base}/metrics")
        continued = {
            ls["cause"]: v
            for n, ls, v in _samples(metrics.decode())
            if n == "llm_gateway_stream_continuations_total" and v
        }
        assert continued == {"read_failed": 1}, continued
    finally:
        if router_proc is not None:
            router_proc.stop()
        for p in started:
            p.stop()
