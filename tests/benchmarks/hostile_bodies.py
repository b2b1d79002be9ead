"""How long /health waits while maximum-size bodies are decoded (a figure, not a test).

    python -m tests.benchmarks.hostile_bodies

The decode runs on the event loop (docs/reliability.md): a 32 MiB prompt takes 0.3-0.5 s
to decode, check and re-encode, so /health is held meanwhile. This prints the slowest
/health probe (one every 20 ms) and the gateway's peak RSS for the two loads that
tests/e2e/test_hostile_input.py checks for correctness: four 32 MiB ``[[],[],...]`` bodies
at once, and one 32 MiB CSV prompt. On a busy machine the figures grow; the tests only
require /health to keep answering.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from tests.conftest import stub_config
from tests.procs import REPO, Proc, free_port, peak_rss_mb, start_gateway, wait_http
from tests.route_bodies import BODY_CAP, ROUTES, hostile_body, route_body, run_at_once


def _csv_prompt() -> bytes:
    row = '1,2,3,[4],{5:6}, "seven"\n'
    text = (row * ((BODY_CAP - 200) // (len(row) + 4))).encode()
    return route_body("count_tokens", json.dumps(text.decode()).encode())


def main() -> None:
    port = free_port()
    stub = Proc([sys.executable, str(REPO / "tests" / "stub_upstream.py"), str(port)])
    gateway = None
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc=stub.popen)
        with tempfile.TemporaryDirectory() as tmp:
            gateway, url = start_gateway(
                stub_config(f"http://127.0.0.1:{port}/v1", models=("ok",)), Path(tmp)
            )
            loads = {
                "4 x 32 MiB [[],[],...] at once": [
                    (ROUTES[r][0], hostile_body(r))
                    for r in ("messages", "count_tokens", "chat", "embeddings")
                ],
                "one 32 MiB CSV prompt": [(ROUTES["count_tokens"][0], _csv_prompt())],
            }
            print("| load | replies | seconds | /health max ms | probes | peak RSS MB |")
            print("| --- | --- | --- | --- | --- | --- |")
            for name, jobs in loads.items():
                replies, latencies, elapsed = run_at_once(url, jobs)
                statuses = sorted(status for _, status, _, _ in replies)
                print(
                    f"| {name} | {statuses} | {elapsed:.2f} | {max(latencies) * 1000:.0f} "
                    f"| {len(latencies)} | {peak_rss_mb(gateway.pid):.0f} |"
                )
            gateway.stop()
            gateway = None
    finally:
        if gateway is not None:
            gateway.stop()
        stub.stop()


if __name__ == "__main__":
    main()
