"""An image in a tool_result to a real text-only llama.cpp (no --mmproj), through the gateway.

llama.cpp refuses it before generating anything: ``500 {"error":{"code":500,"message":"image
input is not supported - hint: if this is unexpected, you may need to provide the mmproj",
"type":"server_error"}}`` (tools/server/server-common.cpp, oaicompat_chat_params_parse). The
gateway sends the request again with the image as placeholder text, answers 200, counts it,
and sends the rest of the session's requests (whose history still holds the image) as text
straight away: llama.cpp sees one request for each of them.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.procs import get, post

pytestmark = [pytest.mark.e2e, pytest.mark.llamacpp]

PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJ"
    "RU5ErkJggg=="
)
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "take a screenshot"},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "shot", "input": {}}],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [
                    {"type": "text", "text": "here it is"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                    },
                ],
            }
        ],
    },
]
TOOLS = [{"name": "shot", "description": "a screenshot", "input_schema": {"type": "object"}}]


def _sample(metrics: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in metrics.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return 0.0


def _metrics(root: str) -> str:
    status, _, raw = get(root + "/metrics")
    assert status == 200
    return raw.decode()


def _calls(root: str, code: str) -> float:
    return _sample(
        _metrics(root),
        "llm_gateway_upstream_requests_total",
        model="demo",
        upstream="llama",
        code=code,
    )


def _post(base: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, _, raw = post(base + path, body, {"anthropic-version": "2023-06-01"}, 60)
    return status, json.loads(raw)


def test_image_to_text_only_llama_falls_back_once_then_goes_straight_to_text(
    llama_gateway: Any,
) -> None:
    proc, base = llama_gateway
    root = base.removesuffix("/llm")
    body = {"model": "demo", "max_tokens": 8, "tools": TOOLS, "messages": HISTORY}
    status, reply = _post(base, "/v1/messages", body)
    assert status == 200, reply
    assert reply["type"] == "message"
    text = _metrics(root)
    assert (
        _sample(text, "llm_gateway_capability_fallbacks_total", model="demo", capability="images")
        == 1
    )
    assert (_calls(root, "500"), _calls(root, "200")) == (1, 1)

    # the next turn of the session (the image still in its history), streamed: straight to text
    turn = {
        **body,
        "stream": True,
        "messages": [
            *HISTORY,
            {"role": "assistant", "content": "I see it."},
            {"role": "user", "content": "thanks"},
        ],
    }
    status, _, raw = post(base + "/v1/messages", turn, {"anthropic-version": "2023-06-01"}, 60)
    assert status == 200 and b"event: message_stop" in raw
    # count_tokens too goes as text (llama.cpp's /apply-template refuses images the same way)
    status, counted = _post(
        base, "/v1/messages/count_tokens", {"model": "demo", "tools": TOOLS, "messages": HISTORY}
    )
    assert status == 200 and counted["input_tokens"] > 0
    text = _metrics(root)
    assert (
        _sample(text, "llm_gateway_capability_fallbacks_total", model="demo", capability="images")
        == 1
    )
    assert _calls(root, "500") == 1
    assert _calls(root, "200") == 4  # the retry, the stream, count_tokens' two calls
    assert proc.output().count('"capability_fallback"') == 1


def test_route_that_insists_on_images_gets_a_400_naming_the_cause(
    llama_server: str, gateway_factory: Any
) -> None:
    from tests.conftest import llama_config

    config = llama_config(llama_server).replace(
        "context_window = 1024", 'context_window = 1024\nimages = "yes"'
    )
    _, url = gateway_factory(config)
    status, reply = _post(
        url + "/llm", "/v1/messages", {"model": "demo", "max_tokens": 8, "messages": HISTORY[-1:]}
    )
    assert status == 400
    assert reply["error"]["type"] == "invalid_request_error"
    assert reply["error"]["message"].startswith(
        "this model does not support images: image input is not supported"
    )


POISON = "image input is not supported"  # llama.cpp's refusal, as a client may write it


def test_a_client_quoting_the_refusal_does_not_change_how_later_images_are_sent(
    llama_gateway: Any,
) -> None:
    """llama.cpp quotes a JSON schema's unknown ``type`` in its error (``400 "... JSON schema
    error at #: unrecognized type image input is not supported"``): neither that request,
    nor one holding an image too, teaches the route; a later client's image is still sent
    as an image (llama.cpp's 500 refusal of it is what shows it)."""
    proc, base = llama_gateway
    root = base.removesuffix("/llm")
    poisoned = {"type": "json_schema", "schema": {"type": POISON}}
    # no image at all: llama.cpp's error quotes the schema; the client gets it, once
    status, reply = _post(
        base,
        "/v1/messages",
        {
            "model": "demo",
            "max_tokens": 8,
            "output_config": {"format": poisoned},
            "messages": [{"role": "user", "content": "hi"}],
        },
    )
    assert status == 400, reply
    assert "unrecognized type" in reply["error"]["message"]
    assert (_calls(root, "400"), _calls(root, "500")) == (1, 0)
    # an image and the wording: the image is refused (llama.cpp's 500), sent again as text
    # for this request (then the schema's 400), and nothing is learnt
    status, reply = _post(
        base,
        "/v1/messages",
        {
            "model": "demo",
            "max_tokens": 8,
            "tools": TOOLS,
            "messages": HISTORY,
            "output_config": {"format": poisoned},
        },
    )
    assert status == 400, reply
    assert (_calls(root, "400"), _calls(root, "500")) == (2, 1)

    # a later client's image goes as an image: refused by this text-only llama.cpp, then text
    body = {"model": "demo", "max_tokens": 8, "tools": TOOLS, "messages": HISTORY}
    status, reply = _post(base, "/v1/messages", body)
    assert status == 200, reply
    assert (_calls(root, "500"), _calls(root, "200")) == (2, 1)
    assert proc.output().count('"capability_fallback"') == 1  # learnt from this one only
    # and from then on as text, straight away
    status, reply = _post(base, "/v1/messages", body)
    assert status == 200, reply
    assert (_calls(root, "500"), _calls(root, "200")) == (2, 2)
