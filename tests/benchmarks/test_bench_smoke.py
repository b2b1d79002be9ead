"""The benchmark runs end to end in its tiny mode and reports every figure.

Proves the harness works (processes start, loads run, every figure is a number, every
process is ended); it asserts nothing about speed: timings on a shared machine are not
test material.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from tests.benchmarks.run import REPO

# The tiny runs take about a minute on an idle two-core machine and several on a busy one:
# the limits catch a hang, not slowness (timings are the benchmark's figures, not asserts).
_HANG_S = 600

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(_HANG_S + 60)]

_SERVER_FIGURES = {
    "buffered": ("rps", "p50_ms", "p99_ms", "cpu_us", "added_p50_ms", "added_p99_ms"),
    "latency_c1": ("ttft_ms", "ttlb_ms", "added_ttft_ms", "added_ttlb_ms"),
    "bulk": ("chunks_per_s", "cpu_s_per_1k_chunks"),
    "paced": ("cpu_s_per_1k_chunks",),
    "slow": (
        "completed",
        "on_time_ratio",
        "kb_per_stream",
        "cpu_s_per_1k_chunks",
        "upstream_open_after",
        "abandoned_open_after",
    ),
}


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def test_tiny_run_reports_every_figure(tmp_path):
    """Every figure, the Rust router's too where the bench extra is installed; without it
    (the README's test command leaves it out) the router's figures and targets are empty and
    the run says why. CI installs it: there, its absence fails."""
    if os.environ.get("CI") and importlib.util.find_spec("sglang_router") is None:
        pytest.fail("sglang-router is not installed (pip install '.[bench]'; CI must)")
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.run", "--tiny", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=_HANG_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| target | value | limit | holds |" in proc.stdout
    r = json.loads(out.read_text())
    for api, floor in (("anthropic", "floor"), ("openai", "relay")):
        for conc in ("c1", "c16", "c64"):
            row = r[api]["buffered"][conc]
            for target in ("gateway", floor):
                for key in _SERVER_FIGURES["buffered"]:
                    assert _number(row[target][key]), (api, conc, target, key)
                assert row[target]["ok"] == 1.0, (api, conc, target)
            assert _number(row["direct"]["rps"]) and _number(row["cpu_ratio"])
        stream = r[api]["stream"]
        for part in ("latency_c1", "bulk", "paced"):
            for key in _SERVER_FIGURES[part]:
                assert _number(stream[part]["gateway"][key]), (api, part, key)
                assert _number(stream[part][floor][key]), (api, part, key)
            assert stream[part]["gateway"]["ok"] == 1.0, (api, part)
        slow = r[api]["slow"]
        for target in ("gateway", floor):
            for key in _SERVER_FIGURES["slow"]:
                assert _number(slow[target][key]), (api, target, key)
            # correctness, not speed: every stream ends well-formed, none left upstream
            assert slow[target]["completed"] == slow["streams"], (api, target)
            assert slow[target]["upstream_open_after"] == 0, (api, target)
            assert slow[target]["abandoned_open_after"] == 0, (api, target)
    if r["router_missing"] is None:  # the Rust router ran beside the relay, every figure
        for conc in ("c1", "c16", "c64"):
            assert r["openai"]["buffered"][conc]["router"]["ok"] == 1.0, conc
            assert _number(r["openai"]["buffered"][conc]["cpu_ratio_router"]), conc
        for part in ("bulk", "paced"):
            assert _number(r["openai"]["stream"][part]["cpu_ratio_router"]), part
        assert r["openai"]["slow"]["router"]["completed"] == r["openai"]["slow"]["streams"]
    else:
        assert "not installed" in r["router_missing"] and "Rust router left out" in proc.stdout
    for name in ("gateway", "floor", "relay"):
        assert _number(r["startup"][name]["startup_s"])
        assert _number(r["startup"][name]["idle_rss_mb"])
    assert r["targets"]
    for t in r["targets"]:  # a target without a value: only the router's, where it is absent
        assert _number(t["value"]) or (
            t["value"] is None and r["router_missing"] and "Rust router" in t["target"]
        ), t
    assert isinstance(r["gateway_error_lines"], int)


def test_workers_run_reports_every_figure(tmp_path):
    """The scale-out benchmark (``--workers``) in a tiny size: all streams complete."""
    out = tmp_path / "workers.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.benchmarks.workers",
            "--streams",
            "60",
            "--chunks",
            "3",
            "--interval-ms",
            "100",
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=_HANG_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads(out.read_text())
    assert figures["completed"] == 60 and figures["upstream_open_after"] == 0
    assert figures["metrics_completed"] == 60  # /metrics sums both workers
    assert len(figures["worker_pids"]) == 2
    for key in ("on_time", "gateway_idle_rss_mb", "gateway_peak_rss_mb", "kb_per_stream"):
        assert _number(figures[key]), key


def test_batches_run_reports_every_figure(tmp_path):
    """The Message Batches benchmark in its tiny mode: every figure a number, the batch
    still running through the interactive phase it is compared in."""
    out = tmp_path / "batches.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.batches", "--tiny", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=_HANG_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| target | value | limit | holds |" in proc.stdout
    r = json.loads(out.read_text())
    for phase in ("alone", "alone_again", "with_batch"):
        assert r[phase]["ok"] == r[phase]["requests"], phase
        for key in ("ttft_p50_ms", "ttft_p99_ms"):
            assert _number(r[phase][key]), (phase, key)
    assert r["with_batch"]["batch_running_after"] is True
    assert _number(r["with_batch"]["batch_served"]) and _number(r["with_batch"]["batch_rps"])
    for key in ("full_rps", "ratio_p50", "ratio_p99"):
        assert _number(r[key]), key
    assert _number(r["batch_only"]["rps"]) and _number(r["batch_only"]["ratio_to_full"])


def test_affinity_run_reports_every_figure(tmp_path):
    """Affinity against round-robin on two real llama.cpp replicas, tiny: every figure a
    number, every turn answered under both policies, the engines' cache figures read."""
    from tests.procs import require_demo_extra

    require_demo_extra()
    out = tmp_path / "affinity.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.affinity", "--tiny", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=_HANG_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| figure | affinity | round-robin | round-robin ÷ affinity |" in proc.stdout
    r = json.loads(out.read_text())
    turns = r["settings"]["sessions"] * r["settings"]["turns"]
    for policy in ("affinity", "round_robin"):
        figures = r[policy]
        assert figures["errors"] == 0 and figures["requests"] == turns, figures
        for key in (
            "ttft_p50_ms",
            "ttft_p95_ms",
            "ttft_later_p50_ms",
            "ttft_later_p95_ms",
            "prompt_tokens_computed",
            "prompt_tokens_cached",
            "cache_hit_share",
        ):
            assert _number(figures[key]), (policy, key)
        assert figures["prompt_tokens_computed"] > 0
        assert sum(figures["requests_per_replica"]) == turns, figures
    # round-robin: every replica takes its turn (the session count is no multiple of theirs)
    assert all(n > 0 for n in r["round_robin"]["requests_per_replica"])
    assert all(_number(v) for v in r["ratios"].values())
