"""OpenTelemetry (``[telemetry]``, docs/telemetry.md): the real gateway exporting to a
collector written here (tests/otlp_collector.py), in front of the stub upstream.

Facts checked: one SERVER span per Messages request, the child of the client's W3C
``traceparent`` (one trace id from the client to the engine); a ``translate`` span; one
CLIENT span per upstream attempt naming the replica (``server.address``/``server.port``),
whose context reached the engine as its ``traceparent``; a ``fallback`` span when the
route's upstream is down and a ``continuation`` span when a stream is cut; the GenAI
attributes and metrics; the client's own OTLP, protobuf and JSON, forwarded with its name;
none of it without ``[telemetry]``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tests.conftest import clear_stub, stub_requests
from tests.otlp_collector import Collector, Span, value_of
from tests.procs import Proc, free_port, get, post
from tests.waits import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
ALICE = "alice-key-0123456789"
SERVER, CLIENT = 2, 3  # OTLP's SpanKind values


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _config(stub_url: str, collector: Collector | None, dead: str) -> str:
    telemetry = (
        f"""
[telemetry]
otlp_endpoint = "{collector.url}"
export_interval = 1
max_forward_bytes = 65536
"""
        if collector is not None
        else ""
    )
    return f"""
[server]
api_keys_env = "ANON_KEYS"
{telemetry}
[[clients]]
name = "alice"
key_env = "ALICE_KEY"

[upstreams.stub]
base_url = "{stub_url}"

[upstreams.dead]
base_url = "{dead}"
connect_timeout = 1

[[models]]
name = "plain"
upstream = "stub"
upstream_model = "ok"

[[models]]
name = "down"
upstream = "dead"
upstream_model = "ok"
fallbacks = ["plain"]

