"""What requests in flight hold, counted in one process-wide memory budget (issue 31), against
the real gateway process in front of the scripted stub.

Protocol facts these tests rely on:

* A thinking block replayed with ``"thinking": ""`` and its signature gets its reasoning
  back from the signature (gateway/messages/from_chat/signatures.py); the gateway holds it, and its
  copy in the upstream payload, until the reply has ended.
* The stub's ``delay:MS`` scenario answers after MS milliseconds: requests stay in flight.
* 529 ``overloaded_error`` is Anthropic's status for an overloaded API; the SDKs retry it.
* ``/proc/PID/status`` ``VmHWM`` is a process's peak resident set since it started.

Everything runs on 127.0.0.1; every request has a timeout, every loop a count.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from gateway.messages.from_chat import signatures
from tests.conftest import stub_config
from tests.procs import metric, post

pytestmark = pytest.mark.e2e

MIB = 2**20
KEY = "memory-budget-test-signing-key-0123456789"
LOOP = "Wait, let me reconsider. The user wants the sum of the list. Let me check again.\n"
REPLAYS = 12
BUDGET_MB = 4  # room for about four replays of 300 KiB (counted twice, reserved first)


def _replay(signature: str) -> bytes:
    return json.dumps(
        {
            "model": "m-delay:2000",
            "max_tokens": 5,
            "messages": [
                {"role": "user", "content": "sum this list"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "", "signature": signature},
                        {"type": "text", "text": "ok"},
                    ],
                },
                {"role": "user", "content": "go on"},
            ],
        }
    ).encode()


def _budget(url: str) -> float:
    return metric(url, "llm_gateway_memory_budget_bytes", budget="memory")


def test_big_replays_in_flight_are_shed_while_small_requests_pass(
    stub_url: str, gateway_factory: Any
) -> None:
    """Twelve replays at once, each restoring 300 KiB of reasoning and waiting two seconds
    for the upstream, with a 4 MiB budget: the ones past the budget get a 529
    ``overloaded_error`` (counted), the others are served, small requests sent meanwhile
    are served, and once all have ended the budget holds nothing. Before the budget held
    reasoning for the request's life, all twelve were served."""
    _, url = gateway_factory(
        stub_config(
            stub_url,
            models=("delay:2000", "ok"),
            extra_server=(f'signing_key_env = "GW_MEMORY_KEY"\nmemory_budget_mb = {BUDGET_MB}'),
        ),
        env={"GW_MEMORY_KEY": KEY},
    )
    signature = signatures.seal(KEY.encode(), LOOP * (300 * 1024 // len(LOOP)))
    body = _replay(signature)
    replies: list[tuple[int, bytes]] = []
    small: list[int] = []
    started = threading.Barrier(REPLAYS + 1)

    def replay() -> None:
        started.wait(10)
        status, _, reply = post(url + "/llm/v1/messages", body, timeout=60)
        replies.append((status, reply))

    threads = [threading.Thread(target=replay) for _ in range(REPLAYS)]
    for t in threads:
        t.start()
    started.wait(10)
    held = 0.0
    for _ in range(20):  # while the replays wait for the upstream
        held = max(held, _budget(url))
        status, _, _ = post(
            url + "/llm/v1/messages",
            {"model": "m-ok", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        small.append(status)
    for t in threads:
        t.join(60)
    statuses = sorted(s for s, _ in replies)
    print(f"replays {statuses}; small {small}; budget held at most {held / MIB:.1f} MiB")
    assert len(replies) == REPLAYS and set(statuses) <= {200, 529}
    assert 1 <= statuses.count(200) and 1 <= statuses.count(529)
    for status, reply in replies:
        if status == 529:
            error = json.loads(reply)
            assert error["type"] == "error"
            assert error["error"]["type"] == "overloaded_error"
    assert small == [200] * 20
    assert 0 < held <= BUDGET_MB * MIB
    assert metric(url, "llm_gateway_memory_budget_sheds_total", budget="memory") == statuses.count(
        529
    )
    assert _budget(url) == 0  # every lease released
    assert metric(url, "llm_gateway_memory_budget_bytes", budget="decoding") == 0


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def test_a_large_batch_create_holds_about_twice_its_body(
    stub_url: str, gateway_factory: Any, tmp_path: Path
) -> None:
    """A create of 30,000 requests (32 MiB) raises the gateway's peak RSS by less than
    three times its body: the bytes, then the encoded requests, one request's objects at a
    time. Decoded whole (and its marshal copy from the decoding child) it was five times
    (100,000 requests of 107 MB: 543 MiB over the idle process, now 235). The memory
    budget holds nothing once the batch is stored."""
    proc, url = gateway_factory(
        stub_config(stub_url, models=("ok",))
        + (
            f'\n[batches]\ndatabase = "sqlite:///{tmp_path}/batches.sqlite3"\n'
            "max_requests = 100000\n"
        )
    )
    text = ("Summarise this document in one sentence. " * 25)[:1000]
    body = json.dumps(
        {
            "requests": [
                {
                    "custom_id": f"req-{i:06d}",
                    "params": {
                        "model": "m-ok",
                        "max_tokens": 16,
                        "messages": [{"role": "user", "content": f"{i}: {text}"}],
                    },
                }
                for i in range(30_000)
            ]
        }
    ).encode()
    idle_kb = _status_kb(proc.pid, "VmRSS")
    status, _, reply = post(url + "/llm/v1/messages/batches", body, timeout=120)
    assert status == 200, reply[:300]
    assert json.loads(reply)["request_counts"]["processing"] == 30_000
    grown = (_status_kb(proc.pid, "VmHWM") - idle_kb) * 1024
    print(
        f"body {len(body) / MIB:.1f} MiB; peak RSS grew {grown / MIB:.0f} MiB "
        f"({grown / len(body):.2f} x the body)"
    )
    assert grown < 3 * len(body)
    assert _budget(url) == 0
