"""Pings while the upstream is silent (a long prefill), and what the real clients make of them.

The gateway answers 200 as soon as the upstream does, but can only write `message_start`
with the first upstream chunk (it carries the prompt's token count on vLLM/SGLang). So
during a prefill the pings come *before* `message_start`. All three clients drop `ping`
in their SSE decoders before looking at order, which these tests check for the two SDKs.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests import sdk
from tests.anthropic_stream_check import check_stream
from tests.conftest import stub_config
from tests.node import run_ts

pytestmark = pytest.mark.e2e


@pytest.fixture
def ping_gateway(stub_url, gateway_factory) -> str:
    cfg = stub_config(stub_url, models=("prefill:1600",), extra_server="ping_interval = 0.3")
    _, url = gateway_factory(cfg)
    return url + "/llm"


def test_pings_during_prefill_then_a_well_formed_stream(ping_gateway) -> None:
    body = {
        "model": "m-prefill:1600",
        "max_tokens": 50,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    req = urllib.request.Request(
        ping_gateway + "/v1/messages",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=20) as resp:
        raw = resp.read()
    events = check_stream(raw)
    types = [e["type"] for e in events]
    first = types.index("message_start")
    assert types[:first] == ["ping"] * first and first >= 3, types
    assert raw.count(b'event: ping\ndata: {"type":"ping"}\n\n') == types.count("ping")


def test_python_sdk_accepts_the_pings(ping_gateway) -> None:
    client = sdk.client(ping_gateway, api_key="k", max_retries=0)
    with client.messages.stream(
        model="m-prefill:1600", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == "Hello from the stub." and final.stop_reason == "end_turn"


@pytest.mark.clients
def test_typescript_sdk_accepts_the_pings(ping_gateway) -> None:
    out = run_ts(ping_gateway, "m-prefill:1600")
    assert "fatal" not in out, out
    assert out["finalText"] == "Hello from the stub."
