"""Metrics read back from a fresh registry while the real app serves the scripted stub.

The gateway app (``build_app(config, registry)``) and the stub upstream
(``tests/stub_upstream.make_app``) both run in-process on aiohttp test servers;
each test gets a new ``CollectorRegistry``, so every value asserted here was
recorded by the request the test made. Values are read with
``registry.get_sample_value`` (counters as ``<name>_total``, histograms as
``<name>_count``).
"""

from __future__ import annotations

import asyncio
import re
import time
import tomllib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, generate_latest

from gateway import __version__
from gateway.app import build_app
from gateway.openai.apis import APIS as OPENAI_APIS
from gateway.ops import config
from gateway.ops.metrics import (
    APIS,
    DROPPED_FIELDS,
    REJECTIONS,
    STREAM_APIS,
    TERMINATIONS,
    Metrics,
)
from tests.procs import free_port
from tests.stub_upstream import USAGE, make_app
from tests.waits import eventually  # streams are counted when the handler returns

SCENARIOS = (
    "ok",
    "length",
    "tools",
    "malformed",
    "inband-error",
    "cut-mid",
    "eof-no-finish",
    "hang-mid",
    "hang-headers",
    "status:500",
    "status:429",
    "status:400",
    "slow:50",
    "slow:2",
)

HI = [{"role": "user", "content": "hi"}]
MESSAGES = "/llm/v1/messages"
CHAT = "/llm/v1/chat/completions"


def _config_text(stub_base: str, dead_base: str, server_extra: str = "") -> str:
    text = f"""
[server]
prefix = "/llm"
ping_interval = 30
{server_extra}

[upstreams.stub]
base_url = "{stub_base}"
keepalive = "always"  # the stub echoes no request id: pooling is what the gauges here follow
connect_timeout = 1
header_timeout = 1
idle_timeout = 2  # well past a loaded CI machine's stalls: m-slow:50 must not time out

[upstreams.dead]
base_url = "{dead_base}"
connect_timeout = 1
header_timeout = 1
"""
    for name in SCENARIOS:
        text += f'\n[[models]]\nname = "m-{name}"\nupstream = "stub"\nupstream_model = "{name}"\n'
    text += '\n[[models]]\nname = "m-dead"\nupstream = "dead"\nupstream_model = "ok"\n'
    return text


GatewayFactory = Callable[..., Awaitable[tuple[TestClient, CollectorRegistry]]]


@pytest.fixture
async def gateway(aiohttp_server: Any, aiohttp_client: Any) -> GatewayFactory:
    """Start (registry, client) pairs: the real app in front of an in-process stub."""
    stub: TestServer = await aiohttp_server(make_app())
    stub_base = str(stub.make_url("/v1"))
    dead_base = f"http://127.0.0.1:{free_port()}/v1"

    async def start(
        server_extra: str = "", env: dict[str, str] | None = None
    ) -> tuple[TestClient, CollectorRegistry]:
        text = _config_text(stub_base, dead_base, server_extra)
        cfg = config.parse(tomllib.loads(text), "<test>", env or {})
        registry = CollectorRegistry()
        client = await aiohttp_client(build_app(cfg, registry))
        return client, registry

    return start


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


async def _messages(
    client: TestClient, model: str, *, stream: bool = False, **extra: Any
) -> tuple[int, bytes]:
    body = {"model": model, "max_tokens": 64, "messages": HI, **extra}
    if stream:
        body["stream"] = True
    async with client.post(MESSAGES, json=body) as resp:
        return resp.status, await resp.read()


async def _chat(client: TestClient, model: str, *, stream: bool = False) -> tuple[int, bytes]:
    body: dict[str, Any] = {"model": model, "messages": HI, "max_tokens": 16}
    if stream:
        body["stream"] = True
    async with client.post(CHAT, json=body) as resp:
        return resp.status, await resp.read()


# --- requests, tokens, stop reasons ----------------------------------------------------------


