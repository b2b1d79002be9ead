"""The official TypeScript SDK (@anthropic-ai/sdk, installed by .ci/run into tests/clients)."""

from __future__ import annotations

import pytest

from tests.conftest import stub_config
from tests.node import run_ts

pytestmark = [pytest.mark.e2e, pytest.mark.clients]


@pytest.mark.llamacpp
def test_ts_sdk_against_real_upstream(llama_gateway, tiny_model) -> None:
    _, base = llama_gateway
    _, expect = tiny_model
    out = run_ts(base, "demo")
    assert "fatal" not in out, out
    assert out["finalText"] == expect["answer"]
    for reply in (out["stream"], out["created"]):
        assert [b["type"] for b in reply["content"]] == ["thinking", "text"]
        assert reply["content"][0]["thinking"] == expect["reasoning"]
        assert reply["content"][1]["text"] == expect["answer"]
        assert reply["stop_reason"] == "end_turn"
        assert reply["usage"]["output_tokens"] == expect["completion_tokens_thinking"]
    assert out["created"]["kind"] == "object"
    assert out["models"] == ["demo"]
    usage = out["created"]["usage"]
    assert out["count"] == usage["input_tokens"] + (usage.get("cache_read_input_tokens") or 0)


def test_ts_sdk_final_message_carries_cached_prompt_tokens(stub_url, gateway_factory) -> None:
    """MessageStream copies message_delta.usage's input_tokens and cache_read_input_tokens
    into the final message: the stream's usage equals the buffered reply's."""
    _, url = gateway_factory(stub_config(stub_url, models=("cached",)))
    out = run_ts(url + "/llm", "m-cached")
    assert "fatal" not in out, out
    for reply in (out["stream"], out["created"]):
        usage = reply["usage"]
        assert (
            usage["input_tokens"],
            usage["cache_read_input_tokens"],
            usage["output_tokens"],
        ) == (4, 8, 5)


@pytest.mark.parametrize(
    "scenario,error_type",
    [
        ("inband-error", "api_error"),
        ("malformed", "api_error"),
        ("cut-mid", "api_error"),
        ("eof-no-finish", "api_error"),
    ],
)
def test_ts_sdk_raises_on_failure_envelopes(
    stub_url, gateway_factory, scenario, error_type
) -> None:
    _, url = gateway_factory(stub_config(stub_url, models=(scenario,)))
    out = run_ts(url + "/llm", f"m-{scenario}", "stream-error")
    assert out["error"] is not None, out
    assert out["error"]["type"] == error_type, out
