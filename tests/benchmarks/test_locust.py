"""A short headless locust run against the gateway in front of the fast stub upstream.

Checks the locustfile's contract: both streaming tasks run, the custom events (time to
first token, chunk gap, total, output tokens/s) reach the CSV, and nothing failed.
Locust is a test extra: missing locally the test is skipped, in CI (``CI`` set) it fails.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys

import pytest

from tests.benchmarks.run import REPO
from tests.procs import Proc, free_port, start_gateway, wait_http

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

MODEL = "bench:24:5"  # 24 deltas, 5 ms apart: a few dozen streams in the run


def _need_locust() -> None:
    if importlib.util.find_spec("locust") is None:
        if os.environ.get("CI"):
            pytest.fail("locust is not installed (it is part of the test extra)")
        pytest.skip("locust is not installed")


def test_headless_run_records_stream_metrics(tmp_path):
    _need_locust()
    port = free_port()
    stub = Proc([sys.executable, "-m", "tests.benchmarks.stub_fast", str(port)])
    gateway = None
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc=stub.popen)
        config = f"""
[server]
host = "127.0.0.1"
prefix = "/llm"
api_keys_env = "LOCUST_TEST_KEYS"

[upstreams.stub]
base_url = "http://127.0.0.1:{port}/v1"

[[models]]
name = "{MODEL}"
upstream = "stub"
upstream_model = "{MODEL}"
"""
        gateway, url = start_gateway(config, tmp_path, env={"LOCUST_TEST_KEYS": "k-locust"})
        prefix = tmp_path / "run"
        env = {**os.environ, "LOCUST_API_KEY": "k-locust", "LOCUST_MODEL": MODEL,
               "GATEWAY_PREFIX": "/llm"}
        proc = subprocess.run(
            [sys.executable, "-m", "locust", "-f", str(REPO / "deploy/locust/locustfile.py"),
             "--headless", "-u", "10", "-r", "10", "-t", "6s", "--csv", str(prefix),
             "--host", url, "--only-summary", "--stop-timeout", "5"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        with open(f"{prefix}_stats.csv", newline="") as fh:
            rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(fh)}
        with open(f"{prefix}_failures.csv", newline="") as fh:
            failures = list(csv.DictReader(fh))
    finally:
        if gateway is not None:
            gateway.stop()
        stub.stop()
    assert failures == []
    for api in ("anthropic", "openai"):
        stream = rows[("POST", f"{api} stream")]
        assert int(stream["Request Count"]) > 0 and int(stream["Failure Count"]) == 0
        for what in ("ttft", "chunk gap", "total", "output tokens/s"):
            row = rows[("SSE", f"{api} {what}")]
            assert int(row["Request Count"]) > 0, (api, what)
            assert int(row["Failure Count"]) == 0, (api, what)
        # 24 deltas per stream (Anthropic adds a signature delta): at least 23 gaps for
        # every completed stream, one event per gap rather than one per stream
        assert int(rows[("SSE", f"{api} chunk gap")]["Request Count"]) >= \
            23 * int(rows[("SSE", f"{api} total")]["Request Count"])
    assert int(rows[("", "Aggregated")]["Failure Count"]) == 0
