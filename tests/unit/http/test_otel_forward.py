"""The client's OTLP with its identity added (gateway/http/otel.py): every resource of every
signal, protobuf and JSON, gets ``gateway.client.name`` and ``enduser.id``; a value the client
set itself is replaced; what is not OTLP is a 400."""

from __future__ import annotations

import json

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from gateway import errors
from gateway.http.otel import with_identity_json, with_identity_protobuf

CASES = [
    ("traces", ExportTraceServiceRequest, "resource_spans", "resourceSpans"),
    ("metrics", ExportMetricsServiceRequest, "resource_metrics", "resourceMetrics"),
    ("logs", ExportLogsServiceRequest, "resource_logs", "resourceLogs"),
]


def _attrs(resource: object) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in resource.attributes}  # type: ignore[attr-defined]


@pytest.mark.parametrize(("signal", "kind", "field", "_json"), CASES)
def test_protobuf_every_resource_names_the_client(
    signal: str, kind: type, field: str, _json: str
) -> None:
    message = kind()
    for service in ("claude-code", "other"):
        item = getattr(message, field).add()
        item.resource.attributes.extend(
            [
                KeyValue(key="service.name", value=AnyValue(string_value=service)),
                KeyValue(key="enduser.id", value=AnyValue(string_value="mallory")),
            ]
        )
    out = kind()
    out.ParseFromString(with_identity_protobuf(signal, message.SerializeToString(), "alice"))
    got = [_attrs(item.resource) for item in getattr(out, field)]
    assert got == [
        {"service.name": "claude-code", "enduser.id": "alice", "gateway.client.name": "alice"},
        {"service.name": "other", "enduser.id": "alice", "gateway.client.name": "alice"},
    ]


@pytest.mark.parametrize(("signal", "_kind", "_field", "key"), CASES)
def test_json_every_resource_names_the_client(
    signal: str, _kind: type, _field: str, key: str
) -> None:
    body = {
        key: [
            {"resource": {"attributes": [{"key": "gateway.client.name", "value": {"x": 1}}]}},
            {},  # no resource: one is made
        ]
    }
    out = json.loads(with_identity_json(signal, json.dumps(body).encode(), "bob"))
    for item in out[key]:
        assert item["resource"]["attributes"] == [
            {"key": "gateway.client.name", "value": {"stringValue": "bob"}},
            {"key": "enduser.id", "value": {"stringValue": "bob"}},
        ]


@pytest.mark.parametrize(
    ("decode", "body"),
    [
        (with_identity_protobuf, b"\xff\xff\xff"),
        (with_identity_json, b"not json"),
        (with_identity_json, b'{"resourceLogs": [1]}'),  # another signal's list
        (with_identity_json, b"[]"),
        (with_identity_json, b'{"resourceSpans": [{"resource": []}]}'),
    ],
)
def test_what_is_not_otlp_is_a_400(decode: object, body: bytes) -> None:
    with pytest.raises(errors.InvalidRequest):
        decode("traces", body, "alice")  # type: ignore[operator]
