"""A client's limits through the real gateway process and the SDKs: the 429 the Python SDK
raises as ``RateLimitError`` with ``retry-after`` and the ``anthropic-ratelimit-*`` headers,
the SDK's own retry honouring ``retry-after``, the headers on a 200 (buffered and streamed)
and on an error, the OpenAI pass-through's 429, the 403 of a model outside the list, and the
settling of the estimate from the reply's usage."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import anthropic
import openai
import pytest

from tests import sdk
from tests.batch_client import batches_toml, create, wait_ended
from tests.conftest import stub_config
from tests.logs import wait_for_line
from tests.procs import Proc

pytestmark = pytest.mark.e2e

KEYS = {
    "KEY_TIGHT": "k-tight",
    "KEY_SECOND": "k-second",
    "KEY_DAY": "k-day",
    "KEY_FREE": "k-free",
    "KEY_OWNER": "k-owner",
}
CLIENTS = """
[[clients]]
name = "tight"
key_env = "KEY_TIGHT"
models = ["m-ok"]
requests_per_minute = 2
output_tokens_per_minute = 100000

[[clients]]
name = "second"
key_env = "KEY_SECOND"
requests_per_minute = 60

[[clients]]
name = "day"
key_env = "KEY_DAY"
tokens_per_day = 86400

[[clients]]
name = "free"
key_env = "KEY_FREE"

