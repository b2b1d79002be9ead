"""Fallbacks across upstreams (``[[models]] fallbacks``): a model whose upstream refuses
connections or answers 503 on every replica has its Messages requests answered by its
fallback, through the official SDK, buffered, streamed and in a batch; the reply keeps the
name the client asked for, and ``llm_gateway_fallbacks_total`` counts each. A model without
fallbacks fails as before."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import anthropic
import pytest

from tests import sdk
from tests.batch_client import batches_toml, results_of, wait_ended
from tests.procs import Proc, free_port, get, post
from tests.stub_upstream import TEXT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _config(stub_url: str, database: Path) -> str:
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: connections refused
    return f"""
[upstreams.dead]
base_urls = ["{dead}", "{dead.replace("127.0.0.1", "127.0.0.2")}"]
connect_timeout = 2

[upstreams.main]
base_url = "{stub_url}"
kind = "vllm"

[upstreams.spare]
base_url = "{stub_url}"
kind = "llamacpp"

[[models]]
name = "refusing"
upstream = "dead"
upstream_model = "ok"
fallbacks = ["also-down", "spare-model"]

[[models]]
name = "unavailable"
upstream = "main"
upstream_model = "status:503"
fallbacks = ["spare-model"]

[[models]]
name = "also-down"
upstream = "main"
upstream_model = "status:529"

[[models]]
name = "spare-model"
upstream = "spare"
upstream_model = "fallback-ok"

[[models]]
name = "refusing-alone"
upstream = "dead"
upstream_model = "ok"

[[models]]
name = "unavailable-alone"
upstream = "main"
upstream_model = "status:503"
""" + batches_toml(database)


def _metric(base: str, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    _, _, body = get(f"{base}/metrics")
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def _fallback_calls(stub: str) -> list[dict[str, object]]:
    return [
        r["body"]
        for r in json.loads(get(f"{stub}/_requests")[2])
        if r["path"].endswith("/chat/completions") and r["body"].get("model") == "fallback-ok"
    ]


def test_a_model_whose_upstream_is_down_is_answered_by_its_fallback(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]], tmp_path: Path
) -> None:
    stub = stub_url.removesuffix("/v1")
    before = len(_fallback_calls(stub))
    _, base = gateway_factory(_config(stub_url, tmp_path / "batches.sqlite3"))
    client = sdk.client(f"{base}/llm", api_key="k", max_retries=0)
    hello = [{"role": "user", "content": "hello"}]
    try:
        for model in ("refusing", "unavailable"):
            message = client.messages.create(model=model, max_tokens=16, messages=hello)
            assert message.model == model  # what the client asked for
            assert message.content[0].text == "".join(TEXT)  # type: ignore[union-attr]
            with client.messages.stream(model=model, max_tokens=16, messages=hello) as stream:
                kinds = [event.type for event in stream]
                streamed = stream.get_final_message()
            assert "error" not in kinds and streamed.model == model
            assert streamed.content[0].text == "".join(TEXT)  # type: ignore[union-attr]
            assert streamed.stop_reason == "end_turn"
        # without fallbacks, as before: the client gets the failure
        with pytest.raises(anthropic.APIStatusError) as refused:
            client.messages.create(model="refusing-alone", max_tokens=16, messages=hello)
        assert refused.value.status_code == 529
        with pytest.raises(anthropic.APIStatusError) as unavailable:
            client.messages.create(model="unavailable-alone", max_tokens=16, messages=hello)
        assert unavailable.value.status_code == 529  # the upstream's 503, as mapped
    finally:
        sdk.close_all()

    # a batch goes through the same call
    status, _, raw = post(
        f"{base}/llm/v1/messages/batches",
        {
            "requests": [
                {
                    "custom_id": "b1",
                    "params": {"model": "refusing", "max_tokens": 16, "messages": hello},
                }
            ]
        },
    )
    assert status == 200, raw
    batch_id = json.loads(raw)["id"]
    wait_ended(f"{base}/llm", batch_id)
    [result] = results_of(f"{base}/llm", batch_id)
    assert result["result"]["type"] == "succeeded", result
    assert result["result"]["message"]["model"] == "refusing"
    assert result["result"]["message"]["content"][0]["text"] == "".join(TEXT)

    # each went to the fallback as its own upstream_model, with the client's message
    sent = _fallback_calls(stub)[before:]
    assert len(sent) == 5
    assert all(b["messages"][-1] == {"role": "user", "content": "hello"} for b in sent)
    # counted: refusing tried also-down (529) first, then spare-model
    fallbacks = "llm_gateway_fallbacks_total"
    assert _metric(base, fallbacks, model="refusing", fallback="also-down") == 3
    assert _metric(base, fallbacks, model="refusing", fallback="spare-model") == 3
    assert _metric(base, fallbacks, model="unavailable", fallback="spare-model") == 2
    assert _metric(base, fallbacks, model="refusing-alone") is None
    assert (
        _metric(base, "llm_gateway_upstream_requests_total", model="refusing", code="connect_error")
        == 3
    )