async def test_buffered_reply_counts_request_tokens_stop_reason_and_upstream(gateway) -> None:
    client, reg = await gateway()
    status, _ = await _messages(client, "m-ok")
    assert status == 200
    assert (
        value(
            reg,
            "llm_gateway_requests_total",
            api="messages",
            model="m-ok",
            code="200",
            stream="false",
        )
        == 1
    )
    assert (
        value(
            reg,
            "llm_gateway_request_duration_seconds_count",
            api="messages",
            model="m-ok",
            stream="false",
        )
        == 1
    )
    assert (
        value(reg, "llm_gateway_tokens_total", model="m-ok", type="input") == USAGE["prompt_tokens"]
    )
    assert (
        value(reg, "llm_gateway_tokens_total", model="m-ok", type="output")
        == USAGE["completion_tokens"]
    )
    assert value(reg, "llm_gateway_stop_reasons_total", model="m-ok", stop_reason="end_turn") == 1
    assert (
        value(reg, "llm_gateway_upstream_requests_total", model="m-ok", upstream="stub", code="200")
        == 1
    )
    assert (
        value(
            reg,
            "llm_gateway_upstream_response_headers_seconds_count",
            model="m-ok",
            upstream="stub",
        )
        == 1
    )
    # a buffered reply is not a stream
    assert (
        value(
            reg,
            "llm_gateway_stream_terminations_total",
            api="messages",
            model="m-ok",
            reason="completed",
        )
        == 0
    )


@pytest.mark.parametrize(
    ("model", "stop_reason"),
    [
        ("m-ok", "end_turn"),
        ("m-length", "max_tokens"),
        ("m-tools", "tool_use"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_stop_reason_counted_per_model(gateway, model, stop_reason, stream) -> None:
    client, reg = await gateway()
    status, _ = await _messages(client, model, stream=stream)
    assert status == 200
    await eventually(
        lambda: (
            value(reg, "llm_gateway_stop_reasons_total", model=model, stop_reason=stop_reason) == 1
        )
    )
    assert (
        value(reg, "llm_gateway_tokens_total", model=model, type="output")
        == USAGE["completion_tokens"]
    )


async def test_stream_records_ttft_chunks_tpot_and_request(gateway) -> None:
    client, reg = await gateway()
    model = "m-slow:2"  # 50 content chunks 2 ms apart: separate reads, measurable gaps
    status, _ = await _messages(client, model, stream=True)
    assert status == 200
    await eventually(
        lambda: (
            value(
                reg,
                "llm_gateway_requests_total",
                api="messages",
                model=model,
                code="200",
                stream="true",
            )
            == 1
        )
    )
    assert (
        value(
            reg,
            "llm_gateway_request_duration_seconds_count",
            api="messages",
            model=model,
            stream="true",
        )
        == 1
    )
    assert (
        value(reg, "llm_gateway_time_to_first_token_seconds_count", api="messages", model=model)
        == 1
    )
    assert value(reg, "llm_gateway_inter_chunk_latency_seconds_count", model=model) >= 10
    assert value(reg, "llm_gateway_inter_chunk_latency_seconds_sum", model=model) > 0.02
    assert value(reg, "llm_gateway_time_per_output_token_seconds_count", model=model) == 1
    assert value(reg, "llm_gateway_time_per_output_token_seconds_sum", model=model) > 0.001
    assert (
        value(reg, "llm_gateway_tokens_total", model=model, type="input") == USAGE["prompt_tokens"]
    )
    assert value(reg, "llm_gateway_streams_in_flight", api="messages", model=model) == 0


# --- how streams end -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("m-ok", "completed"),
        ("m-malformed", "malformed_chunk"),
        ("m-inband-error", "upstream_error"),
        ("m-cut-mid", "upstream_error"),
        ("m-eof-no-finish", "upstream_truncated"),
        ("m-hang-mid", "idle_timeout"),
    ],
)
async def test_messages_stream_termination_reason(gateway, model, reason) -> None:
    client, reg = await gateway()
    status, _ = await _messages(client, model, stream=True)
    assert status == 200
    await eventually(
        lambda: (
            value(
                reg,
                "llm_gateway_stream_terminations_total",
                api="messages",
                model=model,
                reason=reason,
            )
            == 1
        )
    )
    total = sum(
        value(reg, "llm_gateway_stream_terminations_total", api="messages", model=model, reason=r)
        for r in TERMINATIONS
    )
    assert total == 1
    assert value(reg, "llm_gateway_streams_in_flight", api="messages", model=model) == 0


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("m-ok", "completed"),
        ("m-malformed", "completed"),  # relayed as-is: the pass-through does not parse payloads
        ("m-eof-no-finish", "upstream_truncated"),  # EOF without [DONE]
        ("m-cut-mid", "upstream_error"),
        ("m-hang-mid", "idle_timeout"),
    ],
)
async def test_chat_stream_termination_reason(gateway, model, reason) -> None:
    client, reg = await gateway()
    status, _ = await _chat(client, model, stream=True)
    assert status == 200
    await eventually(
        lambda: (
            value(
                reg, "llm_gateway_stream_terminations_total", api="chat", model=model, reason=reason
            )
            == 1
        )
    )
    assert value(reg, "llm_gateway_streams_in_flight", api="chat", model=model) == 0
    assert (
        value(reg, "llm_gateway_requests_total", api="chat", model=model, code="200", stream="true")
        == 1
    )


