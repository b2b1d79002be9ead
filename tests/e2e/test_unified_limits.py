"""A client's daily budget in the ``anthropic-ratelimit-unified-*`` headers of the Claude
Code gateway protocol, through the real gateway process: on buffered and streamed Messages
replies, the OpenAI pass-through, and refusals before and after the charge; a spent budget
is ``429 billing_error`` with ``x-should-retry: false``, which neither SDK retries."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import sdk
from tests.conftest import stub_config
from tests.procs import Proc, get, post

pytestmark = pytest.mark.e2e

U = "anthropic-ratelimit-unified-"
CLAIMS = (U + "representative-claim", U + "overage-status")
KEYS = {
    "KEY_WARN": "k-warn",
    "KEY_SPENT": "k-spent",
    "KEY_FAIL": "k-fail",
    "KEY_RPM": "k-rpm",
    "KEY_FREE": "k-free",
}
CLIENTS = """
[[clients]]
name = "warn"
key_env = "KEY_WARN"
models = ["m-ok"]
tokens_per_day = 10000

[[clients]]
name = "spent"
key_env = "KEY_SPENT"
tokens_per_day = 20

[[clients]]
name = "fail"
key_env = "KEY_FAIL"
tokens_per_day = 100000

[[clients]]
name = "rpm"
key_env = "KEY_RPM"
requests_per_minute = 600

[[clients]]
name = "free"
key_env = "KEY_FREE"
"""


@pytest.fixture(scope="module")
def base(stub_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.procs import start_gateway

    tmp = tmp_path_factory.mktemp("unified")
    cfg = stub_config(stub_url, models=("ok", "status:500:traceback")) + CLIENTS
    proc: Proc
    proc, url = start_gateway(cfg, tmp, env=KEYS)
    try:
        yield url
    finally:
        proc.stop()


def _unified(headers: httpx.Headers | dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if k.lower().startswith(U)}


def _ask(base: str, key: str, chars: int = 2) -> httpx.Response:
    client = sdk.client(base + "/llm", api_key=key, max_retries=0)
    return client.messages.with_raw_response.create(  # type: ignore[return-value]
        model="m-ok", max_tokens=8000, messages=_prompt(chars)
    )


def _prompt(chars: int) -> list[dict[str, str]]:
    """A prompt the gateway estimates at about chars / 4 tokens (the request's bytes / 4):
    what the budget holds until the reply settles it (the stub's reply uses 17)."""
    return [{"role": "user", "content": "x" * chars}]


# the prompt's size against the 10,000-token day (max_tokens is not taken from a budget):
# status, surpassed threshold, utilization at least
STEPS = [
    (2, "allowed", None, 0.0),
    (32_000, "allowed_warning", "0.75", 0.80),
    (38_400, "allowed_warning", "0.95", 0.95),
    (2, "allowed", None, 0.0),  # settled: the day is nearly whole again
]


@pytest.mark.parametrize(("chars", "status", "passed", "at_least"), STEPS)
def test_a_buffered_reply_reports_the_budget(
    base: str, chars: int, status: str, passed: str | None, at_least: float
) -> None:
    t0 = time.time()
    raw = _ask(base, KEYS["KEY_WARN"], chars)
    h = _unified(raw.headers)
    assert h[U + "status"] == status
    assert h[U + "representative-claim"] == "overage"  # not 5h/7d: a daily budget
    assert h[U + "overage-status"] == status
    assert h.get(U + "overage-surpassed-threshold") == passed
    util = float(h[U + "overage-utilization"])
    assert at_least <= util < 1 and len(h[U + "overage-utilization"]) == 4  # "0.NN"
    # unix seconds, when the day's meter is full again: later than now, within a day
    reset = int(h[U + "reset"])
    assert h[U + "overage-reset"] == str(reset)
    assert t0 <= reset <= t0 + 86400 + 5
    # the plain headers are there as before
    assert raw.headers["anthropic-ratelimit-tokens-limit"] == "10000"


def test_a_stream_has_them_before_its_first_byte(base: str) -> None:
    client = sdk.client(base + "/llm", api_key=KEYS["KEY_WARN"], max_retries=0)
    with client.messages.with_streaming_response.create(
        model="m-ok", max_tokens=8000, messages=_prompt(32_000), stream=True
    ) as resp:
        h = _unified(resp.headers)
        assert h[U + "status"] == "allowed_warning"
        assert h[U + "overage-surpassed-threshold"] == "0.75"
        assert h[U + "representative-claim"] == "overage"
        assert b"message_stop" in b"".join(resp.iter_bytes())


@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_pass_through_reports_them(base: str, stream: bool) -> None:
    client = openai.OpenAI(base_url=base + "/llm/v1", api_key=KEYS["KEY_WARN"], max_retries=0)
    try:
        with client.chat.completions.with_streaming_response.create(
            model="m-ok",
            max_tokens=8000,
            messages=_prompt(32_000),  # type: ignore[arg-type]
            stream=stream,
        ) as resp:
            h = _unified(resp.headers)
            resp.read()
    finally:
        client.close()
    assert h[U + "status"] == "allowed_warning" and h[U + "representative-claim"] == "overage"
    assert h[U + "overage-surpassed-threshold"] == "0.75"


# refusals: the request, the status and error type; none of them carries the claim (a 429's
# would make Claude Code print its own line instead of the message)
REFUSALS = [
    # before the charge: validation, routing (unknown model, a model outside the list)
    ({"model": "m-ok", "max_tokens": 5}, 400, "invalid_request_error"),
    (
        {"model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        404,
        "not_found_error",
    ),
    (
        {
            "model": "m-status:500:traceback",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}],
        },
        403,
        "permission_error",
    ),
]


@pytest.mark.parametrize(("body", "status", "etype"), REFUSALS)
def test_refusals_before_the_charge_report_the_budget(
    base: str, body: dict[str, object], status: int, etype: str
) -> None:
    got, headers, raw = post(base + "/llm/v1/messages", body, {"x-api-key": KEYS["KEY_WARN"]})
    assert got == status and json.loads(raw)["error"]["type"] == etype
    h = _unified(headers)
    assert h[U + "status"] in ("allowed", "allowed_warning")
    assert float(h[U + "overage-utilization"]) < 1
    assert not set(CLAIMS) & set(h)
    assert headers["anthropic-ratelimit-tokens-limit"] == "10000"


def test_an_upstream_error_after_the_charge_reports_the_budget(base: str) -> None:
    got, headers, _ = post(
        base + "/llm/v1/messages",
        {
            "model": "m-status:500:traceback",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}],
        },
        {"x-api-key": KEYS["KEY_FAIL"]},
    )
    assert got == 500
    h = _unified(headers)
    assert h[U + "status"] == "allowed" and not set(CLAIMS) & set(h)


