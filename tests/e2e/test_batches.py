"""Message Batches end to end: real gateway processes, real SDKs, real upstreams.

Against ``llm-gateway --demo`` (the embedded llama.cpp server, model ``demo``) both official
SDKs run the whole life of a batch: create, poll, retrieve, list with pagination, typed
results, cancel (requests never started come back ``canceled``) and delete (refused while the
batch runs, a 404 afterwards). A request with a long prompt takes the tiny model about a
second, so a batch of four of them (``batches.max_in_flight = 1``) is still running when the
client cancels or deletes it.

Against the scripted stub upstream: the create validation table (Anthropic's 400/413
envelopes naming ``requests.N...``), owner isolation by client key, an upstream 4xx as an
``errored`` result, transient 503/529 retried to success, ``results_url`` built from
``batches.public_base_url`` and the prefix, and expiry.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from gateway.demo.tinymodel import ANSWER_TEXT
from tests import sdk
from tests.batch_client import (
    assert_error,
    batches_toml,
    bodyless,
    calls_per_id,
    create,
    request,
    results_of,
    wait_ended,
)
from tests.conftest import clear_stub, stub_config, stub_requests
from tests.logs import access_lines
from tests.node import CLIENTS, ts_sdk_ready
from tests.procs import Proc, free_port, get, post, require_demo_extra, start_gateway, wait_http
from tests.waits import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

BIG_REPEAT = 1500  # "lorem ipsum dolor sit amet " times this: about a second of the demo model
DAY = 86400


# --- the demo: both SDKs on a real llama.cpp upstream ------------------------------------------

DEMO_TOML = """
[server]
host = "127.0.0.1"

# the demo adds its own `demo` route; a config needs one of its own
[upstreams.unused]
base_url = "http://127.0.0.1:9/v1"

[[models]]
name = "unused"
upstream = "unused"
upstream_model = "unused"
"""


@pytest.fixture(scope="module")
def demo_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``llm-gateway --demo`` with one batch request at a time; its base URL with /llm."""
    require_demo_extra()
    folder = tmp_path_factory.mktemp("batches-demo")
    cfg = folder / "demo.toml"
    cfg.write_text(DEMO_TOML + batches_toml(folder / "batches.sqlite3", max_in_flight=1))
    port = free_port()
    proc = Proc(
        [sys.executable, "-m", "gateway", "--demo", "--config", str(cfg), "--port", str(port)]
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=120, proc=proc.popen)
        yield f"http://127.0.0.1:{port}/llm"
    finally:
        proc.stop()


def _sdk_wait(client: anthropic.Anthropic, batch_id: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)


def _demo_params(text: str) -> dict[str, Any]:
    return {"model": "demo", "max_tokens": 100, "messages": [{"role": "user", "content": text}]}


