"""Every failure path of /v1/messages through the real gateway process (scripted stub upstream).

After the first byte: a well-formed stream ending message_start.. content_block_stop.. one
`error` event.. message_stop, which the Python SDK raises as APIStatusError with the right
type. Before it: a JSON error with the real status, which the SDK maps to its error class.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import anthropic
import pytest

from tests import sdk
from tests.anthropic_stream_check import check_stream
from tests.conftest import stub_config
from tests.procs import post as _post

pytestmark = pytest.mark.e2e


def _body(model: str, stream: bool) -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": 50,
        "stream": stream,
        "messages": [{"role": "user", "content": "hi"}],
    }


# scenario -> error.type of the in-band error event
MIDSTREAM = [
    ("inband-error", "api_error"),
    ("malformed", "api_error"),
    ("cut-mid", "api_error"),
    ("hang-mid", "timeout_error"),
    ("eof-no-finish", "api_error"),
]


@pytest.mark.parametrize("scenario,error_type", MIDSTREAM)
def test_midstream_failure_ends_with_the_envelope(stub_gateway, scenario, error_type) -> None:
    _, base = stub_gateway
    status, headers, raw = _post(base + "/v1/messages", _body(f"m-{scenario}", True))
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = check_stream(raw)
    errors = [e for e in events if e["type"] == "error"]
    assert len(errors) == 1 and errors[0]["error"]["type"] == error_type
    assert events[-1] == {"type": "message_stop"}
    text = raw.decode()
    for leak in ("10.0.0.9", "http://", "Traceback", "not json"):
        assert leak not in text
    client = sdk.client(base, api_key="k", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as info:
        with client.messages.stream(
            model=f"m-{scenario}", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
        ) as s:
            s.get_final_message()
    assert info.value.type == error_type


# scenario -> (status, error.type, SDK class, needs retry-after)
BEFORE_FIRST_BYTE = [
    ("status:503", 529, "overloaded_error", anthropic.InternalServerError, True),
    ("status:429", 429, "rate_limit_error", anthropic.RateLimitError, True),
    ("status:500:traceback", 500, "api_error", anthropic.InternalServerError, False),
    ("status:400", 400, "invalid_request_error", anthropic.BadRequestError, False),
    ("status:404", 500, "api_error", anthropic.InternalServerError, False),
    ("hang-headers", 504, "timeout_error", anthropic.InternalServerError, False),
]


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
@pytest.mark.parametrize("scenario,status,error_type,sdk_error,retry_after", BEFORE_FIRST_BYTE)
def test_failure_before_first_byte_is_a_json_error(
    stub_gateway, scenario, status, error_type, sdk_error, retry_after, stream
) -> None:
    _, base = stub_gateway
    got, headers, raw = _post(base + "/v1/messages", _body(f"m-{scenario}", stream))
    assert got == status
    assert headers["content-type"].startswith("application/json")
    body = json.loads(raw)
    assert body["type"] == "error" and body["error"]["type"] == error_type
    assert ("retry-after" in headers) == retry_after
    for leak in ("Traceback", "File ", "/opt/", "10.1.2.3", "http://", "127.0.0.1"):
        assert leak not in raw.decode()
    client = sdk.client(base, api_key="k", max_retries=0)
    with pytest.raises(sdk_error):
        client.messages.create(**_body(f"m-{scenario}", False))


def test_context_error_uses_claude_code_wording(stub_gateway) -> None:
    _, base = stub_gateway
    status, _, raw = _post(base + "/v1/messages", _body("m-status:400:context", True))
    assert status == 400
    assert json.loads(raw)["error"]["message"].startswith(
        "input length and `max_tokens` exceed context limit: 4000 + 1000 > 4096"
    )


def test_upstream_down_is_529(gateway_factory) -> None:
    from tests.conftest import stub_config
    from tests.procs import free_port

    _, url = gateway_factory(stub_config(f"http://127.0.0.1:{free_port()}/v1", models=("ok",)))
    status, headers, raw = _post(url + "/llm/v1/messages", _body("m-ok", True))
    assert status == 529 and headers.get("retry-after")
    assert json.loads(raw)["error"]["type"] == "overloaded_error"
    assert "127.0.0.1" not in raw.decode()


def test_good_streams_pass_the_checker_and_the_sdk(stub_gateway) -> None:
    _, base = stub_gateway
    client = sdk.client(base, api_key="k", max_retries=0)
    adaptive = {"type": "adaptive"}
    for model, kinds, stop, thinking in (
        ("m-ok", ["text"], "end_turn", None),
        ("m-reasoning", ["thinking", "text"], "end_turn", adaptive),
        ("m-reasoning", ["text"], "end_turn", None),  # not asked for: not shown
        ("m-tools", ["tool_use"], "tool_use", None),
        ("m-length", ["text"], "max_tokens", None),
    ):
        asked = {"thinking": thinking} if thinking else {}
        _, _, raw = _post(base + "/v1/messages", {**_body(model, True), **asked})
        check_stream(raw)
        with client.messages.stream(
            model=model,
            max_tokens=50,
            **asked,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "hi"}],
        ) as s:
            final = s.get_final_message()
        assert [b.type for b in final.content] == kinds
        assert final.stop_reason == stop
        if model == "m-tools":
            assert final.content[0].input == {"city": "Paris"}


def test_unknown_model_is_404_naming_it(stub_gateway) -> None:
    _, base = stub_gateway
    status, _, raw = _post(base + "/v1/messages", _body("no-such-model", False))
    assert status == 404
    assert json.loads(raw)["error"] == {
        "type": "not_found_error",
        "message": "model: no-such-model",
    }


def test_invalid_request_names_the_field(stub_gateway) -> None:
    _, base = stub_gateway
    body = _body("m-ok", False)
    body["messages"] = [{"role": "user", "content": []}]
    status, _, raw = _post(base + "/v1/messages?beta=true", body)
    assert status == 400
    err = json.loads(raw)["error"]
    assert err["type"] == "invalid_request_error"
    assert err["message"].startswith("messages.0.content")


@pytest.mark.parametrize("display", ["summarized", "omitted"])
def test_thinking_display_omitted_returns_signed_empty_thinking(stub_gateway, display: str) -> None:
    """display "omitted": the thinking block is kept (empty, signed), its text is not sent."""
    _, base = stub_gateway
    client = sdk.client(base, api_key="k", max_retries=0)
    thinking = {"type": "adaptive", "display": display}
    hidden = display == "omitted"
    buffered = client.messages.create(
        model="m-reasoning",
        max_tokens=50,
        thinking=thinking,
        messages=[{"role": "user", "content": "hi"}],
    )
    with client.messages.stream(
        model="m-reasoning",
        max_tokens=50,
        thinking=thinking,
        messages=[{"role": "user", "content": "hi"}],
    ) as s:
        streamed = s.get_final_message()
    for message in (buffered, streamed):
        assert [b.type for b in message.content] == ["thinking", "text"]
        block = message.content[0]
        assert block.signature
        assert (block.thinking == "") is hidden
    _, _, raw = _post(base + "/v1/messages", {**_body("m-reasoning", True), "thinking": thinking})
    check_stream(raw)
    assert (b'"thinking_delta"' in raw) is not hidden
    assert b'"signature_delta"' in raw


def test_reasoning_nobody_asked_for_is_not_shown_and_is_counted(stub_url, gateway_factory) -> None:
    """Round 3, thinking only when asked: no ``thinking`` in the request, so no thinking
    block in the buffered reply or the stream, even though the upstream reasoned; each
    such reply counts in llm_gateway_reasoning_hidden_total{model}."""
    _, url = gateway_factory(stub_config(stub_url, models=("reasoning",)))
    client = sdk.client(url + "/llm", api_key="k", max_retries=0, _strict_response_validation=True)
    hi = [{"role": "user", "content": "hi"}]
    buffered = client.messages.create(model="m-reasoning", max_tokens=50, messages=hi)
    with client.messages.stream(model="m-reasoning", max_tokens=50, messages=hi) as s:
        streamed = s.get_final_message()
    _, _, raw = _post(url + "/llm/v1/messages", _body("m-reasoning", True))
    assert b"thinking" not in raw
    check_stream(raw)
    for message in (buffered, streamed):
        assert [(b.type, getattr(b, "text", None)) for b in message.content] == [
            ("text", "Hello from the stub.")
        ]
    disabled = client.messages.create(
        model="m-reasoning", max_tokens=50, messages=hi, thinking={"type": "disabled"}
    )
    assert [b.type for b in disabled.content] == ["text"]
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        metrics = resp.read().decode()
    assert 'llm_gateway_reasoning_hidden_total{model="m-reasoning"} 4.0' in metrics
