"""``GET {prefix}/managed/settings`` (gateway/http/managed_settings.py), in process: what each
client is pushed, the checksum as Claude Code computes it (checked against node's JSON), the
ETag/304 rules, 401 without a known key, and /v1/models' windows."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.app import build_app
from gateway.http import managed_settings as ms
from gateway.http.keys import WINDOWS
from gateway.ops import config

KEYS = {"K_ALICE": "k-alice", "K_BOB": "k-bob", "K_CAROL": "k-carol"}


def _cfg(**server: Any) -> config.Config:
    return config.parse(
        {
            "server": server,
            "upstreams": {
                "u": {"base_url": "http://127.0.0.1:9/v1", "context_window_interval": 0}
            },
            "models": [
                {"name": "claude-big", "upstream": "u", "upstream_model": "b",
                 "context_window": 131072, "claude_code_tier": "opus"},
                {"name": "claude-mid", "upstream": "u", "upstream_model": "m",
                 "context_window": 32768, "claude_code_tier": "sonnet"},
                {"name": "claude-small", "upstream": "u", "upstream_model": "s",
                 "claude_code_tier": "haiku"},
                {"name": "qwen-only", "upstream": "u", "upstream_model": "q",
                 "context_window": 8192},
                {"name": "claude-*", "upstream": "u", "upstream_model": "m"},
            ],
            "clients": [
                {"name": "alice", "key_env": "K_ALICE"},
                {"name": "bob", "key_env": "K_BOB", "models": ["qwen-only", "gpt-*"]},
                {"name": "carol", "key_env": "K_CAROL", "models": ["nothing-here"]},
            ],
        },
        "test.toml",
        KEYS,
    )  # fmt: skip


ALICE_ENV = {
    "ANTHROPIC_DEFAULT_OPUS_MODEL": "claude-big",
    "ANTHROPIC_DEFAULT_SONNET_MODEL": "claude-mid",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL": "claude-small",
    "ANTHROPIC_MODEL": "claude-mid",
    # the smallest known window of the three (claude-small's is not known yet)
    "CLAUDE_CODE_MAX_CONTEXT_TOKENS": "32768",
    "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096",
    "CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY": "1",
}


async def _get(client: Any, key: str | None, **headers: str) -> Any:
    if key is not None:
        headers["x-api-key"] = key
    return await client.get("/llm/managed/settings", headers=headers)


@pytest.mark.parametrize(
    ("key", "env"),
    [
        ("k-alice", ALICE_ENV),
        (
            "k-bob",  # one usable model (the pattern matches none): every tier
            {
                **{
                    f"ANTHROPIC_DEFAULT_{t}_MODEL": "qwen-only" for t in ("OPUS", "SONNET", "HAIKU")
                },
                "ANTHROPIC_MODEL": "qwen-only",
                "CLAUDE_CODE_MAX_CONTEXT_TOKENS": "8192",
                "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "1024",
                "CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY": "1",
            },
        ),
        ("k-carol", {"CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY": "1"}),
    ],
)
async def test_each_client_gets_its_own_models_and_window(
    aiohttp_client: Any, key: str, env: dict[str, str]
) -> None:
    client = await aiohttp_client(build_app(_cfg(), CollectorRegistry()))
    resp = await _get(client, key)
    assert resp.status == 200
    body = await resp.json()
    assert set(body) == {"uuid", "checksum", "settings"}
    assert body["settings"] == {"env": env}
    assert body["checksum"] == body["uuid"] == ms.checksum(body["settings"])
    assert resp.headers["ETag"] == f'"{body["checksum"]}"'
    assert resp.headers.get("Cache-Control") != "no-store"  # no Desktop "must not be missing"


async def test_a_learnt_window_is_pushed_and_changes_the_checksum(aiohttp_client: Any) -> None:
    app = build_app(_cfg(), CollectorRegistry())
    client = await aiohttp_client(app)
    first = await (await _get(client, "k-alice")).json()
    app[WINDOWS].learnt["claude-small"] = 16000  # the engine's, read in the background
    app[WINDOWS].learnt["claude-mid"] = 999  # a configured window wins over the engine's
    resp = await _get(client, "k-alice", **{"If-None-Match": f'"{first["checksum"]}"'})
    assert resp.status == 200  # the old checksum no longer matches
    env = (await resp.json())["settings"]["env"]
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "16000"
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "2000"
    headers = {"x-api-key": "k-alice", "anthropic-version": "2023-06-01"}
    models = await (await client.get("/llm/v1/models", headers=headers)).json()
    shown = {m["id"]: (m.get("max_input_tokens"), m.get("max_tokens")) for m in models["data"]}
    assert shown == {
        "claude-big": (131072, 16384),
        "claude-mid": (32768, 4096),
        "claude-small": (16000, 2000),
        "qwen-only": (8192, 1024),
    }


@pytest.mark.parametrize(
    ("if_none_match", "status"),
    [
        (None, 200),
        ("{etag}", 304),
        ("W/{etag}", 304),
        ('"sha256:00", {etag}', 304),
        ("*", 200),  # Claude Desktop's probe: answered as without the header
        ('"sha256:00"', 200),
        ("{bare}", 200),  # the checksum unquoted is no entity tag
        ("", 200),
    ],
)
async def test_304_only_for_a_matching_if_none_match(
    aiohttp_client: Any, if_none_match: str | None, status: int
) -> None:
    client = await aiohttp_client(build_app(_cfg(), CollectorRegistry()))
    first = await _get(client, "k-alice")
    etag = first.headers["ETag"]
    headers = {}
    if if_none_match is not None:
        headers["If-None-Match"] = if_none_match.format(etag=etag, bare=etag.strip('"'))
    resp = await _get(client, "k-alice", **headers)
    assert resp.status == status
    assert resp.headers["ETag"] == etag
    if status == 304:
        assert await resp.read() == b""


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"x-api-key": "nope"}, 401),
        ({"Authorization": "Bearer nope"}, 401),
        ({"Authorization": "Bearer k-bob"}, 200),
        ({"x-api-key": "k-bob"}, 200),
    ],
)
async def test_only_a_configured_client_is_answered(
    aiohttp_client: Any, headers: dict[str, str], status: int
) -> None:
    client = await aiohttp_client(build_app(_cfg(), CollectorRegistry()))
    resp = await client.get("/llm/managed/settings", headers=headers)
    assert resp.status == status
    if status == 401:
        body = await resp.json()
        assert body["type"] == "error" and body["error"]["type"] == "authentication_error"


async def test_off_is_a_404_and_knobs_shape_the_env(aiohttp_client: Any) -> None:
    client = await aiohttp_client(build_app(_cfg(managed_settings=False), CollectorRegistry()))
    assert (await _get(client, "k-alice")).status == 404
    cfg = _cfg(claude_code_output_cap=0, claude_code_model_discovery=False)
    env = ms.settings_for(ms.Client("x"), cfg, lambda r: r.context_window)["env"]
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS" not in env
    assert "CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY" not in env
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "32768"
    assert ms.settings_for(ms.Client("x", ("none",)), cfg, lambda r: 0) == {}


@pytest.mark.parametrize(
    ("window", "cap", "want"),
    [(32768, 32000, 4096), (200000, 32000, 25000), (1024, 32000, 128), (7, 32000, 1),
     (1_000_000, 32000, 32000), (32768, 100, 100)],
)  # fmt: skip
def test_the_output_cap_leaves_the_prompt_room(window: int, cap: int, want: int) -> None:
    assert ms.output_cap(window, cap) == want