@pytest.mark.llamacpp
@pytest.mark.clients
def test_python_sdk_batch_lifecycle_on_demo(demo_base: str) -> None:
    client = sdk.client(demo_base, api_key="test-key", max_retries=0)
    batches = client.messages.batches
    ids = ["py-a", "py-b", "py-c"]
    made = batches.create(
        requests=[{"custom_id": cid, "params": _demo_params(f"hi {cid}")} for cid in ids]
    )
    assert made.id.startswith("msgbatch_") and made.type == "message_batch"
    assert made.processing_status == "in_progress"
    assert made.request_counts.processing == 3 and made.results_url is None
    assert made.ended_at is None and made.cancel_initiated_at is None
    assert (made.expires_at - made.created_at).total_seconds() == pytest.approx(DAY, abs=1)

    ended = _sdk_wait(client, made.id)
    counts = ended.request_counts
    assert (
        counts.processing,
        counts.succeeded,
        counts.errored,
        counts.canceled,
        counts.expired,
    ) == (0, 3, 0, 0, 0)
    assert ended.ended_at is not None and ended.ended_at >= ended.created_at
    assert ended.results_url == f"{demo_base}/v1/messages/batches/{made.id}/results"
    assert batches.retrieve(made.id).model_dump() == ended.model_dump()

    got = {r.custom_id: r.result for r in batches.results(made.id)}
    assert sorted(got) == ids
    for result in got.values():
        assert result.type == "succeeded"
        message = result.message
        assert message.type == "message" and message.role == "assistant"
        assert message.model == "demo" and message.stop_reason == "end_turn"
        assert [b.text for b in message.content if b.type == "text"] == [ANSWER_TEXT]
        assert message.usage.output_tokens > 0

    # a batch of slow requests: still running when it is deleted (refused) and canceled
    big = "lorem ipsum dolor sit amet " * BIG_REPEAT
    slow_ids = [f"py-slow-{i}" for i in range(4)]
    slow = batches.create(
        requests=[{"custom_id": cid, "params": _demo_params(f"{cid} {big}")} for cid in slow_ids]
    )
    with pytest.raises(anthropic.BadRequestError) as refused:
        batches.delete(slow.id)
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    canceling = batches.cancel(slow.id)
    assert canceling.id == slow.id and canceling.cancel_initiated_at is not None
    assert canceling.processing_status in ("canceling", "ended")
    slow_ended = _sdk_wait(client, slow.id)
    c = slow_ended.request_counts
    assert c.succeeded + c.canceled == 4 and c.errored == c.expired == c.processing == 0
    assert c.canceled >= 2, c  # one request in flight at a time: most never started
    slow_results = {r.custom_id: r.result for r in batches.results(slow.id)}
    assert sorted(slow_results) == slow_ids
    kinds = [r.type for r in slow_results.values()]
    assert kinds.count("canceled") == c.canceled and kinds.count("succeeded") == c.succeeded

    # pagination, newest first, over everything this gateway holds
    every = [b.id for b in batches.list(limit=1000).data]
    assert every[:2] == [slow.id, made.id]
    first = batches.list(limit=1)
    assert [b.id for b in first.data] == [slow.id]
    assert (first.has_more, first.first_id, first.last_id) == (True, slow.id, slow.id)
    older = batches.list(limit=1, after_id=slow.id)
    assert [b.id for b in older.data] == [made.id]
    assert older.has_more == (len(every) > 2)
    newer = batches.list(limit=1, before_id=made.id)
    assert [b.id for b in newer.data] == [slow.id] and newer.has_more is False
    walked, page = [], batches.list(limit=1)
    for _ in range(len(every) + 1):  # the SDK's own auto-pagination follows after_id
        walked += [b.id for b in page.data]
        if not page.has_more:
            break
        page = batches.list(limit=1, after_id=page.last_id)
    assert walked == every
    assert [b.id for b in batches.list(limit=1)] == every  # iterating pages through them all
    empty = batches.list(limit=1, after_id=every[-1])
    assert (empty.data, empty.has_more, empty.first_id, empty.last_id) == ([], False, None, None)

    # delete once ended; then it is gone
    deleted = batches.delete(slow.id)
    assert (deleted.id, deleted.type) == (slow.id, "message_batch_deleted")
    for call in (batches.retrieve, batches.delete, batches.cancel):
        with pytest.raises(anthropic.NotFoundError) as gone:
            call(slow.id)
        assert gone.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert slow.id not in [b.id for b in batches.list(limit=1000).data]


