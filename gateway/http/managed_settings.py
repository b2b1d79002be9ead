"""``GET {prefix}/managed/settings``: Claude Code's policy for the client that asks.

The Claude Code gateway protocol (the contract Claude Code 2.1.332 serves from ``claude gateway``
at ``/protocol``): the answer is ``{"uuid", "checksum", "settings"}``, ``settings`` being a
``managed-settings.json`` document; a 200 without that wrapper is a failed fetch. The client
computes ``checksum`` itself from the settings it holds: ``sha256:`` and the hex SHA-256 of the
settings' JSON with the keys sorted at every level and no whitespace (JavaScript's
``JSON.stringify`` of the deep-sorted object). It sends it back quoted in ``If-None-Match``; a
match is answered 304, and a 304 is sent only then (one the client did not ask for counts as a
failed fetch). ``If-None-Match: *`` (Claude Desktop's probe) is answered as if absent. The
``ETag`` is the quoted checksum. Only strings are pushed, so Python's and JavaScript's JSON of
the settings are the same bytes (floats, ``-0`` and keys outside the BMP would differ).

What is pushed, in ``settings.env``, for the client's usable models (its ``models`` list;
pattern routes are no model id):

* ``ANTHROPIC_DEFAULT_{OPUS,SONNET,HAIKU}_MODEL``: the first model of each
  ``claude_code_tier``; a tier nobody claims takes the main model (the ``sonnet`` one, else
  ``opus``, else ``haiku``, else the first usable model); ``ANTHROPIC_MODEL``: the main model.
* ``CLAUDE_CODE_MAX_CONTEXT_TOKENS``: the smallest window among those models (configured, or
  read from the engine: gateway/upstream/window_watch.py), so whichever tier a request takes,
  auto-compact fires before that engine's window overflows. Claude Code applies it to model
  ids its catalogue does not know (it assumes 1 M tokens for those otherwise).
* ``CLAUDE_CODE_MAX_OUTPUT_TOKENS``: ``min(window // 8, server.claude_code_output_cap)``.
  Claude Code reserves the output cap out of the window; with its default (32 K) a 32 K window
  leaves no room and auto-compact thrashes, while 4096 (a 32 K window's eighth) works.
* ``CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY``: ``server.claude_code_model_discovery``; the
  client then reads ``/v1/models`` and keeps only ids holding ``claude`` or ``anthropic``.
* With ``[telemetry]``: :data:`TELEMETRY_ENV` and ``OTEL_EXPORTER_OTLP_ENDPOINT`` = the
  gateway's URL as the client reached it (host header, scheme, prefix), so the client's OTLP
  reaches ``{prefix}/v1/{metrics,logs,traces}`` (docs/telemetry.md).

Cost: built per request from the config and the learnt windows (a few dict lookups and one
SHA-256 of a few hundred bytes); nothing is stored.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping

from aiohttp import web

from gateway.http.keys import CONFIG, EXCHANGE, WINDOWS
from gateway.ops.config import Config, ModelRoute
from gateway.ops.config_schema import is_pattern
from gateway.tenancy.clients import Client

TIERS = ("opus", "sonnet", "haiku")
# the output cap is this share of the window (4096 of a 32 K window)
OUTPUT_SHARE = 8


def tier_models(client: Client, models: Mapping[str, ModelRoute]) -> dict[str, ModelRoute]:
    """Tier -> the model pushed for it, and ``"main"`` -> the session's model; {} when the
    client may use no model by name."""
    usable = [
        r for r in models.values() if not is_pattern(r.name) and client.may_use(r.name, r.name)
    ]
    if not usable:
        return {}
    claimed: dict[str, ModelRoute] = {}
    for route in usable:
        if route.claude_code_tier and route.claude_code_tier not in claimed:
            claimed[route.claude_code_tier] = route
    main = next((claimed[t] for t in ("sonnet", "opus", "haiku") if t in claimed), usable[0])
    return {**{t: claimed.get(t, main) for t in TIERS}, "main": main}


def output_cap(window: int, cap: int) -> int:
    """The output tokens pushed for ``window``: its eighth, at most ``cap``, at least 1."""
    return max(1, min(window // OUTPUT_SHARE, cap))


def settings_for(
    client: Client,
    config: Config,
    window_of: Callable[[ModelRoute], int],
    base_url: str = "",
) -> dict[str, object]:
    """The managed settings document for ``client``; ``base_url``: the gateway's own, as the
    client reached it (where its OTLP goes when ``[telemetry]`` is configured)."""
    tiers = tier_models(client, config.models)
    env: dict[str, str] = {}
    if tiers:
        for tier in TIERS:
            env[f"ANTHROPIC_DEFAULT_{tier.upper()}_MODEL"] = tiers[tier].name
        env["ANTHROPIC_MODEL"] = tiers["main"].name
        known = [w for w in (window_of(r) for r in tiers.values()) if w > 0]
        if known:
            window = min(known)
            env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = str(window)
            cap = config.server.claude_code_output_cap
            if cap:
                env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(output_cap(window, cap))
    if config.server.claude_code_model_discovery:
        env["CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY"] = "1"
    if config.telemetry is not None and base_url:
        env.update(TELEMETRY_ENV)
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = base_url
    return {"env": env} if env else {}


# Claude Code's telemetry switched on, its OTLP sent to the gateway (names read from the
# 2.1.332 binary): traces need the enhanced-telemetry beta, and its llm_request span's
# traceparent goes out on API requests to a gateway only with CLAUDE_CODE_PROPAGATE_TRACEPARENT
TELEMETRY_ENV = {
    "CLAUDE_CODE_ENABLE_TELEMETRY": "1",
    "CLAUDE_CODE_ENHANCED_TELEMETRY_BETA": "1",
    "CLAUDE_CODE_PROPAGATE_TRACEPARENT": "1",
    "OTEL_METRICS_EXPORTER": "otlp",
    "OTEL_LOGS_EXPORTER": "otlp",
    "OTEL_TRACES_EXPORTER": "otlp",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
}


def checksum(settings: Mapping[str, object]) -> str:
    """The protocol's checksum: ``sha256:`` + hex SHA-256 of the deep-key-sorted, compact JSON
    (ensure_ascii off, as JavaScript writes non-ASCII as itself)."""
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def matches(if_none_match: str | None, etag: str) -> bool:
    """Whether ``If-None-Match`` names ``etag`` (a list, weak tags too); ``*`` does not."""
    if not if_none_match:
        return False
    for tag in if_none_match.split(",")[:64]:
        tag = tag.strip()
        if tag.startswith("W/"):
            tag = tag[2:]
        if tag == etag:
            return True
    return False


async def managed_settings(request: web.Request) -> web.Response:
    app = request.app
    config = app[CONFIG]
    base = f"{request.scheme}://{request.host}{config.server.prefix}" if config.telemetry else ""
    settings = settings_for(request[EXCHANGE].client, config, app[WINDOWS].of, base)
    check = checksum(settings)
    etag = f'"{check}"'
    headers = {"ETag": etag, "Cache-Control": "private"}
    if matches(request.headers.get("If-None-Match"), etag):
        return web.Response(status=304, headers=headers)
    body = json.dumps({"uuid": check, "checksum": check, "settings": settings}, ensure_ascii=False)
    return web.Response(text=body, content_type="application/json", headers=headers)
