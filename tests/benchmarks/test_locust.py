"""A short headless locust run whose failure ratio must equal the gateway's own count.

The gateway runs in front of the scripted stub (tests/stub_upstream.py), whose scenario
``cut-every:N`` cuts every Nth stream after two chunks: a known share of streams fails
mid-stream, after a 200. Locust runs every task of deploy/locust/locustfile.py for a few
seconds with a few users on loopback; then, row by row, locust's request and failure counts
must equal what the gateway counted on ``/metrics``:

- a stream row: requests = ``llm_gateway_requests_total{api, stream="true"}``, failures =
  ``llm_gateway_stream_terminations_total{api, reason!="completed"}`` (a failed stream is
  one failure, never one per event: the count that once read 0.00 % for 0.07 %);
- a buffered row: requests and non-200 answers from ``llm_gateway_requests_total``;
- all rows together, and the streams the stub cut.

Locust is a test extra: missing locally the test is skipped, in CI (``CI`` set) it fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.benchmarks.run import REPO
from tests.procs import Proc, free_port, start_gateway, wait_http

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

KEY = "k-locust"
CUT_EVERY = 5
# locust row -> (api label, stream label) of the gateway's requests_total
ROWS = {
    "messages stream": ("messages", "true"),
    "messages buffered": ("messages", "false"),
    "chat stream": ("chat", "true"),
    "chat buffered": ("chat", "false"),
    "count_tokens": ("count_tokens", "false"),
}


# A second locustfile for the run: at the end, locust's own final figures to a JSON file. (The
# --csv files are rewritten once a second by a greenlet that the shutdown kills, so they can
# miss the last second of a run.)
_DUMP = """
import json, os
from locust import events

@events.quitting.add_listener
def _dump(environment, **_kw):
    stats = environment.stats
    rows = {e.name: [e.num_requests, e.num_failures, e.total_content_length]
            for e in stats.entries.values()}
    rows["Aggregated"] = [stats.total.num_requests, stats.total.num_failures, 0]
    with open(os.environ["LOCUST_TEST_DUMP"], "w") as fh:
        json.dump({"rows": rows, "fail_ratio": stats.total.fail_ratio,
                   "errors": [[e.name, str(e.error), e.occurrences] for e in stats.errors.values()],
                   "exceptions": len(environment.runner.exceptions)}, fh)
"""


def _need_locust() -> None:
    if importlib.util.find_spec("locust") is None:
        if os.environ.get("CI"):
            pytest.fail("locust is not installed (it is part of the test extra)")
        pytest.skip("locust is not installed")


def _get(url: str) -> bytes:
    # with keys set, /metrics on the API listener may ask for one
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.read()  # type: ignore[no-any-return]


def _gateway_counts(url: str) -> tuple[Counter[tuple[str, str, str]], Counter[tuple[str, str]]]:
    """-> (requests by (api, stream, code), stream terminations by (api, reason))."""
    requests: Counter[tuple[str, str, str]] = Counter()
    terminations: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(_get(f"{url}/metrics").decode()):
        for s in family.samples:
            if s.name == "llm_gateway_requests_total":
                requests[s.labels["api"], s.labels["stream"], s.labels["code"]] += int(s.value)
            elif s.name == "llm_gateway_stream_terminations_total":
                terminations[s.labels["api"], s.labels["reason"]] += int(s.value)
    return requests, terminations


def test_locust_failure_ratio_equals_the_gateways_count(tmp_path):
    _need_locust()
    port = free_port()
    stub = Proc([sys.executable, str(REPO / "tests" / "stub_upstream.py"), str(port)])
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
kind = "vllm"
max_continuations = 0  # a cut stream is a failure here: the count locust must agree with

[[models]]
name = "flaky"
upstream = "stub"
upstream_model = "cut-every:{CUT_EVERY}"
"""
        gateway, url = start_gateway(config, tmp_path, env={"LOCUST_TEST_KEYS": KEY})
        dump = tmp_path / "dump.py"
        dump.write_text(_DUMP)
        env = {
            **os.environ,
            "LOCUST_API_KEY": KEY,
            "LOCUST_MODEL": "flaky",
            "GATEWAY_PREFIX": "/llm",
            "LOCUST_TEST_DUMP": str(tmp_path / "final.json"),
        }
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "locust",
                "-f",
                f"{REPO / 'deploy/locust/locustfile.py'},{dump}",
                "--headless",
                "-u",
                "4",
                "-r",
                "4",
                "-t",
                "3s",
                "--host",
                url,
                "--only-summary",
                "--stop-timeout",
                "10",
                "--exit-code-on-error",
                "0",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        final = json.loads((tmp_path / "final.json").read_text())
        assert final["exceptions"] == 0, "a task raised instead of counting: " + proc.stderr
        rows = final["rows"]
        total = rows["Aggregated"][0]
        # the gateway counts a request once its last byte is written, which the client may
        # have read a moment before
        deadline = time.monotonic() + 5
        while True:
            requests, terminations = _gateway_counts(url)
            if sum(requests.values()) >= total or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        cut = json.loads(_get(f"http://127.0.0.1:{port}/_stats"))["cut"]
    finally:
        if gateway is not None:
            gateway.stop()
        stub.stop()

    assert set(rows) == {*ROWS, "Aggregated"}
    failed_total = 0
    for name, (api, stream) in ROWS.items():
        count, fails, size = rows[name]
        answered = sum(n for (a, s, _), n in requests.items() if (a, s) == (api, stream))
        if stream == "true":
            failed = sum(
                n for (a, why), n in terminations.items() if a == api and why != "completed"
            )
            assert sum(n for (a, _), n in terminations.items() if a == api) == answered
            assert size > 0, name  # the bytes of the stream, not of its headers
        else:
            failed = sum(
                n
                for (a, s, code), n in requests.items()
                if (a, s) == (api, stream) and code != "200"
            )
        assert (count, fails) == (answered, failed), name
        assert answered > 0, name
        failed_total += failed
    # the ratio locust shows on its Aggregated row is the gateway's
    assert rows["Aggregated"][:2] == [sum(requests.values()), failed_total]
    assert final["fail_ratio"] == failed_total / sum(requests.values())
    assert failed_total == cut > 0
    # failures are grouped by kind (a handful of rows), each stream counted once
    errors = final["errors"]
    assert sum(n for _, _, n in errors) == failed_total
    assert {name for name, _, _ in errors} <= {"messages stream", "chat stream"}
    assert all("error event: " in error for _, error, _ in errors), errors
