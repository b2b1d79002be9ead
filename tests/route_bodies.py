"""Request bodies for each JSON route of the gateway, and many sent at once.

:func:`route_body` is a route's smallest valid body with raw JSON bytes spliced in where the
text goes and as extra fields (so a test can send what ``json.dumps`` never writes: lone
surrogates, ``NaN``, deep nesting); :func:`hostile_body` the 32 MiB body that decodes to 855 MB
of Python objects; :func:`run_at_once` sends bodies at once while probing ``/health``.

Shared by tests/e2e/test_hostile_input.py and the benchmarks (tests/benchmarks/neighbours.py,
hostile_bodies.py).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any

from tests.procs import get

MIB = 2**20
BODY_CAP = 32 * MIB  # server.max_body_bytes' default

# A hang guard, not a latency claim: /health must keep answering while the bodies are decoded
# (each probe is a 200 within this many seconds). How fast it answers is a figure
# tests/e2e/test_hostile_input.py prints (``-s``) and ``python -m tests.benchmarks.hostile_bodies``
# reports.
HEALTH_HANG_S = 10.0
SLOT = "@@slot@@"

# route -> (path, body with SLOT where the text goes, the text's path, OpenAI shape)
ROUTES: dict[str, tuple[str, dict[str, Any], str, bool]] = {
    "messages": (
        "/v1/messages",
        {"model": "m-ok", "max_tokens": 5, "messages": [{"role": "user", "content": SLOT}]},
        "messages.0.content",
        False,
    ),
    "count_tokens": (
        "/v1/messages/count_tokens",
        {"model": "m-ok", "messages": [{"role": "user", "content": SLOT}]},
        "messages.0.content",
        False,
    ),
    "chat": (
        "/v1/chat/completions",
        {"model": "m-ok", "max_tokens": 5, "messages": [{"role": "user", "content": SLOT}]},
        "messages.0.content",
        True,
    ),
    "completions": (
        "/v1/completions",
        {"model": "m-ok", "max_tokens": 5, "prompt": SLOT},
        "prompt",
        True,
    ),
    "embeddings": ("/v1/embeddings", {"model": "m-ok", "input": SLOT}, "input", True),
    "responses": ("/v1/responses", {"model": "m-ok", "input": SLOT}, "input", True),
}


def route_body(route: str, text: bytes = b'"hi"', **fields: bytes) -> bytes:
    """The route's body as bytes: ``text`` (raw JSON) where the text goes, and each extra
    field with a raw JSON value (``model`` replaced when given)."""
    base = dict(ROUTES[route][1])
    extra = {k: SLOT + k for k in fields}
    if "model" in fields:
        del base["model"]
    raw = json.dumps({**base, **extra}).encode().replace(json.dumps(SLOT).encode(), text)
    for key, value in fields.items():
        raw = raw.replace(json.dumps(SLOT + key).encode(), value)
    return raw


def hostile_body(route: str) -> bytes:
    """A 32 MiB body: a valid request whose unknown field ``x`` holds ``[[],[],...]`` (855 MB
    of Python objects once decoded, before the value bound)."""
    head = route_body(route, x=b"@@x@@")
    before, after = head.split(b"@@x@@")
    count = (BODY_CAP - len(before) - len(after) - 2) // 3
    return before + b"[" + b"[]," * (count - 1) + b"[]]" + after


Reply = tuple[str, int, dict[str, str], bytes]  # path, status, headers, body


def _send(port: int, path: str, body: bytes, out: list[Reply]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/llm" + path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        headers = {k.lower(): v for k, v in resp.getheaders()}
        out.append((path, resp.status, headers, resp.read()))
    finally:
        conn.close()


def _probe_health(url: str, stop: threading.Event, latencies: list[float]) -> None:
    for _ in range(2000):  # bounded: 2,000 probes at most
        if stop.is_set():
            return
        t0 = time.monotonic()
        status, _, _ = get(url, timeout=HEALTH_HANG_S)
        latencies.append(time.monotonic() - t0)
        assert status == 200
        time.sleep(0.02)


def run_at_once(base: str, jobs: list[tuple[str, bytes]]) -> tuple[list[Reply], list[float], float]:
    """Send every (path, body) at once while probing /health; -> (replies, latencies, s)."""
    port = int(base.rsplit(":", 1)[1])
    replies: list[Reply] = []
    latencies: list[float] = []
    stop = threading.Event()
    probe = threading.Thread(target=_probe_health, args=(base + "/health", stop, latencies))
    probe.start()
    t0 = time.monotonic()
    senders = [
        threading.Thread(target=_send, args=(port, path, body, replies)) for path, body in jobs
    ]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(90)
    elapsed = time.monotonic() - t0
    time.sleep(0.2)  # a probe or two after the last reply
    stop.set()
    probe.join(15)
    assert len(replies) == len(jobs) and latencies
    return replies, latencies, elapsed