@pytest.mark.parametrize("path", [MESSAGES, CHAT])
async def test_client_disconnect_is_counted_and_in_flight_returns_to_zero(gateway, path) -> None:
    client, reg = await gateway()
    api = "chat" if path == CHAT else "messages"
    body = {"model": "m-slow:50", "max_tokens": 64, "messages": HI, "stream": True}
    resp = await client.post(path, json=body)
    assert resp.status == 200
    await resp.content.readany()
    assert value(reg, "llm_gateway_streams_in_flight", api=api, model="m-slow:50") == 1
    resp.close()
    await eventually(
        lambda: (
            value(
                reg,
                "llm_gateway_stream_terminations_total",
                api=api,
                model="m-slow:50",
                reason="client_disconnect",
            )
            == 1
        )
    )
    assert value(reg, "llm_gateway_streams_in_flight", api=api, model="m-slow:50") == 0


async def test_upstream_connections_gauge_follows_the_pool(gateway) -> None:
    """A finished request leaves its connection pooled (1); a hung-up stream closes its own."""
    client, reg = await gateway()
    assert value(reg, "llm_gateway_upstream_connections", upstream="stub") == 0
    for _ in range(3):  # sequential requests reuse one connection
        status, _ = await _messages(client, "m-ok")
        assert status == 200
    assert value(reg, "llm_gateway_upstream_connections", upstream="stub") == 1
    body = {"model": "m-slow:50", "max_tokens": 64, "messages": HI, "stream": True}
    resp = await client.post(MESSAGES, json=body)
    await resp.content.readany()
    assert value(reg, "llm_gateway_upstream_connections", upstream="stub") == 1  # reused by it
    resp.close()
    await eventually(
        lambda: (
            value(
                reg,
                "llm_gateway_stream_terminations_total",
                api="messages",
                model="m-slow:50",
                reason="client_disconnect",
            )
            == 1
        )
    )
    await eventually(lambda: value(reg, "llm_gateway_upstream_connections", upstream="stub") == 0)


# --- upstream outcomes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "upstream", "code"),
    [
        ("m-ok", "stub", "200"),
        ("m-status:500", "stub", "500"),
        ("m-status:429", "stub", "429"),
        ("m-hang-headers", "stub", "timeout"),
        ("m-dead", "dead", "connect_error"),
    ],
)
@pytest.mark.parametrize("send", [_messages, _chat])
async def test_upstream_outcome_code(gateway, model, upstream, code, send) -> None:
    client, reg = await gateway()
    status, _ = await send(client, model)
    assert (status == 200) == (code == "200")
    assert (
        value(reg, "llm_gateway_upstream_requests_total", model=model, upstream=upstream, code=code)
        == 1
    )
    # headers latency is only known when headers arrived with a 2xx
    assert value(
        reg, "llm_gateway_upstream_response_headers_seconds_count", model=model, upstream=upstream
    ) == (1 if code == "200" else 0)


