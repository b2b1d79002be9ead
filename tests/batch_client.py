"""Message Batches over raw HTTP: what the batch end-to-end tests share (tests/e2e/
test_batches.py, test_batches_durability.py, test_fallbacks.py, test_upstream_call_codes.py):
a ``[batches]`` config table, request bodies whose text names their ``custom_id`` (so the
stub's record tells which request an upstream call served), create, poll until ended, results.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.conftest import stub_requests
from tests.procs import get, post


def batches_toml(database: str | Path, **knobs: Any) -> str:
    """A ``[batches]`` table on ``database`` with quick polling, plus ``knobs``."""
    knobs = {"poll_interval": 0.2, **knobs}
    lines = ["", "[batches]", f"database = {json.dumps(str(database))}"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in knobs.items()]
    return "\n".join(lines) + "\n"


_NAMED = re.compile(r'"batch request ([A-Za-z0-9_-]{1,64})"')


def text_of(cid: str) -> str:
    """The user message of batch request ``cid``: the stub's record of it names the request."""
    return f"batch request {cid}"


def request(cid: str, model: str, **params: Any) -> dict[str, Any]:
    return {
        "custom_id": cid,
        "params": {
            "model": model,
            "max_tokens": 32,
            "messages": [{"role": "user", "content": text_of(cid)}],
            **params,
        },
    }


def calls_per_id(stub_url: str, cids: list[str]) -> dict[str, int]:
    """Upstream chat calls per custom_id, from every request the stub recorded."""
    counts = dict.fromkeys(cids, 0)
    for seen in stub_requests(stub_url):
        if not seen["path"].endswith("/chat/completions") or not isinstance(seen["body"], dict):
            continue
        named = set(_NAMED.findall(json.dumps(seen["body"].get("messages"))))
        for cid in named & counts.keys():
            counts[cid] += 1
    return counts


def wait_ended(
    base: str, batch_id: str, timeout: float = 30.0, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """Poll a batch (raw HTTP, so any gateway of the store will do) until it has ended."""
    deadline = time.monotonic() + timeout
    while True:
        status, _, body = get(f"{base}/v1/messages/batches/{batch_id}", headers=headers)
        assert status == 200, body
        batch = json.loads(body)
        if batch["processing_status"] == "ended":
            return batch
        assert time.monotonic() < deadline, f"batch did not end within {timeout}s: {batch}"
        time.sleep(0.1)


def results_of(
    base: str, batch_id: str, headers: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    status, _, body = get(f"{base}/v1/messages/batches/{batch_id}/results", headers=headers)
    assert status == 200, body
    return [json.loads(line) for line in body.decode().splitlines()]


def bodyless(
    method: str, url: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    """A body-less request (POST with an empty body): (status, its JSON)."""
    req = urllib.request.Request(
        url, method=method, headers=headers or {}, data=b"" if method == "POST" else None
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def create(
    base: str, requests: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    status, _, body = post(f"{base}/v1/messages/batches", {"requests": requests}, headers=headers)
    return status, json.loads(body)


def assert_error(
    status: int, body: dict[str, Any], want_status: int, error_type: str, mentions: str = ""
) -> None:
    """Anthropic's error envelope: {"type": "error", "error": {"type", "message"}}."""
    assert status == want_status, body
    assert body["type"] == "error", body
    assert body["error"]["type"] == error_type, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
    assert mentions in body["error"]["message"], body