@pytest.mark.llamacpp
@pytest.mark.clients
def test_typescript_sdk_batch_lifecycle_on_demo(demo_base: str) -> None:
    ts_sdk_ready()
    proc = subprocess.run(
        ["node", str(CLIENTS / "ts_batches.mjs"), demo_base, "demo", str(BIG_REPEAT)],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=CLIENTS,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout + proc.stderr
    out = json.loads(lines[-1])
    assert "fatal" not in out, out
    ids = out["ids"]

    assert out["created"]["processing_status"] == "in_progress"
    assert out["created"]["request_counts"]["processing"] == 3
    assert out["ended"]["request_counts"] == {
        "processing": 0,
        "succeeded": 3,
        "errored": 0,
        "canceled": 0,
        "expired": 0,
    }
    assert out["ended"]["results_url"] == (
        f"{demo_base}/v1/messages/batches/{ids['small']}/results"
    )
    assert out["retrieved"] == out["ended"]
    assert sorted(r["custom_id"] for r in out["results"]) == ["ts-a", "ts-b", "ts-c"]
    for r in out["results"]:
        assert (r["type"], r["stop_reason"], r["texts"]) == ("succeeded", "end_turn", [ANSWER_TEXT])

    assert out["deleteRunning"] == {"status": 400, "type": "invalid_request_error"}
    assert out["canceled"]["processing_status"] in ("canceling", "ended")
    assert out["canceled"]["cancel_initiated_at"] is not None
    counts = out["slowEnded"]["request_counts"]
    assert counts["succeeded"] + counts["canceled"] == 4 and counts["canceled"] >= 2, counts
    kinds = [r["type"] for r in out["slowResults"]]
    assert sorted(r["custom_id"] for r in out["slowResults"]) == [f"ts-slow-{i}" for i in range(4)]
    assert kinds.count("canceled") == counts["canceled"]
    assert out["deleted"] == {"id": ids["slow"], "type": "message_batch_deleted"}
    assert out["retrieveDeleted"] == {"status": 404, "type": "not_found_error"}

    # newest first: the third batch, then (the slow one deleted) the small one
    assert out["page1"] == {
        "ids": [ids["third"]],
        "has_more": True,
        "first_id": ids["third"],
        "last_id": ids["third"],
    }
    assert out["page2"]["ids"] == [ids["small"]]
    assert out["page2"]["first_id"] == out["page2"]["last_id"] == ids["small"]
    assert out["page0"] == {"ids": [ids["third"]], "has_more": False}


# --- the stub upstream: validation, failures, retries, owners, URLs --------------------------

STUB_BATCH_MODELS = (
    "ok",
    "tools",
    "reasoning",
    "length",
    "status:400",
    "fail-first:1:503",
    "fail-first:1:529",
    "delay:200",
)
PUBLIC_BASE = "https://batches.example.com/gw"
MAX_REQUESTS = 6
MAX_BODY = 20_000


@pytest.fixture(scope="module")
def stub_base(stub_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One gateway on the stub for the module: small batch limits, a public base URL."""
    folder = tmp_path_factory.mktemp("batches-stub")
    text = stub_config(stub_url, models=STUB_BATCH_MODELS) + batches_toml(
        folder / "batches.sqlite3",
        max_requests=MAX_REQUESTS,
        max_body_bytes=MAX_BODY,
        public_base_url=PUBLIC_BASE + "/",
        max_in_flight=4,
    )
    proc, url = start_gateway(text, folder)
    try:
        yield url + "/llm"
    finally:
        proc.stop()


def _ok_params(**over: Any) -> dict[str, Any]:
    return {
        "model": "m-ok",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
        **over,
    }


def _item(cid: str = "a", **over: Any) -> dict[str, Any]:
    return {"custom_id": cid, "params": _ok_params(**over)}


_NO_MAX_TOKENS = {k: v for k, v in _ok_params().items() if k != "max_tokens"}

VALIDATION = [
    ("empty custom_id", [_item(""), _item("b")], "requests.0.custom_id"),
    ("65-char custom_id", [_item("b"), _item("x" * 65)], "requests.1.custom_id"),
    ("bad character", [_item("a.b")], "requests.0.custom_id"),
    ("space", [_item("a b")], "requests.0.custom_id"),
    ("custom_id not a string", [{"custom_id": 7, "params": _ok_params()}], "requests.0.custom_id"),
    ("duplicate custom_id", [_item("a"), _item("b"), _item("a")], "requests.2.custom_id"),
    ("missing params", [_item("a"), {"custom_id": "b"}], "requests.1.params"),
    ("extra key in a request", [{**_item("a"), "method": "POST"}], "requests.0.method"),
    ("stream true", [_item("a", stream=True)], "requests.0.params.stream"),
    (
        "missing max_tokens",
        [_item("a"), {"custom_id": "b", "params": _NO_MAX_TOKENS}],
        "requests.1.params.max_tokens",
    ),
    ("max_tokens not an integer", [_item("a", max_tokens="many")], "requests.0.params.max_tokens"),
    ("messages empty", [_item("a", messages=[])], "requests.0.params.messages"),
    ("unknown model", [_item("a"), _item("b", model="no-such-model")], "requests.1.params.model"),
    ("empty list", [], "requests"),
    ("too many requests", [_item(f"r{i}") for i in range(MAX_REQUESTS + 1)], "requests"),
]


@pytest.mark.parametrize("requests", [v[1] for v in VALIDATION], ids=[v[0] for v in VALIDATION])
def test_create_validation_is_a_400_naming_the_field(stub_base: str, requests: list[Any]) -> None:
    where = next(v[2] for v in VALIDATION if v[1] is requests)
    before = get(f"{stub_base}/v1/messages/batches?limit=1000")[2]
    status, body = create(stub_base, requests)
    assert_error(status, body, 400, "invalid_request_error", where)
    assert get(f"{stub_base}/v1/messages/batches?limit=1000")[2] == before  # nothing made


@pytest.mark.parametrize(
    "body",
    [
        b'{"requests": [], "extra": 1}',
        b"[1, 2]",
        b"{}",
        b'{"requests": {"a": 1}}',
        b'{"requests": [1]}',
    ],
    ids=[
        "extra top-level key",
        "not an object",
        "no requests",
        "requests not a list",
        "request not an object",
    ],
)
def test_create_rejects_malformed_bodies(stub_base: str, body: bytes) -> None:
    status, _, raw = post(f"{stub_base}/v1/messages/batches", body)
    assert_error(status, json.loads(raw), 400, "invalid_request_error")


def test_a_body_over_max_body_bytes_is_a_413(stub_base: str) -> None:
    before = get(f"{stub_base}/v1/messages/batches?limit=1000")[2]
    status, body = create(
        stub_base, [_item("a", messages=[{"role": "user", "content": "x" * (MAX_BODY + 100)}])]
    )
    assert_error(status, body, 413, "request_too_large")
    assert get(f"{stub_base}/v1/messages/batches?limit=1000")[2] == before


def test_a_chunked_body_over_max_body_bytes_is_a_413(stub_base: str) -> None:
    """No Content-Length to refuse up front: the limit holds while the body is read."""
    host, port = stub_base.split("//")[1].split("/")[0].split(":")
    body = json.dumps(
        {"requests": [_item("a", messages=[{"role": "user", "content": "x" * (MAX_BODY * 3)}])]}
    ).encode()
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(
            "POST",
            "/llm/v1/messages/batches",
            body=iter([body[i : i + 4096] for i in range(0, len(body), 4096)]),
            headers={"Content-Type": "application/json"},
            encode_chunked=True,
        )
        resp = conn.getresponse()
        assert_error(resp.status, json.loads(resp.read()), 413, "request_too_large")
    finally:
        conn.close()


def test_unknown_and_malformed_batch_ids_are_404(stub_base: str) -> None:
    for batch_id in ("msgbatch_doesnotexist0000", "not-a-batch-id"):
        for method, suffix in (
            ("GET", ""),
            ("GET", "/results"),
            ("POST", "/cancel"),
            ("DELETE", ""),
        ):
            status, body = bodyless(method, f"{stub_base}/v1/messages/batches/{batch_id}{suffix}")
            assert_error(status, body, 404, "not_found_error")


def test_results_before_the_end_are_a_400_and_url_honours_public_base(
    stub_url: str, stub_base: str
) -> None:
    ids = ["slow-0", "slow-1"]
    status, made = create(stub_base, [request(cid, "m-delay:200") for cid in ids])
    assert status == 200, made
    assert made["results_url"] is None
    status, _, raw = get(f"{stub_base}/v1/messages/batches/{made['id']}/results")
    assert_error(status, json.loads(raw), 400, "invalid_request_error", made["id"])
    ended = wait_ended(stub_base, made["id"])
    assert ended["results_url"] == (f"{PUBLIC_BASE}/llm/v1/messages/batches/{made['id']}/results")
    assert sorted(r["custom_id"] for r in results_of(stub_base, made["id"])) == ids


def test_upstream_4xx_is_errored_and_503_529_are_retried(stub_url: str, stub_base: str) -> None:
    """An upstream 400 is that request's ``errored`` result, with the error envelope the
    interactive route would answer; a 503 or 529 is retried (after a backoff of about 2 s)
    and the request then succeeds. The others in the batch are unaffected."""
    clear_stub(stub_url)
    plan = {
        "ok-1": "m-ok",
        "bad-1": "m-status:400",
        "flaky-503": "m-fail-first:1:503",
        "flaky-529": "m-fail-first:1:529",
        "ok-2": "m-ok",
    }
    status, made = create(stub_base, [request(cid, model) for cid, model in plan.items()])
    assert status == 200, made
    ended = wait_ended(stub_base, made["id"], timeout=20)
    assert ended["request_counts"] == {
        "processing": 0,
        "succeeded": 4,
        "errored": 1,
        "canceled": 0,
        "expired": 0,
    }
    results = {r["custom_id"]: r["result"] for r in results_of(stub_base, made["id"])}
    assert sorted(results) == sorted(plan)
    err = results["bad-1"]
    assert err["type"] == "errored"
    assert err["error"]["type"] == "error"
    assert err["error"]["error"]["type"] == "invalid_request_error"
    assert "stub says 400" in err["error"]["error"]["message"]
    for cid in ("ok-1", "ok-2", "flaky-503", "flaky-529"):
        message = results[cid]["message"]
        assert results[cid]["type"] == "succeeded"
        assert message["type"] == "message" and message["role"] == "assistant"
        assert message["content"] == [{"type": "text", "text": "Hello from the stub."}]
        assert message["model"] == plan[cid]
    calls = calls_per_id(stub_url, list(plan))
    assert calls == {"ok-1": 1, "bad-1": 1, "flaky-503": 2, "flaky-529": 2, "ok-2": 1}


def test_results_of_more_than_a_page_of_requests(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]], tmp_path: Path
) -> None:
    """The store hands results out 1,000 at a time: 2,345 requests come back once each."""
    clear_stub(stub_url)
    text = stub_config(stub_url, models=("ok",)) + batches_toml(
        tmp_path / "batches.sqlite3", max_in_flight=64
    )
    _, url = gateway_factory(text)
    base = url + "/llm"
    ids = [f"many-{i:04d}" for i in range(2345)]
    status, made = create(base, [request(cid, "m-ok", max_tokens=8) for cid in ids])
    assert status == 200, made
    ended = wait_ended(base, made["id"], timeout=60)
    assert ended["request_counts"]["succeeded"] == len(ids), ended
    results = results_of(base, made["id"])
    assert sorted(r["custom_id"] for r in results) == ids
    assert {r["result"]["type"] for r in results} == {"succeeded"}
    assert calls_per_id(stub_url, ids) == dict.fromkeys(ids, 1)


SAME_AS_INTERACTIVE = {
    "text": _ok_params(),
    "stop sequence": _ok_params(stop_sequences=["stub"], max_tokens=50),
    "tool call": _ok_params(
        model="m-tools", tools=[{"name": "get_weather", "input_schema": {"type": "object"}}]
    ),
    "reasoning": _ok_params(model="m-reasoning"),
    "max_tokens reached": _ok_params(model="m-length", max_tokens=5),
    "system, metadata, temperature": _ok_params(
        system="be brief", temperature=0.2, metadata={"user_id": "u-1"}
    ),
}


def test_a_batch_result_is_the_message_the_interactive_route_answers(stub_base: str) -> None:
    """Each request runs the same Messages path as ``POST /v1/messages``: its result's
    message is the interactive reply (but for the message id)."""
    status, made = create(
        stub_base,
        [
            {"custom_id": f"same-{i}", "params": params}
            for i, params in enumerate(SAME_AS_INTERACTIVE.values())
        ],
    )
    assert status == 200, made
    wait_ended(stub_base, made["id"])
    results = {r["custom_id"]: r["result"] for r in results_of(stub_base, made["id"])}
    for i, (name, params) in enumerate(SAME_AS_INTERACTIVE.items()):
        status, _, raw = post(f"{stub_base}/v1/messages", params)
        assert status == 200, raw
        interactive = json.loads(raw)
        assert results[f"same-{i}"]["type"] == "succeeded", results[f"same-{i}"]
        batched = results[f"same-{i}"]["message"]
        assert batched["id"].startswith("msg_") and batched["id"] != interactive["id"]
        del batched["id"], interactive["id"]
        assert batched == interactive, name


@pytest.fixture
def keyed_base(stub_url: str, tmp_path: Path) -> Iterator[str]:
    text = stub_config(
        stub_url, models=("ok",), extra_server='api_keys_env = "BATCH_KEYS"'
    ) + batches_toml(tmp_path / "batches.sqlite3")
    proc, url = start_gateway(text, tmp_path, env={"BATCH_KEYS": "key-alice,key-bob"})
    try:
        yield url + "/llm"
    finally:
        proc.stop()


def test_a_batch_belongs_to_the_key_that_made_it(keyed_base: str) -> None:
    alice, bob = {"x-api-key": "key-alice"}, {"authorization": "Bearer key-bob"}
    status, body = create(keyed_base, [_item("a")], headers={})
    assert_error(status, body, 401, "authentication_error")
    status, made = create(keyed_base, [_item("a")], headers=alice)
    assert status == 200, made
    batch_id = made["id"]
    wait_ended(keyed_base, batch_id, headers=alice)
    assert len(results_of(keyed_base, batch_id, headers=alice)) == 1
    for method, suffix in (("GET", ""), ("GET", "/results"), ("POST", "/cancel"), ("DELETE", "")):
        status, body = bodyless(
            method, f"{keyed_base}/v1/messages/batches/{batch_id}{suffix}", headers=bob
        )
        assert_error(status, body, 404, "not_found_error")
    status, _, raw = get(f"{keyed_base}/v1/messages/batches", headers=bob)
    assert status == 200
    assert json.loads(raw) == {"data": [], "has_more": False, "first_id": None, "last_id": None}
    status, _, raw = get(f"{keyed_base}/v1/messages/batches", headers=alice)
    assert [b["id"] for b in json.loads(raw)["data"]] == [batch_id]
    # bob's own batch is his alone, and alice's is still there after bob's attempts
    status, mine = create(keyed_base, [_item("b")], headers=bob)
    assert status == 200
    status, _, raw = get(f"{keyed_base}/v1/messages/batches", headers=bob)
    assert [b["id"] for b in json.loads(raw)["data"]] == [mine["id"]]
    assert get(f"{keyed_base}/v1/messages/batches/{batch_id}", headers=alice)[0] == 200


@pytest.mark.timeout(90)
def test_a_batch_past_its_expiry_ends_with_expired_results(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]], tmp_path: Path
) -> None:
    """``expire_after = 2`` with a slow upstream and one request at a time: the batch is past
    its expiry while requests are still queued. The scheduler's sweep ends it (every tenth of
    ``expire_after``, at least a second), the unfinished requests ``expired``."""
    clear_stub(stub_url)
    text = stub_config(stub_url, models=("delay:1500",)) + batches_toml(
        tmp_path / "batches.sqlite3", expire_after=2, max_in_flight=1
    )
    _, url = gateway_factory(text)
    base = url + "/llm"
    ids = [f"exp-{i}" for i in range(4)]
    status, made = create(base, [request(cid, "m-delay:1500") for cid in ids])
    assert status == 200, made
    assert made["request_counts"]["processing"] == 4
    ended = wait_ended(base, made["id"], timeout=45)
    counts = ended["request_counts"]
    assert counts["expired"] >= 2 and counts["succeeded"] + counts["expired"] == 4, counts
    assert counts["errored"] == counts["canceled"] == counts["processing"] == 0
    results = {r["custom_id"]: r["result"] for r in results_of(base, made["id"])}
    assert sorted(results) == ids
    expired = [cid for cid, r in results.items() if r == {"type": "expired"}]
    assert len(expired) == counts["expired"]
    assert all(results[cid]["type"] == "succeeded" for cid in ids if cid not in expired)
    # one at a time, 1.5 s each: the third could start at 3 s at the earliest, past the
    # expiry; a request is never started once its batch has expired
    calls = calls_per_id(stub_url, ids)
    assert {"exp-2", "exp-3"} <= set(expired), results
    assert calls["exp-2"] == calls["exp-3"] == 0, calls
    assert all(calls[cid] <= 1 for cid in ids), calls


def test_list_parameters_are_validated(stub_base: str) -> None:
    batch = "msgbatch_abc123"
    for query, field in (
        ((("limit", "0"),), "limit"),
        ((("limit", "1001"),), "limit"),
        ((("limit", "many"),), "limit"),
        ((("after_id", "nope"),), "after_id"),
        ((("before_id", batch), ("after_id", batch)), "before_id"),
    ):
        qs = "&".join(f"{k}={v}" for k, v in query)
        status, _, raw = get(f"{stub_base}/v1/messages/batches?{qs}")
        assert_error(status, json.loads(raw), 400, "invalid_request_error", field)


def test_an_ended_batch_is_deleted_after_its_retention(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]], tmp_path: Path
) -> None:
    """retention_days = 0.00003 (about 2.6 s); expire_after = 10 makes the sweep run every
    second: an ended batch is kept that long, then gone (404, out of the list)."""
    text = stub_config(stub_url, models=("ok",)) + batches_toml(
        tmp_path / "batches.sqlite3", retention_days=0.00003, expire_after=10
    )
    _, url = gateway_factory(text)
    base = url + "/llm"
    status, made = create(base, [request("kept-a-while", "m-ok")])
    assert status == 200, made
    wait_ended(base, made["id"])
    assert len(results_of(base, made["id"])) == 1  # still there just after the end
    deadline = time.monotonic() + 10
    while get(f"{base}/v1/messages/batches/{made['id']}")[0] == 200:
        assert time.monotonic() < deadline, "the ended batch was never purged"
        time.sleep(0.2)
    status, body = bodyless("GET", f"{base}/v1/messages/batches/{made['id']}/results")
    assert_error(status, body, 404, "not_found_error")
    assert json.loads(get(f"{base}/v1/messages/batches")[2])["data"] == []


def test_batch_work_waits_while_interactive_requests_are_in_flight(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]], tmp_path: Path
) -> None:
    """interactive_threshold = 1: while one interactive request runs on the upstream no batch
    request starts on it; once it has finished, the batch runs."""
    clear_stub(stub_url)
    text = stub_config(stub_url, models=("ok", "slow:50")) + batches_toml(
        tmp_path / "batches.sqlite3", interactive_threshold=1
    )
    _, url = gateway_factory(text)
    base = url + "/llm"
    done: dict[str, Any] = {}

    def interactive() -> None:  # 50 chunks, 50 ms apart: about 2.5 s on the upstream
        done["reply"] = post(
            f"{base}/v1/messages",
            {
                "model": "m-slow:50",
                "max_tokens": 100,
                "stream": True,
                "messages": [{"role": "user", "content": "interactive"}],
            },
            timeout=20,
        )
        done["at"] = time.monotonic()

    worker = threading.Thread(target=interactive)
    worker.start()
    try:
        deadline = time.monotonic() + 5
        while not any(
            r["body"] and r["body"].get("model") == "slow:50" for r in stub_requests(stub_url)
        ):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        status, made = create(base, [request(f"waits-{i}", "m-ok") for i in range(3)])
        assert status == 200, made
        time.sleep(1.0)
        assert calls_per_id(stub_url, [f"waits-{i}" for i in range(3)]) == dict.fromkeys(
            [f"waits-{i}" for i in range(3)], 0
        )
        assert "at" not in done, "the interactive request ended too soon to show anything"
    finally:
        worker.join(20)
    assert done["reply"][0] == 200
    ended = wait_ended(base, made["id"], timeout=10)
    assert ended["request_counts"]["succeeded"] == 3
    assert calls_per_id(stub_url, [f"waits-{i}" for i in range(3)]) == dict.fromkeys(
        [f"waits-{i}" for i in range(3)], 1
    )


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (/proc/PID/stat, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_a_slow_stream_costs_the_gateway_no_scheduler_spin(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]], tmp_path: Path
) -> None:
    """Batches on (the default), nothing queued: while one interactive stream was in flight
    the scheduler's poll deadline stayed past, and it ran round after round; a 6 s stream
    from a slow engine cost the gateway 4.8-5.7 CPU seconds (0.05 with batches off). The
    gateway's own CPU time for the whole stream (50 chunks, 120 ms apart) stays small."""
    clear_stub(stub_url)
    proc, url = gateway_factory(
        stub_config(stub_url, models=("slow:120",))
        + batches_toml(tmp_path / "batches.sqlite3", poll_interval=1.0)
    )
    pid = proc.popen.pid
    time.sleep(2.5)  # past the scheduler's first look (an empty queue) and its next poll
    before = _cpu_seconds(pid)
    status, _, body = post(
        f"{url}/llm/v1/messages",
        {
            "model": "m-slow:120",
            "max_tokens": 100,
            "stream": True,
            "messages": [{"role": "user", "content": "interactive"}],
        },
        timeout=30,
    )
    used = _cpu_seconds(pid) - before
    assert status == 200 and b"message_stop" in body
    print(f"gateway CPU for one 6 s stream, batches on: {used:.3f} s")
    assert used < 0.5, used  # spinning: 1.7-5.7 s; now a few hundredths


def _sample(metrics: str, name: str, **labels: str) -> float:
    """One sample's value from a Prometheus exposition (0.0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in metrics.splitlines():
        head, _, value = line.rpartition(" ")
        if head == (f"{name}{{{want}}}" if want else name):
            return float(value)
    return 0.0


def test_batch_runs_are_counted_and_logged(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]], tmp_path: Path
) -> None:
    """Each run of a batch request is counted by outcome per model and writes an access line
    marked ``batch_request`` with its batch and custom id; the batch gauges follow the store
    (expire_after = 20 sweeps every 2 s)."""
    clear_stub(stub_url)
    models = ("ok", "status:400", "fail-first:1:503")
    proc, url = gateway_factory(
        stub_config(stub_url, models=models)
        + batches_toml(tmp_path / "batches.sqlite3", expire_after=20, max_in_flight=4)
    )
    plan = {"fine": "m-ok", "refused": "m-status:400", "flaky": "m-fail-first:1:503"}
    status, made = create(url + "/llm", [request(cid, model) for cid, model in plan.items()])
    assert status == 200, made
    wait_ended(url + "/llm", made["id"], timeout=20)
    deadline = time.monotonic() + 6
    while True:  # the gauges: at the next sweep
        _, _, raw = get(url + "/metrics")
        metrics = raw.decode()
        if _sample(metrics, "llm_gateway_batches", status="ended") == 1.0:
            break
        assert time.monotonic() < deadline, metrics
        time.sleep(0.2)
    counted = {
        (model, outcome): _sample(
            metrics, "llm_gateway_batch_requests_total", model=model, outcome=outcome
        )
        for model in plan.values()
        for outcome in ("succeeded", "errored", "retried")
    }
    assert {k: v for k, v in counted.items() if v} == {
        ("m-ok", "succeeded"): 1.0,
        ("m-status:400", "errored"): 1.0,
        ("m-fail-first:1:503", "retried"): 1.0,
        ("m-fail-first:1:503", "succeeded"): 1.0,
    }
    assert _sample(metrics, "llm_gateway_batches_created_total") == 1.0
    assert _sample(metrics, "llm_gateway_batches", status="in_progress") == 0.0
    # the log is buffered (flushed on a timer): every run's line, once it is written
    wait_until(
        lambda: len(access_lines(proc.output(), route="batch_request")) >= 4,
        "the four runs' access lines",
        timeout=10,
        every=0.2,
    )
    lines = access_lines(proc.output(), route="batch_request")
    runs = sorted((e["custom_id"], e["attempt"], e["status"], e["error_type"]) for e in lines)
    assert runs == [
        ("fine", 1, 200, None),
        ("flaky", 1, 529, "overloaded_error"),
        ("flaky", 2, 200, None),
        ("refused", 1, 400, "invalid_request_error"),
    ]
    assert {e["batch_id"] for e in lines} == {made["id"]}
    assert all(e["upstream"] == "stub" and e["method"] is None for e in lines)
