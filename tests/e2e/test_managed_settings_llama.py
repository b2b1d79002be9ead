"""The engine's real context window, end to end: a real gateway in front of the real llama-server
(2048 tokens over 2 slots: one request may use 1024) with no ``context_window`` in the config
learns 1024 from ``/props``, shows it in ``/v1/models`` and pushes it to Claude Code in
``/managed/settings`` (with the output cap, the model names and the ETag/304 rules)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.procs import Proc
from tests.waits import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.llamacpp]

KEY = "k-dev"


def _config(base_url: str) -> str:
    return f"""
[server]
host = "127.0.0.1"
port = 8080
prefix = "/llm"

[upstreams.llama]
base_url = "{base_url}"
kind = "llamacpp"

[[models]]
name = "claude-local-demo"
upstream = "llama"
upstream_model = "demo"
display_name = "Demo (llama.cpp)"
claude_code_tier = "sonnet"

[[clients]]
name = "dev"
key_env = "DEV_KEY"
"""


def _get(url: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def _model(base: str) -> dict[str, Any]:
    status, _, body = _get(
        base + "/v1/models", **{"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    )
    assert status == 200
    return json.loads(body)["data"][0]  # type: ignore[no-any-return]


def test_the_engines_window_reaches_models_and_settings(
    llama_server: str, gateway_factory: Callable[..., tuple[Proc, str]]
) -> None:
    _, url = gateway_factory(_config(llama_server), env={"DEV_KEY": KEY})
    base = url + "/llm"
    # read in the background at start: not on any request's path
    model = wait_until(
        lambda: (m := _model(base)).get("max_input_tokens") and m, "the window learnt"
    )
    assert model["id"] == "claude-local-demo" and model["display_name"] == "Demo (llama.cpp)"
    assert (model["max_input_tokens"], model["max_tokens"]) == (1024, 128)

    status, headers, body = _get(base + "/managed/settings", Authorization=f"Bearer {KEY}")
    assert status == 200
    doc = json.loads(body)
    assert doc["settings"] == {
        "env": {
            "ANTHROPIC_DEFAULT_OPUS_MODEL": "claude-local-demo",
            "ANTHROPIC_DEFAULT_SONNET_MODEL": "claude-local-demo",
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": "claude-local-demo",
            "ANTHROPIC_MODEL": "claude-local-demo",
            "CLAUDE_CODE_MAX_CONTEXT_TOKENS": "1024",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "128",
            "CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY": "1",
        }
    }
    assert doc["uuid"] == doc["checksum"] and headers["ETag"] == f'"{doc["checksum"]}"'
    # Claude Code's next poll sends the checksum back: unchanged settings are a 304
    status, again, body = _get(
        base + "/managed/settings",
        Authorization=f"Bearer {KEY}",
        **{"If-None-Match": headers["ETag"]},
    )
    assert (status, body, again["ETag"]) == (304, b"", headers["ETag"])
    status, _, body = _get(base + "/managed/settings", Authorization="Bearer wrong")
    assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"


def test_a_configured_window_wins_over_the_engines(
    llama_server: str, gateway_factory: Callable[..., tuple[Proc, str]]
) -> None:
    config = _config(llama_server).replace(
        'claude_code_tier = "sonnet"', 'claude_code_tier = "sonnet"\ncontext_window = 512'
    )
    _, url = gateway_factory(config, env={"DEV_KEY": KEY})
    status, _, body = _get(url + "/llm/managed/settings", **{"x-api-key": KEY})
    assert status == 200
    assert json.loads(body)["settings"]["env"]["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "512"
    assert _model(url + "/llm")["max_input_tokens"] == 512
