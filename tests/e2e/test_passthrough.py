"""OpenAI pass-through, through a real gateway process in front of the scripted stub.

Byte-for-byte relay except ``model``; unknown model 404 in OpenAI's shape with no
upstream call; upstream down / 500-with-traceback scrubbed; request ids; the
client's own credentials never reach the upstream.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import clear_stub, stub_config, stub_requests
from tests.logs import access_lines, wait_for_line
from tests.procs import free_port, get, post
from tests.stub_upstream import script

pytestmark = pytest.mark.e2e


CHAT = {"model": "m-ok", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def test_buffered_relay_is_byte_exact_except_model(stub_gateway, stub_url) -> None:
    _, base = stub_gateway
    clear_stub(stub_url)
    status, headers, body = post(base + "/v1/chat/completions", CHAT)
    assert status == 200
    assert headers["content-type"].startswith("application/json")
    direct = post(stub_url + "/chat/completions", {**CHAT, "model": "ok"})[2]
    assert body == direct.replace(b'"model":"ok"', b'"model":"m-ok"')
    assert json.loads(body)["model"] == "m-ok"
    seen = stub_requests(stub_url)[0]
    assert seen["body"]["model"] == "ok"  # the route's upstream_model went upstream
    assert seen["body"]["messages"] == CHAT["messages"]


def test_streamed_relay_is_byte_exact_except_model(stub_gateway, stub_url) -> None:
    _, base = stub_gateway
    status, headers, body = post(base + "/v1/chat/completions", {**CHAT, "stream": True})
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert headers.get("cache-control") == "no-cache"
    assert "content-encoding" not in headers
    frames, _ = script("ok")
    expected = b"".join(frames).replace(b'"model":"ok"', b'"model":"m-ok"')
    assert body == expected
    assert body.endswith(b"data: [DONE]\n\n")


def test_unknown_model_is_404_openai_shape_without_upstream_call(stub_gateway, stub_url) -> None:
    _, base = stub_gateway
    clear_stub(stub_url)
    status, _, body = post(base + "/v1/chat/completions", {**CHAT, "model": "nope"})
    assert status == 404
    err = json.loads(body)["error"]
    assert err["type"] == "not_found_error" and "nope" in err["message"]
    assert stub_requests(stub_url) == []


def test_upstream_500_with_traceback_is_scrubbed(stub_gateway) -> None:
    _, base = stub_gateway
    for stream in (False, True):
        status, _, body = post(
            base + "/v1/chat/completions",
            {**CHAT, "model": "m-status:500:traceback", "stream": stream},
        )
        assert status == 500
        text = body.decode()
        assert json.loads(text)["error"]["message"] == "Internal server error"
        for leak in ("Traceback", "File", "/opt/", "10.1.2.3", "http://", "CUDA"):
            assert leak not in text


def test_upstream_down_is_503_overloaded(gateway_factory) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    _, base = gateway_factory(stub_config(dead, models=("ok",)))
    status, headers, body = post(base + "/llm/v1/chat/completions", CHAT)
    assert status == 503
    assert headers.get("retry-after")
    text = body.decode()
    assert "127.0.0.1" not in text and "Connect" not in text
    assert json.loads(text)["error"]["type"] == "server_error"


def test_request_id_header_taken_or_generated(stub_gateway) -> None:
    _, base = stub_gateway
    _, headers, _ = post(base + "/v1/chat/completions", CHAT, {"x-request-id": "abc-123"})
    assert headers["request-id"] == "abc-123"
    _, headers, _ = post(base + "/v1/chat/completions", CHAT, {"x-request-id": "bad id\u00e9"})
    assert headers["request-id"].startswith("req_") and len(headers["request-id"]) == 28
    _, headers, _ = post(base + "/v1/chat/completions", {**CHAT, "stream": True})
    assert headers["request-id"].startswith("req_")


def test_client_credentials_never_reach_upstream(stub_gateway, stub_url) -> None:
    _, base = stub_gateway
    clear_stub(stub_url)
    for stream in (False, True):
        post(
            base + "/v1/chat/completions",
            {**CHAT, "stream": stream},
            {
                "Authorization": "Bearer client-secret",
                "x-api-key": "client-secret-2",
                "Cookie": "session=1",
                "X-Custom": "v",
            },
        )
    seen = stub_requests(stub_url)
    assert len(seen) == 2
    for req in seen:
        headers = {k.lower() for k in req["headers"]}
        assert "authorization" not in headers and "x-api-key" not in headers
        assert "cookie" not in headers and "x-custom" not in headers
        assert "client-secret" not in json.dumps(req)


def test_upstream_key_is_sent(stub_url, gateway_factory) -> None:
    cfg = stub_config(stub_url, models=("ok",), extra_upstream='api_key_env = "UP_KEY"')
    _, base = gateway_factory(cfg, env={"UP_KEY": "sk-upstream"})
    clear_stub(stub_url)
    post(base + "/llm/v1/chat/completions", CHAT, {"Authorization": "Bearer client"})
    seen = stub_requests(stub_url)
    assert seen[0]["headers"].get("Authorization") == "Bearer sk-upstream"


def test_models_lists_in_both_shapes(stub_gateway) -> None:
    _, base = stub_gateway
    _, _, body = get(base + "/v1/models")
    openai = json.loads(body)
    assert openai["object"] == "list"
    first = openai["data"][0]
    assert {"id": "m-ok", "object": "model", "owned_by": "stub"}.items() <= first.items()
    _, _, body = get(base + "/v1/models?limit=2", {"anthropic-version": "2023-06-01"})
    page = json.loads(body)
    assert [m["type"] for m in page["data"]] == ["model", "model"]
    assert page["has_more"] is True and page["first_id"] == "m-ok"
    _, _, body = get(
        base + f"/v1/models?after_id={page['last_id']}&limit=1000",
        {"anthropic-version": "2023-06-01"},
    )
    rest = json.loads(body)
    assert rest["has_more"] is False and rest["data"][0]["id"] == "m-tools"
    status, _, body = get(base + "/v1/models/m-ok", {"anthropic-version": "2023-06-01"})
    assert status == 200 and json.loads(body)["id"] == "m-ok"
    status, _, body = get(base + "/v1/models/nope", {"anthropic-version": "2023-06-01"})
    assert status == 404
    assert json.loads(body)["error"] == {"type": "not_found_error", "message": "model: nope"}
    status, _, body = get(base + "/v1/models/nope")
    assert status == 404 and "error" in json.loads(body)


def test_health_and_ready(stub_gateway) -> None:
    _, base = stub_gateway
    root = base.removesuffix("/llm")
    assert get(root + "/health")[0] == 200
    assert get(root + "/ready")[0] == 200
    status, _, body = get(root + "/metrics")
    assert status == 200 and b"llm_gateway_requests_total" in body


def test_access_log_is_json_with_request_fields(stub_gateway) -> None:
    proc, base = stub_gateway
    post(base + "/v1/chat/completions", CHAT, {"x-request-id": "log-check-1"})
    wait_for_line(
        proc.output, lambda ln: ln.get("request_id") == "log-check-1", "the access line", timeout=3
    )  # log lines are flushed every 0.5 s
    access = access_lines(proc.output(), request_id="log-check-1")
    assert len(access) == 1
    line = access[0]
    assert (line["method"], line["route"], line["model"], line["upstream"], line["status"]) == (
        "POST",
        "chat",
        "m-ok",
        "stub",
        200,
    )
    assert "duration_ms" in line
    assert "hi" not in json.dumps(line)
