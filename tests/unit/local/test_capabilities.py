"""Capabilities per route and upstream refusals (gateway/local/capabilities.py,
gateway/text/refusals.py, their use in errors.from_upstream and to_chat).

The upstream wordings are the engines' own: llama.cpp's were read from
tools/server/server-common.cpp (oaicompat_chat_params_parse) and answered so by the xllamacpp
server the e2e tests run (image without a projector: 500; a part type other than text,
image_url, input_audio: 400; embeddings without --embeddings: 501).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gateway import errors
from gateway.local import capabilities
from gateway.local.capabilities import Learned, named_tool_choice, setting, text_only
from gateway.messages.request.validate import validate_messages
from gateway.messages.to_chat.translate import to_chat
from gateway.ops.config import ConfigError, ModelRoute, UpstreamConfig, parse
from gateway.text import jsonutil
from gateway.text.refusals import REFUSALS

README = Path(__file__).resolve().parents[3] / "docs" / "local-engines.md"
LLAMA_IMAGE = (
    "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"
)
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJ"
    "RU5ErkJggg=="
)


def _route(kind: str = "llamacpp", **knobs: str) -> ModelRoute:
    upstream = UpstreamConfig(name="u", base_url="http://127.0.0.1:9/v1", kind=kind)
    return ModelRoute(name="m", upstream=upstream, upstream_model="org/model", **knobs)


def _body(message: str, code: int, etype: str = "server_error") -> bytes:
    return jsonutil.dumpb({"error": {"code": code, "message": message, "type": etype}})


# (upstream status, body, client status, error.type, refused, message starts with)
MAPPING = [
    (
        500,
        _body(LLAMA_IMAGE, 500),
        400,
        "invalid_request_error",
        "images",
        "this model does not support images: image input is not supported",
    ),
    (
        400,
        _body("unsupported content[].type", 400, "invalid_request_error"),
        400,
        "invalid_request_error",
        "tool_references",
        "this model's server does not support a content part type",
    ),
    (
        400,
        jsonutil.dumpb(
            {
                "object": "error",
                "message": "At most 0 image(s) may be provided in one prompt.",
                "type": "BadRequestError",
                "param": "image",
                "code": 400,
            }
        ),
        400,
        "invalid_request_error",
        "images",
        "this model does not support images",
    ),
    (
        400,
        _body("DeepSeek is not a multimodal model", 400),
        400,
        "invalid_request_error",
        "images",
        "this model does not support images",
    ),
    (
        500,
        jsonutil.dumpb({"error": "this model is missing data required for image input"}),
        400,
        "invalid_request_error",
        "images",
        "this model does not support images",
    ),
    (
        501,
        _body(
            "This server does not support embeddings. Start it with `--embeddings`",
            501,
            "not_supported_error",
        ),
        501,
        "not_supported",
        None,
        "Not supported by this model's server",
    ),
    (501, b"", 501, "not_supported", None, "Not supported by this model's server"),
    # unchanged: a 5xx naming nothing is a generic 500; 503 is overload
    (500, _body("boom at /src/x.cpp", 500), 500, "api_error", None, "Internal server error"),
    (503, _body(LLAMA_IMAGE, 503), 529, "overloaded_error", None, "Overloaded"),
]


@pytest.mark.parametrize(("status", "raw", "want", "etype", "refused", "message"), MAPPING)
def test_from_upstream_reads_refusals(
    status: int, raw: bytes, want: int, etype: str, refused: str | None, message: str
) -> None:
    err = errors.from_upstream(status, raw, hosts=("127.0.0.1:9",))
    assert (err.status, err.error_type, err.refused) == (want, etype, refused)
    assert err.message.startswith(message)
    if want == 501:
        assert err.headers["x-should-retry"] == "false"


def test_readme_table_lists_every_refusal_pattern() -> None:
    """docs/local-engines.md's "Upstream errors" table names each pattern of refusals.py."""
    text = README.read_text("utf-8")
    section = text.split("## Capabilities and upstream errors", 1)[1].split("\n## ", 1)[0]
    shown = set()
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 4 and cells[2].startswith("`") and cells[2].endswith("`"):
            shown.add(cells[2].strip("`").replace("\\|", "|"))
    assert shown == {r.pattern.pattern for r in REFUSALS}


@pytest.mark.parametrize(
    ("kind", "knobs", "images", "refs", "named"),
    [
        ("llamacpp", {}, "auto", "no", False),
        ("ollama", {}, "auto", "no", False),
        ("vllm", {}, "auto", "auto", True),
        ("sglang", {}, "auto", "auto", True),
        ("openai", {}, "auto", "auto", True),
        (
            "llamacpp",
            {"images": "no", "tool_references": "yes", "named_tool_choice": "yes"},
            "no",
            "yes",
            True,
        ),
        ("vllm", {"named_tool_choice": "no", "images": "yes"}, "yes", "auto", False),
    ],
)
def test_kind_defaults_and_knobs(
    kind: str, knobs: dict[str, str], images: str, refs: str, named: bool
) -> None:
    route = _route(kind, **knobs)
    assert (
        setting(route, "images"),
        setting(route, "tool_references"),
        named_tool_choice(route),
    ) == (images, refs, named)