# --- refusals and dropped fields -------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "api"),
    [
        (MESSAGES, "messages"),
        (CHAT, "chat"),
        ("/llm/v1/messages/count_tokens", "count_tokens"),
        ("/llm/v1/completions", "completions"),
        ("/llm/v1/embeddings", "embeddings"),
        ("/llm/v1/responses", "responses"),
    ],
)
async def test_unknown_model_is_rejected_without_an_upstream_call(gateway, path, api) -> None:
    client, reg = await gateway()
    body = {"model": "no-such-model", "max_tokens": 8, "messages": HI}
    async with client.post(path, json=body) as resp:
        assert resp.status == 404
    assert value(reg, "llm_gateway_rejected_total", api=api, reason="unknown_model") == 1
    assert (
        value(reg, "llm_gateway_requests_total", api=api, model="", code="404", stream="false") == 1
    )
    upstream_calls = [
        s
        for m in reg.collect()
        if m.name == "llm_gateway_upstream_requests"
        for s in m.samples
        if s.name.endswith("_total")
    ]
    assert upstream_calls == []


async def test_invalid_request_is_counted_as_a_rejection(gateway) -> None:
    client, reg = await gateway()
    async with client.post(
        MESSAGES, json={"model": "m-ok", "max_tokens": 0, "messages": HI}
    ) as resp:
        assert resp.status == 400
    assert value(reg, "llm_gateway_rejected_total", api="messages", reason="invalid_request") == 1
    # an upstream's own 400 is not a gateway rejection
    async with client.post(
        MESSAGES, json={"model": "m-status:400", "max_tokens": 8, "messages": HI}
    ) as resp:
        assert resp.status == 400
    assert value(reg, "llm_gateway_rejected_total", api="messages", reason="invalid_request") == 1


async def test_auth_and_body_size_rejections(gateway) -> None:
    client, reg = await gateway(
        'api_keys_env = "KEYS"\nmax_body_bytes = 2000', env={"KEYS": "sk-good"}
    )
    body = {"model": "m-ok", "max_tokens": 8, "messages": HI}
    async with client.post(MESSAGES, json=body, headers={"x-api-key": "sk-bad"}) as resp:
        assert resp.status == 401
    big = {**body, "messages": [{"role": "user", "content": "x" * 5000}]}
    async with client.post(MESSAGES, json=big, headers={"x-api-key": "sk-good"}) as resp:
        assert resp.status == 413
    async with client.post(MESSAGES, json=body, headers={"x-api-key": "sk-good"}) as resp:
        assert resp.status == 200
    assert value(reg, "llm_gateway_rejected_total", api="messages", reason="auth") == 1
    assert value(reg, "llm_gateway_rejected_total", api="messages", reason="body_too_large") == 1
    assert (
        value(
            reg,
            "llm_gateway_requests_total",
            api="messages",
            model="m-ok",
            code="200",
            stream="false",
        )
        == 1
    )


async def test_known_rejection_reasons_start_at_zero(gateway) -> None:
    _, reg = await gateway()
    for reason in REJECTIONS:
        assert (
            reg.get_sample_value(
                "llm_gateway_rejected_total", {"api": "messages", "reason": reason}
            )
            == 0.0
        )


async def test_dropped_fields_known_names_and_other(gateway) -> None:
    client, reg = await gateway()
    status, _ = await _messages(
        client, "m-ok", metadata={"user_id": "u-1"}, service_tier="auto", zz_client_field_9f3=1
    )
    assert status == 200
    assert value(reg, "llm_gateway_dropped_fields_total", field="metadata") == 1
    assert value(reg, "llm_gateway_dropped_fields_total", field="service_tier") == 1
    assert value(reg, "llm_gateway_dropped_fields_total", field="other") == 1
    assert "zz_client_field_9f3" not in generate_latest(reg).decode()