[[clients]]
name = "owner"
key_env = "KEY_OWNER"
tokens_per_day = 86400
"""
RATE_HEADERS = ("limit", "remaining", "reset")


@pytest.fixture(scope="module")
def limited(stub_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, str]]:
    from tests.procs import start_gateway

    tmp = tmp_path_factory.mktemp("limits")
    cfg = stub_config(stub_url, models=("ok", "status:500:traceback")) + CLIENTS
    proc, url = start_gateway(cfg + batches_toml(tmp / "batches.sqlite3"), tmp, env=KEYS)
    try:
        yield proc, url + "/llm"
    finally:
        proc.stop()


def _ask(
    client: anthropic.Anthropic, model: str = "m-ok", max_tokens: int = 1000
) -> anthropic.types.Message:
    return client.messages.create(
        model=model, max_tokens=max_tokens, messages=[{"role": "user", "content": "hi"}]
    )


def _ratelimit(headers: object, kind: str) -> dict[str, str]:
    return {
        part: headers[f"anthropic-ratelimit-{kind}-{part}"]  # type: ignore[index]
        for part in RATE_HEADERS
        if f"anthropic-ratelimit-{kind}-{part}" in headers  # type: ignore[operator]
    }


def test_rate_limit_error_through_the_sdk(limited: tuple[Proc, str]) -> None:
    _, url = limited
    client = sdk.client(url, api_key=KEYS["KEY_TIGHT"], max_retries=0)
    ok = client.messages.with_raw_response.create(
        model="m-ok", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
    )
    # a 200 carries the headers of every limit the client has, and only those
    assert _ratelimit(ok.headers, "requests")["limit"] == "2"
    assert _ratelimit(ok.headers, "requests")["remaining"] == "1"
    assert _ratelimit(ok.headers, "output-tokens")["limit"] == "100000"
    assert _ratelimit(ok.headers, "tokens")["limit"] == "100000"
    assert "anthropic-ratelimit-input-tokens-limit" not in ok.headers
    assert ok.headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    _ask(client)
    with pytest.raises(anthropic.RateLimitError) as caught:
        _ask(client)
    err = caught.value
    assert err.status_code == 429
    assert err.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert "2 requests per minute" in err.message
    headers = err.response.headers
    assert 1 <= int(headers["retry-after"]) <= 30
    assert _ratelimit(headers, "requests")["remaining"] == "0"
    assert set(_ratelimit(headers, "output-tokens")) == set(RATE_HEADERS)
    assert headers["request-id"]


def test_model_outside_the_list_is_403(limited: tuple[Proc, str]) -> None:
    _, url = limited
    client = sdk.client(url, api_key=KEYS["KEY_TIGHT"], max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError) as caught:
        _ask(client, "m-status:500:traceback")  # configured, not on the client's list
    assert caught.value.status_code == 403
    assert caught.value.body["error"]["type"] == "permission_error"  # type: ignore[index]


def test_sdk_retry_honours_retry_after(limited: tuple[Proc, str]) -> None:
    proc, url = limited
    spent = sdk.client(url, api_key=KEYS["KEY_SECOND"], max_retries=0)
    retrying = sdk.client(url, api_key=KEYS["KEY_SECOND"])  # default settings: max_retries 2
    for _ in range(5):  # a loaded machine may let the bucket refill in between: again
        for _ in range(100):  # 60 a minute: spend the bucket until it refuses
            try:
                _ask(spent, max_tokens=5)
            except anthropic.RateLimitError as exc:
                assert exc.response.headers["retry-after"] == "1"  # one request a second
                break
        else:
            pytest.fail("never refused")
        # refused, the SDK waits retry-after's second and passes
        raw = retrying.messages.with_raw_response.create(
            model="m-ok", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
        assert raw.status_code == 200
        assert raw.parse().content[0].type == "text"
        if raw.retries_taken >= 1:
            break
    else:
        pytest.fail("the SDK never had to retry")
    wait_for_line(proc.output, lambda a: a.get("event") == "access" and a.get("status") == 429)


def test_headers_on_a_stream_and_on_an_error(limited: tuple[Proc, str]) -> None:
    _, url = limited
    client = sdk.client(url, api_key=KEYS["KEY_DAY"], max_retries=0)
    with client.messages.with_streaming_response.create(
        model="m-ok", max_tokens=1000, messages=[{"role": "user", "content": "hi"}], stream=True
    ) as resp:
        assert _ratelimit(resp.headers, "tokens")["limit"] == "86400"
        assert "anthropic-ratelimit-requests-limit" not in resp.headers
        assert b"message_stop" in b"".join(resp.iter_bytes())
    with pytest.raises(anthropic.InternalServerError) as caught:
        _ask(client, "m-status:500:traceback")
    assert _ratelimit(caught.value.response.headers, "tokens")["limit"] == "86400"


def test_usage_settles_the_estimate(limited: tuple[Proc, str]) -> None:
    """tokens_per_day 86,400 refills one a second: each request takes its estimate and
    max_tokens 1000; the stub's reply used 17 (12 + 5), so the next request finds about a
    thousand more than it would if the estimate stood."""
    _, url = limited
    client = sdk.client(url, api_key=KEYS["KEY_DAY"], max_retries=0)

    def left() -> int:
        raw = client.messages.with_raw_response.create(
            model="m-ok", max_tokens=1000, messages=[{"role": "user", "content": "hi"}]
        )
        return int(raw.headers["anthropic-ratelimit-tokens-remaining"])

    first, second = left(), left()
    # the second's take less what settling the first gave back: the 17 the first used,
    # less what refilled in between (one a second); the estimate standing would be ~1030,
    # the tokens given back (no usage) 0
    assert 9 <= first - second <= 17, (first, second)


def test_openai_pass_through_429(limited: tuple[Proc, str]) -> None:
    _, url = limited
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEYS["KEY_TIGHT"], max_retries=0)
    try:
        for _ in range(3):  # the tight client's 2 a minute, spent here or by another test
            client.chat.completions.create(
                model="m-ok", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
            )
        pytest.fail("never refused")
    except openai.RateLimitError as exc:
        assert exc.status_code == 429
        body = exc.response.json()
        assert body["error"]["type"] == "rate_limit_exceeded"
        assert "requests per minute" in body["error"]["message"]
        headers = exc.response.headers
        assert int(headers["retry-after"]) >= 1
        assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    finally:
        client.close()


def test_a_client_without_limits_pays_nothing_new(limited: tuple[Proc, str]) -> None:
    _, url = limited
    req = urllib.request.Request(
        url + "/v1/messages",
        data=json.dumps(
            {"model": "m-ok", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        ).encode(),
        headers={"x-api-key": KEYS["KEY_FREE"], "content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
        assert not [h for h in resp.headers if h.lower().startswith("anthropic-ratelimit")]


def test_a_batch_spends_its_owners_budget(limited: tuple[Proc, str]) -> None:
    """20 batch requests of the stub's 17 tokens each (12 in, 5 out) come off the owner's
    tokens_per_day (86,400: one a second refills); a batch request is never refused."""
    _, url = limited
    client = sdk.client(url, api_key=KEYS["KEY_OWNER"], max_retries=0)

    def left() -> int:
        raw = client.messages.with_raw_response.create(
            model="m-ok", max_tokens=100, messages=[{"role": "user", "content": "hi"}]
        )
        return int(raw.headers["anthropic-ratelimit-tokens-remaining"])

    before = left()
    params = {"model": "m-ok", "max_tokens": 100, "messages": [{"role": "user", "content": "b"}]}
    headers = {"x-api-key": KEYS["KEY_OWNER"]}
    status, made = create(
        url, [{"custom_id": f"r{i}", "params": params} for i in range(20)], headers=headers
    )
    assert status == 200, made
    ended = wait_ended(url, made["id"], headers=headers)
    assert ended["request_counts"]["succeeded"] == 20
    after = left()
    # 20 x 17 spent, less what refilled meanwhile (at most a minute's 60 here)
    assert before - after >= 20 * 17 - 60, (before, after)
