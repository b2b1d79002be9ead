"""``--workers N``: several processes on one port, metrics summed across them, clean drain."""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.request

import pytest

from tests.conftest import stub_config
from tests.logs import access_lines, log_lines, matching
from tests.procs import Proc, free_port, wait_http
from tests.waits import wait_until

pytestmark = pytest.mark.e2e


def _metric_lines(url: str, name: str) -> list[str]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return [ln for ln in text.splitlines() if ln.startswith(name)]


def _listening_pids(proc: Proc) -> set[int]:
    return {e["pid"] for e in matching(log_lines(proc.output()), "listening")}


def test_two_workers_share_a_port_and_sum_metrics(stub_url, tmp_path) -> None:
    port = free_port()
    cfg = tmp_path / "gw.toml"
    cfg.write_text(stub_config(stub_url, models=("ok",)))
    proc = Proc(
        [
            sys.executable,
            "-m",
            "gateway",
            "--config",
            str(cfg),
            "--port",
            str(port),
            "--workers",
            "2",
        ]
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/health", proc=proc.popen)
        # the supervisor's own line is written at once, not when it exits
        started = matching(log_lines(proc.output()), "workers_started")
        assert any(len(e["pids"]) == 2 for e in started)
        # each worker logs it once its socket is bound
        wait_until(
            lambda: len(_listening_pids(proc)) >= 2, "both workers bound the port", timeout=20
        )
        n = 40
        for _ in range(n):  # new connection each time: the kernel spreads them
            req = urllib.request.Request(
                base + "/llm/v1/messages",
                method="POST",
                data=json.dumps(
                    {
                        "model": "m-ok",
                        "max_tokens": 5,
                        "messages": [{"role": "user", "content": "hi"}],
                    }
                ).encode(),
                headers={"content-type": "application/json", "connection": "close"},
            )
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.status == 200
        total = [
            ln
            for ln in _metric_lines(base, "llm_gateway_requests_total{")
            if 'code="200"' in ln and 'api="messages"' in ln
        ]
        assert sum(float(ln.rsplit(" ", 1)[1]) for ln in total) == n  # all workers summed
        assert _metric_lines(base, "llm_gateway_build_info{")
        proc.signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        # log lines are all flushed at exit
        pids = {line["pid"] for line in access_lines(proc.output())}
        assert len(pids) == 2, f"requests were served by {pids}"
    finally:
        proc.stop()


def _scrape(base: str) -> dict[str, list[tuple[str, float]]]:
    """/metrics as {name: [(labels, value)]}."""
    with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name, _, labels = series.partition("{")
            out.setdefault(name, []).append((labels, float(value)))
    return out


def test_process_metrics_describe_all_workers(stub_url, tmp_path) -> None:
    """Each scrape is answered by one worker, so a process collector's CPU counter jumped
    between workers (0.33, 0.34, 0.32, ...: a counter reset to Prometheus). Each worker now
    writes its own figures: the CPU counter is summed over the workers and never goes down
    across eight scrapes with traffic between them; RSS and fds are one series per worker
    (``pid``); and no ``*_created`` or per-worker GC counter is served."""
    port = free_port()
    cfg = tmp_path / "gw.toml"
    cfg.write_text(stub_config(stub_url, models=("ok",)))
    proc = Proc(
        [
            sys.executable,
            "-m",
            "gateway",
            "--config",
            str(cfg),
            "--port",
            str(port),
            "--workers",
            "2",
        ]
    )
    base = f"http://127.0.0.1:{port}"
    body = json.dumps(
        {"model": "m-ok", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    try:
        wait_http(base + "/health", proc=proc.popen)
        wait_until(
            lambda: len(_scrape(base).get("process_resident_memory_bytes", [])) >= 2,
            "both workers wrote their RSS",
            timeout=20,
            every=0.1,
        )
        cpu = []
        for _ in range(8):
            for _ in range(10):  # a little load, spread over the workers
                req = urllib.request.Request(
                    base + "/llm/v1/messages",
                    method="POST",
                    data=body,
                    headers={"content-type": "application/json", "connection": "close"},
                )
                with urllib.request.urlopen(req, timeout=10) as resp:
                    assert resp.status == 200
            time.sleep(0.3)
            metrics = _scrape(base)
            [(labels, value)] = metrics["process_cpu_seconds_total"]
            assert labels == ""  # one series: summed over the workers
            cpu.append(value)
            rss = metrics["process_resident_memory_bytes"]
            assert len(rss) == 2 and all('pid="' in labels for labels, _ in rss)
            assert all(value > 10e6 for _, value in rss)
            assert len(metrics["process_open_fds"]) == 2
            assert not [name for name in metrics if name.endswith("_created")]
            assert not [name for name in metrics if name.startswith("python_gc_")]
        assert cpu == sorted(cpu), f"CPU seconds went down: {cpu}"
        assert cpu[-1] > cpu[0]
    finally:
        proc.stop()


def test_a_started_gateway_freezes_its_start_heap(stub_url, gateway_factory) -> None:
    """What the start made (modules, classes, the app) is out of the collector's reach before
    the socket is bound, so a full collection under load walks only what requests made: its
    ``listening`` line says how many objects were frozen (the process has tens of thousands)."""
    proc, _ = gateway_factory(stub_config(stub_url, models=("ok",)))
    lines: list[dict[str, object]] = []
    for _ in range(200):  # logged just after the bind, maybe after /health first answered
        complete = proc.output().split("\n")[:-1]
        lines = [json.loads(ln) for ln in complete if ln.startswith("{")]
        if any(e.get("event") == "listening" for e in lines):
            break
        time.sleep(0.05)
    listening = [e for e in lines if e.get("event") == "listening"]
    assert len(listening) == 1, proc.output()
    assert isinstance(listening[0].get("frozen_objects"), int)
    assert listening[0]["frozen_objects"] >= 10_000