[[models]]
name = "cut-once"
upstream = "stub"
upstream_model = "tool-cut:1"
"""


TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


def _ask(model: str, text: str, **more: object) -> dict[str, object]:
    return {
        "model": model,
        "max_tokens": 64,
        "temperature": 0.5,
        "messages": [{"role": "user", "content": text}],
        **more,
    }


def _spans_of(collector: Collector, trace_id: str, count: int) -> list[Span]:
    """The spans of one trace, once ``count`` of them have come (the SDK batches them)."""
    wait_until(
        lambda: len([s for s in collector.spans() if s.trace_id == trace_id]) >= count,
        timeout=30,
    )
    return [s for s in collector.spans() if s.trace_id == trace_id]


def _gateway(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]], collector: Collector | None
) -> tuple[str, str]:
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    _, base = gateway_factory(
        _config(stub_url, collector, dead), env={"ANON_KEYS": "anon-key", "ALICE_KEY": ALICE}
    )
    return base, dead


def test_one_trace_from_the_client_through_the_gateway_to_the_engine(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]], collector: Collector
) -> None:
    base, _ = _gateway(stub_url, gateway_factory, collector)
    stub_port = int(stub_url.split(":")[2].split("/")[0])
    clear_stub(stub_url)
    status, _, body = post(
        f"{base}/llm/v1/messages",
        _ask("plain", "trace me", stream=True),
        headers={
            "x-api-key": ALICE,
            "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01",
            "tracestate": "vendor=1",
            "x-claude-code-session-id": "session-42",
        },
    )
    assert status == 200, body
    spans = _spans_of(collector, TRACE_ID, 3)
    by_name = {s.name: s for s in spans}
    server = by_name["chat plain"]
    assert server.kind == SERVER and server.parent_id == CLIENT_SPAN
    a = server.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "anthropic"
    assert a["gen_ai.request.model"] == "plain"
    assert a["gen_ai.response.model"] == "plain"
    assert a["gen_ai.request.max_tokens"] == 64
    assert a["gen_ai.request.temperature"] == 0.5
    assert a["gen_ai.response.id"].startswith("msg_")
    assert a["gen_ai.response.finish_reasons"] == ["end_turn"]
    assert a["gen_ai.usage.output_tokens"] > 0 and a["gen_ai.usage.input_tokens"] > 0
    assert a["gateway.client"] == "alice"
    assert a["gateway.session"]  # the session key the replica choice used
    assert a["http.response.status_code"] == 200
    assert server.resource["service.name"] == "llm-gateway"
    translate = by_name["translate"]
    assert translate.parent_id == server.span_id
    upstream = by_name["chat ok"]
    assert upstream.kind == CLIENT and upstream.parent_id == server.span_id
    assert upstream.attributes["server.address"] == "127.0.0.1"
    assert upstream.attributes["server.port"] == stub_port
    assert upstream.attributes["gen_ai.request.model"] == "ok"
    # the engine got the upstream span's context: its work would be that span's child
    (chat,) = [r for r in stub_requests(stub_url) if r["path"].endswith("/chat/completions")]
    sent = {k.lower(): v for k, v in chat["headers"].items()}
    assert sent["traceparent"] == f"00-{TRACE_ID}-{upstream.span_id}-01"
    assert sent["tracestate"] == "vendor=1"
    # the metrics, exported every second
    wait_until(lambda: collector.metric_points("gen_ai.client.token.usage"), timeout=30)
    wait_until(lambda: collector.metric_points("gen_ai.server.time_to_first_token"), timeout=30)
    usage = collector.metric_points("gen_ai.client.token.usage")
    kinds = {attrs["gen_ai.token.type"] for attrs, _ in usage}
    assert kinds == {"input", "output"}
    assert all(attrs["gateway.client"] == "alice" for attrs, _ in usage)
    for name in ("gen_ai.client.operation.duration", "gen_ai.server.request.duration"):
        wait_until(lambda name=name: collector.metric_points(name), timeout=30)  # type: ignore[misc]


def test_a_fallback_and_a_continuation_are_spans_of_the_request(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]], collector: Collector
) -> None:
    base, dead = _gateway(stub_url, gateway_factory, collector)
    dead_port = int(dead.split(":")[2].split("/")[0])
    fallback_trace = "11111111111111111111111111111111"
    status, _, body = post(
        f"{base}/llm/v1/messages",
        _ask("down", "fall back"),
        headers={"x-api-key": "anon-key", "traceparent": f"00-{fallback_trace}-{CLIENT_SPAN}-01"},
    )
    assert status == 200, body
    spans = _spans_of(collector, fallback_trace, 5)
    server = next(s for s in spans if s.kind == SERVER)
    assert server.attributes["gen_ai.response.model"] == "plain"  # the fallback answered
    failed = next(s for s in spans if s.kind == CLIENT and s.attributes["server.port"] == dead_port)
    assert failed.parent_id == server.span_id
    assert failed.attributes["error.type"] == "refused" and failed.status_code == 2
    fallback = next(s for s in spans if s.name == "fallback")
    assert fallback.attributes["gateway.fallback"] == "plain"
    answered = next(s for s in spans if s.kind == CLIENT and s.parent_id == fallback.span_id)
    assert "error.type" not in answered.attributes

    cut_trace = "22222222222222222222222222222222"
    status, _, body = post(
        f"{base}/llm/v1/messages",
        _ask("cut-once", "weather in Paris, traced?", stream=True, tools=TOOLS),
        headers={"x-api-key": "anon-key", "traceparent": f"00-{cut_trace}-{CLIENT_SPAN}-01"},
    )
    assert status == 200 and b"event: error" not in body, body
    spans = _spans_of(collector, cut_trace, 5)
    server = next(s for s in spans if s.kind == SERVER)
    continuation = next(s for s in spans if s.name == "continuation")
    assert continuation.parent_id == server.span_id
    assert continuation.attributes["gateway.continuation.cause"]
    again = [s for s in spans if s.kind == CLIENT and s.parent_id == continuation.span_id]
    assert len(again) == 1  # the continuation's own upstream call
    first = [s for s in spans if s.kind == CLIENT and s.parent_id == server.span_id]
    assert len(first) == 1


def _trace_body(service: str) -> bytes:
    message = ExportTraceServiceRequest()
    rs = message.resource_spans.add()
    rs.resource.attributes.extend(
        [
            KeyValue(key="service.name", value=AnyValue(string_value=service)),
            # a client cannot name itself: the gateway's value replaces it
            KeyValue(key="gateway.client.name", value=AnyValue(string_value="mallory")),
        ]
    )
    span = rs.scope_spans.add().spans.add()
    span.name = "claude_code.llm_request"
    span.trace_id = bytes.fromhex(TRACE_ID)
    span.span_id = bytes.fromhex(CLIENT_SPAN)
    return message.SerializeToString()


def test_the_clients_own_otlp_is_forwarded_with_its_name(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]], collector: Collector
) -> None:
    base, _ = _gateway(stub_url, gateway_factory, collector)
    proto = {"Content-Type": "application/x-protobuf"}
    status, headers, _ = post(
        f"{base}/llm/v1/traces", _trace_body("claude-code"), {**proto, "x-api-key": ALICE}
    )
    assert status == 200 and headers["content-type"] == "application/x-protobuf"
    (forwarded,) = collector.of("traces")
    resource = {
        kv.key: value_of(kv.value) for kv in forwarded.resource_spans[0].resource.attributes
    }
    assert resource == {
        "service.name": "claude-code",
        "gateway.client.name": "alice",
        "enduser.id": "alice",
    }
    assert forwarded.resource_spans[0].scope_spans[0].spans[0].name == "claude_code.llm_request"

    logs = {"resourceLogs": [{"resource": {"attributes": []}, "scopeLogs": []}]}
    status, _, body = post(
        f"{base}/llm/v1/logs", logs, {"Authorization": f"Bearer {ALICE}"}
    )  # a bearer, as a signed-in Claude Code sends
    assert status == 200 and json.loads(body) == {}
    (sent,) = collector.of("logs", "application/json")
    assert sent["resourceLogs"][0]["resource"]["attributes"] == [
        {"key": "gateway.client.name", "value": {"stringValue": "alice"}},
        {"key": "enduser.id", "value": {"stringValue": "alice"}},
    ]

    # refused: no key, a body past max_forward_bytes, a body that is not OTLP
    assert post(f"{base}/llm/v1/metrics", b"", proto)[0] == 401
    big = b"\x00" * 70000
    assert post(f"{base}/llm/v1/metrics", big, {**proto, "x-api-key": ALICE})[0] == 413
    assert post(f"{base}/llm/v1/metrics", b"\xff\xff", {**proto, "x-api-key": ALICE})[0] == 400
    assert len(collector.of("metrics")) == 0 or all(
        not any(
            kv.key == "gateway.client.name"
            for rm in m.resource_metrics
            for kv in rm.resource.attributes
        )
        for m in collector.of("metrics")
    )  # only the gateway's own metrics reached it


def test_managed_settings_point_claude_codes_telemetry_at_the_gateway(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]], collector: Collector
) -> None:
    base, _ = _gateway(stub_url, gateway_factory, collector)
    status, _, body = get(f"{base}/llm/managed/settings", {"x-api-key": ALICE})
    assert status == 200
    env = json.loads(body)["settings"]["env"]
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"{base}/llm"
    assert env["CLAUDE_CODE_ENABLE_TELEMETRY"] == "1"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
    for signal in ("METRICS", "LOGS", "TRACES"):
        assert env[f"OTEL_{signal}_EXPORTER"] == "otlp"
    assert env["CLAUDE_CODE_ENHANCED_TELEMETRY_BETA"] == "1"
    assert env["CLAUDE_CODE_PROPAGATE_TRACEPARENT"] == "1"


def test_without_telemetry_nothing_is_traced_or_forwarded(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]]
) -> None:
    base, _ = _gateway(stub_url, gateway_factory, None)
    clear_stub(stub_url)
    status, _, _ = post(
        f"{base}/llm/v1/messages",
        _ask("plain", "not traced"),
        headers={"x-api-key": ALICE, "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"},
    )
    assert status == 200
    (chat,) = [r for r in stub_requests(stub_url) if r["path"].endswith("/chat/completions")]
    assert "traceparent" not in {k.lower() for k in chat["headers"]}
    status, _, body = post(
        f"{base}/llm/v1/traces",
        _trace_body("claude-code"),
        {"Content-Type": "application/x-protobuf", "x-api-key": ALICE},
    )
    assert status == 404 and json.loads(body)["type"] == "error"
    _, _, body = get(f"{base}/llm/managed/settings", {"x-api-key": ALICE})
    assert not any(k.startswith("OTEL_") for k in json.loads(body)["settings"].get("env", {}))


def test_an_openai_route_is_a_server_span_with_its_upstream_call(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]], collector: Collector
) -> None:
    base, _ = _gateway(stub_url, gateway_factory, collector)
    trace = "33333333333333333333333333333333"
    status, _, body = post(
        f"{base}/llm/v1/chat/completions",
        {"model": "plain", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": ALICE, "traceparent": f"00-{trace}-{CLIENT_SPAN}-01"},
    )
    assert status == 200, body
    spans = _spans_of(collector, trace, 2)
    server = next(s for s in spans if s.kind == SERVER)
    assert server.name == "chat plain" and server.parent_id == CLIENT_SPAN
    assert server.attributes["gen_ai.provider.name"] == "openai"
    assert server.attributes["gen_ai.usage.input_tokens"] > 0
    assert server.attributes["gateway.client"] == "alice"
    upstream = next(s for s in spans if s.kind == CLIENT)
    assert upstream.parent_id == server.span_id
