"""Pattern routes through the real gateway: Claude Code names models it was never told about.

Claude Code's subagents ask for its haiku tier (``claude-haiku-4-5-20251001``) and, with no
model variables set, every request names its own default (``claude-opus-4-8``). A route named
``claude-*`` takes them all; the reply echoes the name sent, the upstream gets the route's
model, and metrics carry the configured name only.
"""

from __future__ import annotations

import json
import urllib.request

import anthropic
import pytest

from tests import sdk
from tests.conftest import stub_config

pytestmark = pytest.mark.e2e

CONFIG_MODELS = ("ok", "reasoning")
EXTRA = """
[[models]]
name = "claude-haiku-*"
upstream = "stub"
upstream_model = "reasoning"

[[models]]
name = "claude-*"
upstream = "stub"
upstream_model = "ok"
"""


def _get(url: str, headers: dict[str, str] | None = None) -> bytes:
    with urllib.request.urlopen(
        urllib.request.Request(url, headers=headers or {}), timeout=5
    ) as resp:
        return resp.read()


def test_pattern_routes_through_the_gateway(stub_url, gateway_factory) -> None:
    _, root = gateway_factory(stub_config(stub_url, models=CONFIG_MODELS) + EXTRA)
    client = sdk.client(root + "/llm", api_key="k", max_retries=0)
    cases = [("claude-haiku-4-5-20251001", "reasoning"), ("claude-opus-4-8", "ok"), ("m-ok", "ok")]
    for name, upstream_model in cases:
        reply = client.messages.create(
            model=name,
            max_tokens=50,
            thinking={"type": "adaptive"},
            messages=[{"role": "user", "content": "hi"}],
        )
        assert reply.model == name  # echoes what the client sent
        thinking = [b for b in reply.content if b.type == "thinking"]
        assert bool(thinking) == (upstream_model == "reasoning")
        with client.messages.stream(
            model=name, max_tokens=50, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            assert stream.get_final_message().model == name

    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(
            model="gpt-4o", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    assert "gpt-4o" in err.value.message

    # the list holds exact names only; a pattern-matched id can be retrieved
    assert [m.id for m in client.models.list()] == ["m-ok", "m-reasoning"]
    info = client.models.retrieve("claude-haiku-4-5-20251001")
    assert info.id == "claude-haiku-4-5-20251001"
    openai = json.loads(_get(root + "/llm/v1/models"))
    assert [m["id"] for m in openai["data"]] == ["m-ok", "m-reasoning"]

    # metrics are labelled by the configured name, never by the client's
    text = _get(root + "/metrics").decode()
    assert 'model="claude-haiku-*"' in text and 'model="claude-*"' in text
    assert "claude-haiku-4-5-20251001" not in text and "claude-opus-4-8" not in text