def test_learned_refusals_per_route_bounded() -> None:
    learned = Learned(limit=2)
    route = _route("vllm")
    assert text_only(route, learned) == frozenset()
    assert learned.learn("m", "images", 600) is True
    assert learned.learn("m", "images", 600) is False  # logged once
    assert text_only(route, learned) == {"images"}
    # a route that insists on images never goes to text
    assert text_only(replace(route, images="yes"), learned) == frozenset()
    learned.learn("a", "images", 600)
    learned.learn("b", "images", 600)
    assert learned.refused("m") == frozenset()  # the oldest forgotten past the bound


@pytest.mark.parametrize("value", ["maybe", "true", ""])
def test_config_refuses_other_settings(value: str) -> None:
    data = {
        "upstreams": {"u": {"base_url": "http://h/v1"}},
        "models": [{"name": "m", "upstream": "u", "upstream_model": "x", "images": value}],
    }
    with pytest.raises(ConfigError, match=r"models\[0\]\.images: must be one of auto, yes, no"):
        parse(data, "t.toml", {})


def _req(content: Any, **extra: Any) -> dict[str, Any]:
    return validate_messages(
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": content}
                    ],
                },
            ],
            **extra,
        }
    )


IMAGE = {
    "type": "image",
    "source": {"type": "base64", "media_type": "image/png", "data": PNG * 200},
}
REF = {"type": "tool_reference", "tool_name": "Read"}


@pytest.mark.parametrize(
    ("content", "as_text", "tool_messages"),
    [
        (
            [{"type": "text", "text": "x"}, IMAGE],
            frozenset(),
            [
                [
                    {"type": "text", "text": "x"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64," + PNG * 200},
                    },
                ]
            ],
        ),
        (
            [{"type": "text", "text": "x"}, IMAGE],
            frozenset({"images"}),
            ["x\n[image: image/png, 14 KB, not shown: this model does not take images]"],
        ),
        (
            [{"type": "image", "source": {"type": "url", "url": "https://e.x/a.png"}}],
            frozenset({"images"}),
            ["[image: from a URL, not shown: this model does not take images]"],
        ),
        (
            [REF, {"type": "text", "text": "loaded"}],
            frozenset(),
            [[{"type": "tool_reference", "name": "Read"}], "loaded"],
        ),
        (
            [REF, {"type": "text", "text": "loaded"}],
            frozenset({"tool_references"}),
            ["Read\nloaded"],
        ),
    ],
)
def test_content_as_text(content: Any, as_text: frozenset[str], tool_messages: list[Any]) -> None:
    out = to_chat(
        _req(content, tools=[{"name": "f", "input_schema": {"type": "object"}}]),
        _route("vllm"),
        as_text=as_text,
    )
    assert [m["content"] for m in out["messages"] if m["role"] == "tool"] == tool_messages


@pytest.mark.parametrize(
    ("named_choice", "tools", "choice"),
    [
        (True, ["f", "g"], {"type": "function", "function": {"name": "g"}}),
        (False, ["g"], "required"),
    ],
)
def test_named_tool_choice(named_choice: bool, tools: list[str], choice: Any) -> None:
    req = validate_messages(
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": n, "input_schema": {"type": "object"}} for n in ("f", "g")],
            "tool_choice": {"type": "tool", "name": "g"},
        }
    )
    out = to_chat(req, _route(), named_choice=named_choice)
    assert [t["function"]["name"] for t in out["tools"]] == tools
    assert out["tool_choice"] == choice


@pytest.mark.parametrize(
    ("kind", "knobs", "expected"),
    [
        ("vllm", {}, frozenset()),
        ("llamacpp", {}, frozenset({"tool_references"})),
        ("vllm", {"images": "no"}, frozenset({"images"})),
        ("ollama", {"tool_references": "yes", "images": "no"}, frozenset({"images"})),
    ],
)
def test_text_only_with_nothing_learnt_is_made_once_per_route(
    kind: str, knobs: dict[str, str], expected: frozenset[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    learned = Learned()
    route = _route(kind, **knobs)
    calls: list[str] = []
    real = capabilities.setting

    def counted(route: Any, capability: str) -> str:
        calls.append(capability)
        return real(route, capability)

    monkeypatch.setattr(capabilities, "setting", counted)
    assert text_only(route, learned) == expected
    made = len(calls)
    assert text_only(route, learned) == expected
    assert len(calls) == made  # the second request asks nothing again
    # what is learnt still counts, and an equal route made anew is its own
    learned.learn("m", "images", 600)
    assert text_only(route, learned) == expected | (
        {"images"} if knobs.get("images") != "yes" else set()
    )
    assert text_only(replace(route, images="yes"), Learned()) == expected - {"images"}