async def test_label_values_never_come_from_client_input(gateway) -> None:
    client, _ = await gateway()
    marker = "client-chosen-7d1e"
    for path in (MESSAGES, CHAT, "/llm/v1/messages/count_tokens"):
        body = {"model": marker, "max_tokens": 8, "messages": HI, marker: 1, "stream": True}
        async with client.post(
            path, json=body, headers={"x-request-id": marker, "anthropic-beta": marker}
        ) as resp:
            assert resp.status == 404
    await _messages(client, "m-ok", **{marker: 1})
    async with client.get("/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    assert "llm_gateway_rejected_total" in text
    assert marker not in text


# --- metadata and saturation -----------------------------------------------------------------


async def test_model_info_and_build_info(gateway) -> None:
    _, reg = await gateway()
    for name in SCENARIOS:
        assert (
            value(
                reg,
                "llm_gateway_model_info",
                model=f"m-{name}",
                upstream="stub",
                upstream_model=name,
            )
            == 1
        )
    assert (
        value(reg, "llm_gateway_model_info", model="m-dead", upstream="dead", upstream_model="ok")
        == 1
    )
    assert value(reg, "llm_gateway_build_info", version=__version__) == 1


async def test_event_loop_lag_gauge_sees_a_blocked_loop(gateway) -> None:
    _, reg = await gateway()
    assert reg.get_sample_value("llm_gateway_event_loop_lag_seconds") is not None
    await asyncio.sleep(0.05)  # let the probe start its first sleep
    time.sleep(0.7)  # noqa: ASYNC251 - block the loop the app runs on: the probe's timer fires late
    await eventually(lambda: value(reg, "llm_gateway_event_loop_lag_seconds") >= 0.1, within=2.0)


def test_add_model_creates_per_model_series_at_zero() -> None:
    reg = CollectorRegistry()
    metrics = Metrics(reg)
    metrics.add_model("alias", "up", "org/model-7b")
    assert (
        value(
            reg,
            "llm_gateway_model_info",
            model="alias",
            upstream="up",
            upstream_model="org/model-7b",
        )
        == 1
    )
    samples = [
        ("llm_gateway_tokens_total", {"model": "alias", "type": t}) for t in ("input", "output")
    ]
    samples += [
        ("llm_gateway_stream_terminations_total", {"api": api, "model": "alias", "reason": r})
        for api in STREAM_APIS
        for r in TERMINATIONS
    ]
    samples += [
        ("llm_gateway_streams_in_flight", {"api": api, "model": "alias"}) for api in STREAM_APIS
    ]
    samples += [("llm_gateway_tool_argument_errors_total", {"model": "alias"})]
    for name, labels in samples:
        assert reg.get_sample_value(name, labels) == 0.0, (name, labels)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("seed", "seed"),
        ("metadata", "metadata"),
        ("other", "other"),
        ("a-client-invented-field", "other"),
        ("", "other"),
    ],
)
def test_drop_field_folds_unknown_names_into_other(name, expected) -> None:
    reg = CollectorRegistry()
    Metrics(reg).drop_field(name)
    assert value(reg, "llm_gateway_dropped_fields_total", field=expected) == 1
    assert sum(value(reg, "llm_gateway_dropped_fields_total", field=f) for f in DROPPED_FIELDS) == 1


