"""Usage per client in the Admin API's shape, end to end: a real gateway process with two
named clients and an admin key, the scripted stub upstream, the official Python SDK.

Alice and Bob make Messages requests (buffered, streamed, a reply with cached prompt tokens),
an OpenAI pass-through request and a message batch (counted against its owner); the usage
report (``GET /v1/organizations/usage_report/messages``, grouped by ``api_key_id`` and
``model``) then holds exactly the usage their replies carried. A client's key is a 403, no
key a 401, a bad parameter a 400 naming it; the per-client series count both clients.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import pytest

from tests import sdk
from tests.batch_client import batches_toml, create, wait_ended
from tests.conftest import stub_config
from tests.procs import get, post, start_gateway

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

KEYS = {"alice": "alice-key-1", "bob": "bob-key-2"}
ADMIN = "admin-key-3"
CLIENTS = """
[[clients]]
name = "alice"
key_env = "ALICE_KEY"

[[clients]]
name = "bob"
key_env = "BOB_KEY"
"""
REPORT = "/llm/v1/organizations/usage_report/messages"


def _add(spent: dict[tuple[str, str], Counter[str]], who: str, model: str, usage: Any) -> None:
    c = spent.setdefault((who, model), Counter())
    c["uncached_input_tokens"] += usage.input_tokens
    c["cache_read_input_tokens"] += usage.cache_read_input_tokens or 0
    c["output_tokens"] += usage.output_tokens


def _report(base: str, key: str | None, **params: Any) -> tuple[int, dict[str, Any]]:
    query = urlencode(params, doseq=True)
    status, _, body = get(f"{base}{REPORT}?{query}", headers={"x-api-key": key} if key else {})
    return status, json.loads(body)


@pytest.fixture(scope="module")
def gateway(stub_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp_path = tmp_path_factory.mktemp("usage")
    cfg = stub_config(
        stub_url, extra_server='admin_keys_env = "ADMIN_KEYS"', models=("ok", "cached")
    )
    cfg += CLIENTS + batches_toml(tmp_path / "gw.sqlite3")
    env = {"ALICE_KEY": KEYS["alice"], "BOB_KEY": KEYS["bob"], "ADMIN_KEYS": ADMIN}
    proc, base = start_gateway(cfg, tmp_path, env=env)
    yield base
    proc.stop()


def test_the_report_holds_each_clients_usage_exactly(gateway: str) -> None:
    base = gateway
    spent: dict[tuple[str, str], Counter[str]] = {}
    alice = sdk.client(base + "/llm", api_key=KEYS["alice"], max_retries=0)
    bob = sdk.client(base + "/llm", api_key=KEYS["bob"], max_retries=0)
    ask = [{"role": "user", "content": "hi"}]
    for _ in range(2):
        msg = alice.messages.create(model="m-ok", max_tokens=64, messages=ask)
        _add(spent, "alice", "m-ok", msg.usage)
    with alice.messages.stream(model="m-cached", max_tokens=64, messages=ask) as stream:
        _add(spent, "alice", "m-cached", stream.get_final_message().usage)
    msg = bob.messages.create(model="m-cached", max_tokens=64, messages=ask)
    assert msg.usage.cache_read_input_tokens  # the report's cache reads are tested too
    _add(spent, "bob", "m-cached", msg.usage)
    # the OpenAI pass-through: its usage as the upstream reports it
    status, _, body = post(
        base + "/llm/v1/chat/completions",
        {"model": "m-ok", "messages": ask},
        headers={"authorization": f"Bearer {KEYS['bob']}"},
    )
    assert status == 200, body
    u = json.loads(body)["usage"]
    c = spent.setdefault(("bob", "m-ok"), Counter())
    c["uncached_input_tokens"] += u["prompt_tokens"]
    c["output_tokens"] += u["completion_tokens"]
    # a batch: its requests are its owner's
    status, batch = create(
        base + "/llm",
        [{"custom_id": "b1", "params": {"model": "m-ok", "max_tokens": 64, "messages": ask}}],
        headers={"x-api-key": KEYS["bob"]},
    )
    assert status == 200, batch
    wait_ended(base + "/llm", batch["id"], headers={"x-api-key": KEYS["bob"]})
    for result in bob.messages.batches.results(batch["id"]):
        assert result.result.type == "succeeded"
        _add(spent, "bob", "m-ok", result.result.message.usage)

    start = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    status, report = _report(
        base, ADMIN, starting_at=start, **{"group_by[]": ["api_key_id", "model"]}
    )
    assert status == 200, report
    assert report["has_more"] is False and report["next_page"] is None
    got: dict[tuple[str, str], Counter[str]] = {}
    for bucket in report["data"]:
        for r in bucket["results"]:
            assert r["cache_creation"] == {
                "ephemeral_1h_input_tokens": 0,
                "ephemeral_5m_input_tokens": 0,
            }
            assert r["server_tool_use"] == {"web_search_requests": 0}
            g = got.setdefault((r["api_key_id"], r["model"]), Counter())
            for k in ("uncached_input_tokens", "cache_read_input_tokens", "output_tokens"):
                g[k] += r[k]
    assert got == spent

    # one client, by the minute, ungrouped: alice's total
    status, report = _report(
        base, ADMIN, starting_at=start, bucket_width="1h", limit=48, **{"api_key_ids[]": "alice"}
    )
    assert status == 200, report
    total = sum(r["output_tokens"] for b in report["data"] for r in b["results"])
    assert total == sum(v["output_tokens"] for (who, _), v in spent.items() if who == "alice")
    assert all(r["api_key_id"] is None for b in report["data"] for r in b["results"])

    # the per-client series
    auth = {"x-api-key": KEYS["alice"]}
    status, _, text = get(base + "/metrics", headers=auth)
    assert status == 200
    assert metric_of(text, "llm_gateway_client_requests_total", client="alice") == 3
    assert metric_of(text, "llm_gateway_client_tokens_total", client="bob", type="output") == sum(
        v["output_tokens"] for (who, _), v in spent.items() if who == "bob"
    )


def metric_of(text: bytes, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        s.value
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


@pytest.mark.parametrize(
    ("key", "params", "status", "error_type", "mentions"),
    [
        (None, {"starting_at": "2026-01-01T00:00:00Z"}, 401, "authentication_error", ""),
        ("not-a-key", {"starting_at": "2026-01-01T00:00:00Z"}, 401, "authentication_error", ""),
        (KEYS["alice"], {"starting_at": "2026-01-01T00:00:00Z"}, 403, "permission_error", "admin"),
        (ADMIN, {}, 400, "invalid_request_error", "starting_at"),
        (
            ADMIN,
            {"starting_at": "2026-01-01T00:00:00Z", "limit": "99"},
            400,
            "invalid_request_error",
            "limit",
        ),
        (
            ADMIN,
            {"starting_at": "2026-01-01T00:00:00Z", "bucket_width": "1w"},
            400,
            "invalid_request_error",
            "bucket_width",
        ),
        (
            ADMIN,
            {"starting_at": "2026-01-01T00:00:00Z", "workspace_ids[]": "w"},
            400,
            "invalid_request_error",
            "workspace_ids",
        ),
    ],
)
def test_who_may_ask_and_what(
    gateway: str,
    key: str | None,
    params: dict[str, str],
    status: int,
    error_type: str,
    mentions: str,
) -> None:
    got, body = _report(gateway, key, **params)
    assert got == status, body
    assert body["type"] == "error" and body["error"]["type"] == error_type
    assert mentions in body["error"]["message"]


def test_the_admin_key_is_no_client_key(gateway: str) -> None:
    """An admin key reads usage only: the Messages API does not take it."""
    status, _, body = post(
        gateway + "/llm/v1/messages",
        {"model": "m-ok", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": ADMIN},
    )
    assert status == 401, body
