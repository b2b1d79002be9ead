"""Named clients through the real gateway: who a key is, what it may use, what it may see.

One gateway in front of the stub upstream with the keys of ``server.api_keys_env`` (the
client ``anonymous``) beside two ``[[clients]]``: alice (``key_env``, models ``m-ok`` and the
pattern ``m-status*``) and bob (``key_sha256``, every model).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import sdk
from tests.batch_client import assert_error, batches_toml, bodyless, create, results_of, wait_ended
from tests.conftest import stub_config
from tests.procs import get, post, start_gateway

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

ANON, ALICE, BOB = "anon-key-1", "alice-key-1", "bob-key-1"
MODELS = ("ok", "slow:5", "status:503", "status:429")
CLIENTS = f"""
[[clients]]
name = "alice"
key_env = "ALICE_KEY"
models = ["m-ok", "m-status*"]

[[clients]]
name = "bob"
key_sha256 = "{hashlib.sha256(BOB.encode()).hexdigest()}"
"""


@pytest.fixture(scope="module")
def base(stub_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("tenancy")
    text = (
        stub_config(stub_url, extra_server='api_keys_env = "ANON_KEYS"', models=MODELS)
        + CLIENTS
        + batches_toml(folder / "batches.sqlite3")
    )
    proc, url = start_gateway(text, folder, env={"ANON_KEYS": ANON, "ALICE_KEY": ALICE})
    try:
        yield url
    finally:
        proc.stop()


def _ask(base: str, key: str | None, model: str = "m-ok") -> tuple[int, dict[str, Any]]:
    headers = {"anthropic-version": "2023-06-01", **({"x-api-key": key} if key else {})}
    body = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    status, _, raw = post(f"{base}/llm/v1/messages", body, headers=headers)
    return status, json.loads(raw)


# (case id, key, model, status, error type or None)
ANSWERS: list[tuple[str, str | None, str, int, str | None]] = [
    ("anonymous key, any model", ANON, "m-slow:5", 200, None),
    ("alice, a listed model", ALICE, "m-ok", 200, None),
    ("alice, a model by her pattern", ALICE, "m-status:503", 529, "overloaded_error"),
    ("alice, a model outside her list", ALICE, "m-slow:5", 403, "permission_error"),
    ("alice, an unknown model is still a 404", ALICE, "m-nothing", 404, "not_found_error"),
    ("bob (key_sha256), any model", BOB, "m-slow:5", 200, None),
    ("an unknown key", "mallory-key", "m-ok", 401, "authentication_error"),
    (
        "a key's digest is not the key",
        hashlib.sha256(BOB.encode()).hexdigest(),
        "m-ok",
        401,
        "authentication_error",
    ),
    ("no key", None, "m-ok", 401, "authentication_error"),
]


@pytest.mark.parametrize(
    "key,model,status,error", [a[1:] for a in ANSWERS], ids=[a[0] for a in ANSWERS]
)
def test_answers(base: str, key: str | None, model: str, status: int, error: str | None) -> None:
    got, body = _ask(base, key, model)
    if error is None:
        assert got == status and body["type"] == "message", body
    else:
        assert_error(got, body, status, error)
        assert "Traceback" not in body["error"]["message"]


def _denied(base: str) -> float:
    """rejected_total{reason="model_denied"} summed over the APIs (/metrics asks for a key
    where keys are configured)."""
    _, _, raw = get(f"{base}/metrics", headers={"x-api-key": ANON})
    return sum(
        s.value
        for f in text_string_to_metric_families(raw.decode())
        for s in f.samples
        if s.name == "llm_gateway_rejected_total" and s.labels.get("reason") == "model_denied"
    )


def test_a_denied_model_is_the_sdks_permission_error_and_counted(base: str) -> None:
    before = _denied(base)
    client = sdk.client(base + "/llm", api_key=ALICE, max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError) as info:
        client.messages.create(
            model="m-slow:5", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    assert info.value.status_code == 403
    assert info.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    assert "m-slow:5" in info.value.message
    # streamed, the refusal comes before any event
    with pytest.raises(anthropic.PermissionDeniedError):
        with client.messages.stream(
            model="m-slow:5", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            stream.until_done()
    assert _denied(base) == before + 2
    with pytest.raises(anthropic.AuthenticationError):
        sdk.client(base + "/llm", api_key="nobody", max_retries=0).messages.create(
            model="m-ok", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )


# (case id, key, the model ids /v1/models lists)
LISTS = [
    ("alice: her models only", ALICE, ["m-ok", "m-status:503", "m-status:429"]),
    ("bob: every model", BOB, ["m-ok", "m-slow:5", "m-status:503", "m-status:429"]),
    ("anonymous: every model", ANON, ["m-ok", "m-slow:5", "m-status:503", "m-status:429"]),
]


@pytest.mark.parametrize("key,ids", [c[1:] for c in LISTS], ids=[c[0] for c in LISTS])
@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_models_lists_what_the_client_may_use(
    base: str, key: str, ids: list[str], dialect: str
) -> None:
    headers = {"x-api-key": key}
    if dialect == "anthropic":
        headers["anthropic-version"] = "2023-06-01"
    status, _, raw = get(f"{base}/llm/v1/models", headers=headers)
    assert status == 200
    assert sorted(m["id"] for m in json.loads(raw)["data"]) == sorted(ids)


def test_another_clients_model_is_unknown(base: str) -> None:
    for headers in ({"anthropic-version": "2023-06-01"}, {}):
        status, _, raw = get(
            f"{base}/llm/v1/models/m-slow:5", headers={"x-api-key": ALICE, **headers}
        )
        assert status == 404, raw
        assert b"m-slow:5" in raw  # named as a model nobody serves is
        assert get(f"{base}/llm/v1/models/m-ok", headers={"x-api-key": ALICE, **headers})[0] == 200
        assert (
            get(f"{base}/llm/v1/models/m-slow:5", headers={"x-api-key": BOB, **headers})[0] == 200
        )
    assert sdk.client(base + "/llm", api_key=ALICE).models.retrieve("m-ok").id == "m-ok"
    with pytest.raises(anthropic.NotFoundError):
        sdk.client(base + "/llm", api_key=ALICE, max_retries=0).models.retrieve("m-slow:5")


def test_batches_belong_to_the_key_that_made_them(base: str) -> None:
    alice, bob, anon = ({"x-api-key": k} for k in (ALICE, BOB, ANON))
    llm = base + "/llm"
    item = {
        "custom_id": "a",
        "params": {
            "model": "m-ok",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "x"}],
        },
    }
    status, made = create(llm, [item], headers=alice)
    assert status == 200, made
    wait_ended(llm, made["id"], headers=alice)
    assert len(results_of(llm, made["id"], headers=alice)) == 1
    for other in (bob, anon):
        status, body = bodyless("GET", f"{llm}/v1/messages/batches/{made['id']}", headers=other)
        assert_error(status, body, 404, "not_found_error")
        _, _, raw = get(f"{llm}/v1/messages/batches", headers=other)
        assert made["id"] not in [b["id"] for b in json.loads(raw)["data"]]
    _, _, raw = get(f"{llm}/v1/messages/batches", headers=alice)
    assert made["id"] in [b["id"] for b in json.loads(raw)["data"]]
    # a batch request for a model outside the client's list is refused at create
    denied = {"custom_id": "b", "params": {**item["params"], "model": "m-slow:5"}}
    status, body = create(llm, [item, denied], headers=alice)
    assert_error(status, body, 403, "permission_error", "requests.1.params.model")
    assert create(llm, [denied], headers=bob)[0] == 200


def test_no_key_configured_everyone_is_anonymous(stub_url: str, tmp_path: Path) -> None:
    proc, url = start_gateway(stub_config(stub_url, models=("ok",)), tmp_path)
    try:
        for key in (None, "anything"):
            status, body = _ask(url, key)
            assert status == 200, body
    finally:
        proc.stop()