# --- the pass-through and the overhead histogram ---------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_overhead_is_one_observation_per_request(gateway, stream) -> None:
    client, reg = await gateway()
    await _messages(client, "m-ok", stream=stream)
    await _chat(client, "m-ok", stream=stream)
    flag = str(stream).lower()
    await eventually(
        lambda: all(
            value(
                reg,
                "llm_gateway_request_duration_seconds_count",
                api=api,
                model="m-ok",
                stream=flag,
            )
            == 1
            for api in ("messages", "chat")
        )
    )
    for api in ("messages", "chat"):
        assert value(reg, "llm_gateway_overhead_seconds_count", api=api) == 1, api
        whole = value(
            reg, "llm_gateway_request_duration_seconds_sum", api=api, model="m-ok", stream=flag
        )
        # the gateway's own part of the request's time: the upstream's wait is left out
        assert 0 < value(reg, "llm_gateway_overhead_seconds_sum", api=api) < whole, api


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_pass_through_counts_usage_tokens(gateway, stream) -> None:
    client, reg = await gateway()
    status, _ = await _chat(client, "m-ok", stream=stream)
    assert status == 200
    await eventually(
        lambda: (
            value(reg, "llm_gateway_tokens_total", model="m-ok", type="output")
            == USAGE["completion_tokens"]
        )
    )
    assert (
        value(reg, "llm_gateway_tokens_total", model="m-ok", type="input") == USAGE["prompt_tokens"]
    )


async def test_chat_stream_records_ttft(gateway) -> None:
    client, reg = await gateway()
    await _chat(client, "m-ok", stream=True)
    await eventually(
        lambda: (
            value(reg, "llm_gateway_time_to_first_token_seconds_count", api="chat", model="m-ok")
            == 1
        )
    )


# --- the other OpenAI routes -----------------------------------------------------------------


def test_every_pass_through_route_has_its_api_label() -> None:
    """The ``api`` label values are fixed in metrics.py; each route's series start at zero."""
    for api in OPENAI_APIS:
        assert api.name in APIS
        assert (api.name in STREAM_APIS) is api.streams, api.name


@pytest.mark.parametrize(
    ("route", "body", "stream", "output"),
    [
        ("completions", {"prompt": "hi"}, False, 5),
        ("completions", {"prompt": "hi", "stream_options": {"include_usage": True}}, True, 5),
        ("embeddings", {"input": "hi"}, False, 0),
        ("responses", {"input": "hi"}, False, 5),
        ("responses", {"input": "hi"}, True, 5),
    ],
)
async def test_pass_through_routes_are_counted_under_their_api(
    gateway, route, body, stream, output
) -> None:
    client, reg = await gateway()
    if stream:
        body = {**body, "stream": True}
    async with client.post(f"/llm/v1/{route}", json={"model": "m-ok", **body}) as resp:
        assert resp.status == 200
        await resp.read()
    flag = str(stream).lower()
    await eventually(
        lambda: (
            value(
                reg, "llm_gateway_requests_total", api=route, model="m-ok", code="200", stream=flag
            )
            == 1
        )
    )
    assert value(reg, "llm_gateway_overhead_seconds_count", api=route) == 1
    assert (
        value(reg, "llm_gateway_tokens_total", model="m-ok", type="input") == USAGE["prompt_tokens"]
    )
    assert value(reg, "llm_gateway_tokens_total", model="m-ok", type="output") == output
    assert (
        value(reg, "llm_gateway_upstream_requests_total", model="m-ok", upstream="stub", code="200")
        == 1
    )
    if stream:
        assert (
            value(
                reg,
                "llm_gateway_stream_terminations_total",
                api=route,
                model="m-ok",
                reason="completed",
            )
            == 1
        )
        assert (
            value(reg, "llm_gateway_time_to_first_token_seconds_count", api=route, model="m-ok")
            == 1
        )
        assert value(reg, "llm_gateway_streams_in_flight", api=route, model="m-ok") == 0


async def test_no_created_series_in_the_exposition(gateway) -> None:
    """prometheus-client's ``*_created`` timestamps are off: a counter, a histogram and a
    labelled child that have all been used still expose no ``_created`` sample."""
    client, reg = await gateway()
    status, _ = await _messages(client, "m-ok")
    assert status == 200
    text = generate_latest(reg).decode()
    assert "llm_gateway_requests_total{" in text and "llm_gateway_overhead_seconds_count" in text
    # a sample named *_created (batches_created_total is a counter's own name, not one)
    assert not re.search(r"^[a-z_]+_created[{ ]", text, re.M)