def _counting(module: Any) -> tuple[Any, list[str]]:
    """An HTTP client of ``module`` (the anthropic SDK's httpx2, the openai SDK's httpx) that
    notes the path of every request it sends."""
    sent: list[str] = []
    return module.Client(event_hooks={"request": [lambda r: sent.append(r.url.path)]}), sent


def _spend(base: str) -> None:
    """Spend the 20-token day: a request needs at most the whole day (its estimate and
    max_tokens, over 20, are capped at 20), so the first passes when the meter is full; the
    stub's reply then uses 17, and the next request waits most of a day for its 20."""
    got, _, _ = post(
        base + "/llm/v1/messages",
        {"model": "m-ok", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
        {"x-api-key": KEYS["KEY_SPENT"]},
    )
    assert got in (200, 429)  # 429: spent already


def _rejected(base: str) -> float:
    _, _, raw = get(base + "/metrics", headers={"x-api-key": KEYS["KEY_FREE"]})
    return sum(
        s.value
        for f in text_string_to_metric_families(raw.decode())
        for s in f.samples
        if s.name == "llm_gateway_rejected_total" and s.labels.get("reason") == "budget_spent"
    )


def test_a_spent_budget_is_a_billing_error_the_sdk_does_not_retry(base: str) -> None:
    _spend(base)
    before = _rejected(base)
    http, sent = _counting(httpx2)
    client = sdk.client(base + "/llm", api_key=KEYS["KEY_SPENT"], http_client=http)  # 2 retries
    with pytest.raises(anthropic.RateLimitError) as caught:
        client.messages.create(
            model="m-ok", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    assert sent == ["/llm/v1/messages"]  # one request: x-should-retry: false stopped the SDK
    err = caught.value
    assert err.status_code == 429
    assert err.body["error"]["type"] == "billing_error"  # type: ignore[index]
    assert "daily budget of 20 tokens" in err.message and "fits again in" in err.message
    headers = err.response.headers
    assert headers["x-should-retry"] == "false"
    retry = int(headers["retry-after"])
    assert retry > 3600  # 20 a day refill 1 in 72 minutes
    h = _unified(headers)
    assert h == {
        U + "status": "rejected",
        U + "reset": h[U + "reset"],
        U + "overage-reset": h[U + "reset"],
        U + "overage-utilization": "1",
        U + "overage-surpassed-threshold": "1",
        U + "overage-period": "daily",
        U + "overage-disabled-reason": "org_spend_cap_reached",
    }
    assert abs(int(h[U + "reset"]) - (time.time() + retry)) < 60
    assert _rejected(base) == before + 1


def test_the_openai_sdk_does_not_retry_it_either(base: str) -> None:
    _spend(base)
    http, sent = _counting(httpx)
    client = openai.OpenAI(base_url=base + "/llm/v1", api_key=KEYS["KEY_SPENT"], http_client=http)
    try:
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(
                model="m-ok", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
            )
    finally:
        client.close()
    assert sent == ["/llm/v1/chat/completions"]
    assert caught.value.response.json()["error"]["type"] == "insufficient_quota"
    assert _unified(caught.value.response.headers)[U + "status"] == "rejected"


@pytest.mark.parametrize("key", ["KEY_RPM", "KEY_FREE"])
def test_no_budget_no_unified_header(base: str, key: str) -> None:
    raw = _ask(base, KEYS[key])
    assert raw.status_code == 200 and not _unified(raw.headers)
    assert "strict-transport-security" not in raw.headers  # plain http: no HSTS
