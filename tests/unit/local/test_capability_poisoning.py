"""What a route learns from an upstream refusal (gateway/local/capabilities.py,
gateway/text/refusals.py, gateway/messages/call.py's ``fall_back``) is shared by every client of
the route, so no client may teach it.

Engines quote the client's input in their errors. Recorded from the xllamacpp llama-server the
e2e tests run, a JSON schema whose ``type`` is a refusal's wording:
``400 {"error":{"code":400,"message":"Unable to generate parser for this template. Automatic
parser generation failed: JSON schema error at #: unrecognized type image input is not
supported","type":"invalid_request_error"}}``. Before, that one request, with no image at all,
made the route send every later client's images as text for the life of the process.

The fake engine here answers as the real ones do (their recorded error bodies), and, for the
worst case, with the client's own text as its whole message.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway import errors
from gateway.local.capabilities import Learned, held
from gateway.messages import call as messages_call
from gateway.messages.deps import MessagesDeps
from gateway.messages.request.validate import validate_messages
from gateway.ops.config import ModelRoute, UpstreamConfig
from gateway.ops.metrics import Metrics
from gateway.text import jsonutil
from gateway.text.redact import NO_SECRETS
from gateway.text.refusals import refusal
from gateway.upstream.client import UpstreamClient
from gateway.upstream.send import Upstreams

PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJ"
    "RU5ErkJggg=="
)
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
REF = {"type": "tool_reference", "tool_name": "Read"}
LLAMA_IMAGE = (
    "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"
)
LLAMA_SCHEMA = (
    "Unable to generate parser for this template. Automatic parser generation "
    "failed: JSON schema error at #: unrecognized type {}"
)
# the chat part type that carries each capability's content
PART = {"images": "image_url", "tool_references": "tool_reference"}


def _llama(status: int, message: str) -> bytes:
    etype = "server_error" if status >= 500 else "invalid_request_error"
    return jsonutil.dumpb({"error": {"code": status, "message": message, "type": etype}})


def _vllm(message: str) -> bytes:
    return jsonutil.dumpb(
        {"error": {"message": message, "type": "BadRequestError", "param": "image", "code": 400}}
    )


# (route kind, capability, status, body): refusals as the engines send them
REFUSALS = [
    ("llamacpp", "images", 500, _llama(500, LLAMA_IMAGE)),
    # llama.cpp's kind sends references as text already: behind a generic kind
    ("openai", "tool_references", 400, _llama(400, "unsupported content[].type")),
    (
        "vllm",
        "images",
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
    ),
    (
        "vllm",
        "images",
        400,
        _vllm("At most 0 image(s) may be provided in one prompt. (parameter=image)"),
    ),
    ("vllm", "images", 400, _vllm("At most 0 image(s) may be provided in one request.")),
    ("vllm", "images", 400, _vllm("Qwen/Qwen3-8B is not a multimodal model")),
    ("sglang", "images", 400, _vllm("/models/qwen3 is not a multimodal model")),
    ("ollama", "images", 500, b'{"error":"this model is missing data required for image input"}'),
    (
        "ollama",
        "images",
        400,
        jsonutil.dumpb(
            {
                "error": {
                    "message": "this model is missing data required for image input",
                    "type": "api_error",
                    "param": None,
                    "code": None,
                }
            }
        ),
    ),
]


def _message(raw: bytes) -> str:
    body = json.loads(raw)
    error = body.get("error", body)
    return error if isinstance(error, str) else error["message"]


def _route(kind: str, capability: str, ttl: float = 600.0) -> ModelRoute:
    upstream = UpstreamConfig(name="u", base_url="http://127.0.0.1:9/v1", kind=kind)
    return ModelRoute(
        name="m",
        upstream=upstream,
        upstream_model="org/model",
        capability_ttl=ttl,
        **{capability: "auto"},
    )


def _request(content: str | None, place: str = "", poison: str = "") -> dict[str, Any]:
    """A session's request whose last tool result holds ``content`` (an image or a
    tool_reference part, or neither), with ``poison`` at ``place``."""
    result: list[dict[str, Any]] = [{"type": "text", "text": "done"}]
    if content == "images":
        result.append(IMAGE)
    elif content == "tool_references":
        result.insert(0, REF)
    req: dict[str, Any] = {
        "model": "m",
        "max_tokens": 8,
        "tools": [
            {"name": "Read", "description": "reads a file", "input_schema": {"type": "object"}}
        ],
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}],
            },
        ],
    }
    if place == "schema type":
        req["output_config"] = {"format": {"type": "json_schema", "schema": {"type": poison}}}
    elif place == "system prompt":
        req["system"] = poison
    elif place == "text":
        req["messages"][0]["content"] = poison
    elif place == "tool description":
        req["tools"][0]["description"] = poison
    elif place == "tool schema type":
        req["tools"][0]["input_schema"] = {"type": "object", "properties": {"a": {"type": poison}}}
    elif place == "tool result":
        result[0]["text"] = poison
    return validate_messages(req)


class Engine:
    """Answers a chat body as an engine would: ``lacks`` content it refuses with ``refusal``
    (status, body); ``echo``: an engine that quotes the client's input, ``"schema"`` as
    llama.cpp does (a schema ``type`` it does not know, in its message), or a string ``s``:
    a request holding ``s`` anywhere is answered with ``s`` as the whole message."""

    def __init__(
        self,
        lacks: frozenset[str] = frozenset(),
        refusal: tuple[int, bytes] = (500, b""),
        echo: str = "",
        echo_status: int = 400,
    ) -> None:
        self.lacks, self.refusal, self.echo, self.echo_status = lacks, refusal, echo, echo_status
        self.sent: list[dict[str, Any]] = []

    def answer(self, payload: bytes) -> tuple[int, bytes] | None:
        body = json.loads(payload)
        self.sent.append(body)
        schema = (body.get("response_format") or {}).get("json_schema", {}).get("schema", {})
        if self.echo == "schema" and schema.get("type", "object") not in (
            "object",
            "array",
            "string",
            "number",
            "integer",
            "boolean",
            "null",
        ):
            return 400, _llama(400, LLAMA_SCHEMA.format(schema["type"]))
        if self.echo and self.echo != "schema" and self.echo in payload.decode():
            return self.echo_status, _llama(self.echo_status, self.echo)
        if _parts(body) & self.lacks:
            return self.refusal
        return None


def _parts(body: dict[str, Any]) -> frozenset[str]:
    """The capabilities whose content parts a chat body holds."""
    found = set()
    for message in body["messages"]:
        if isinstance(message.get("content"), list):
            found |= {c for c, t in PART.items() if any(p["type"] == t for p in message["content"])}
    return frozenset(found)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _deps(learned: Learned) -> tuple[MessagesDeps, CollectorRegistry]:
    registry = CollectorRegistry()
    upstream = UpstreamConfig(name="u", base_url="http://127.0.0.1:9/v1")
    ups = Upstreams(
        clients={"u": UpstreamClient(upstream)}, metrics=Metrics(registry), secrets=NO_SECRETS
    )
    return MessagesDeps(upstreams=ups, signing_key=b"k" * 32, learned=learned), registry


async def _call(
    monkeypatch: pytest.MonkeyPatch,
    deps: MessagesDeps,
    route: ModelRoute,
    engine: Engine,
    req: dict[str, Any],
) -> Any:
    """One Messages call to ``engine``: what it answered ("reply"), or the error raised."""

    async def fake_send(ups: Any, route: Any, path: str, payload: bytes, **kw: Any) -> Any:
        answer = engine.answer(payload)
        if answer is not None:
            raise errors.from_upstream(*answer, hosts=("127.0.0.1:9",))
        return "reply"

    monkeypatch.setattr(messages_call, "send", fake_send)
    try:
        return await messages_call.Call(deps, req, route).send("req_1")
    except errors.GatewayError as err:
        return err


async def _count_tokens(
    monkeypatch: pytest.MonkeyPatch,
    deps: MessagesDeps,
    route: ModelRoute,
    engine: Engine,
    req: dict[str, Any],
) -> Any:
    async def fake_count(
        ups: Any, route: Any, chat: dict[str, Any], request_id: Any, **kw: Any
    ) -> Any:
        answer = engine.answer(jsonutil.dumpb(chat))
        if answer is not None:
            raise errors.from_upstream(*answer)
        return 7, True

    monkeypatch.setattr(messages_call.tokens, "count", fake_count)
    try:
        return await messages_call.count_input_tokens(deps, req, route, "req_1")
    except errors.GatewayError as err:
        return err


PLACES = [
    "schema type",
    "system prompt",
    "text",
    "tool description",
    "tool schema type",
    "tool result",
]

# (label, route kind, capability, the engine that quotes, the poison, with the content?)
POISONINGS: list[tuple[str, str, str, Engine, str, bool]] = []
for _content in (False, True):
    # llama.cpp's own quoting (recorded): the wording anywhere in its message
    POISONINGS.append(
        (
            f"llama.cpp schema type quoted, content={_content}",
            "llamacpp",
            "images",
            Engine(echo="schema"),
            "image input is not supported",
            _content,
        )
    )
    for _kind, _capability, _status, _raw in REFUSALS:
        # the worst case: the engine's whole message is the client's text, a refusal's shape
        for _place in PLACES:
            POISONINGS.append(
                (
                    f"{_kind} {_capability} {_status} in {_place}, content={_content}",
                    _kind,
                    _capability,
                    Engine(echo=_message(_raw), echo_status=_status),
                    _message(_raw),
                    _content,
                )
            )


@pytest.mark.parametrize(
    ("kind", "capability", "engine", "poison", "with_content"),
    [p[1:] for p in POISONINGS],
    ids=[p[0] for p in POISONINGS],
)
async def test_no_client_teaches_a_route_its_engine_refuses_content(
    kind: str,
    capability: str,
    engine: Engine,
    poison: str,
    with_content: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    learned = Learned(clock=Clock())
    deps, _ = _deps(learned)
    route = _route(kind, capability)
    place = "schema type" if engine.echo == "schema" else None
    for where in [place] if place else PLACES:
        engine.sent.clear()
        req = _request(capability if with_content else None, where, poison)
        await _call(monkeypatch, deps, route, engine, req)
        await _count_tokens(monkeypatch, deps, route, engine, req)
        assert learned.refused("m") == frozenset(), where
        if not with_content:  # nothing to send as text: the error is the client's, once
            assert len(engine.sent) == 2, where  # the message and count_tokens
    # a later client's content is sent as it is, once
    engine.sent.clear()
    assert await _call(monkeypatch, deps, route, engine, _request(capability)) == "reply"
    assert [_parts(body) for body in engine.sent] == [{capability}]


@pytest.mark.parametrize(
    ("kind", "capability", "status", "raw"),
    REFUSALS,
    ids=[f"{k}-{c}-{s}-{i}" for i, (k, c, s, _) in enumerate(REFUSALS)],
)
async def test_a_real_refusal_teaches_the_route_until_its_ttl(
    kind: str, capability: str, status: int, raw: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    learned = Learned(clock=clock)
    deps, registry = _deps(learned)
    route = _route(kind, capability, ttl=60)
    engine = Engine(lacks=frozenset({capability}), refusal=(status, raw))
    assert refusal(status, _message(raw)) is not None

    assert await _call(monkeypatch, deps, route, engine, _request(capability)) == "reply"
    assert [_parts(body) for body in engine.sent] == [{capability}, set()]  # then as text
    assert learned.refused("m") == {capability}
    assert (
        registry.get_sample_value(
            "llm_gateway_capability_fallbacks_total", {"model": "m", "capability": capability}
        )
        == 1
    )
    # the session's next request goes straight to text; and count_tokens
    engine.sent.clear()
    assert await _call(monkeypatch, deps, route, engine, _request(capability)) == "reply"
    assert await _count_tokens(monkeypatch, deps, route, engine, _request(capability)) == (7, True)
    assert [_parts(body) for body in engine.sent] == [set(), set()]

    # past the ttl: the next request with that content is a probe, and the refusal renews it
    clock.now += 59
    assert learned.refused("m") == {capability}
    clock.now += 2
    assert learned.refused("m") == frozenset()
    engine.sent.clear()
    assert await _call(monkeypatch, deps, route, engine, _request(capability)) == "reply"
    assert [_parts(body) for body in engine.sent] == [{capability}, set()]
    assert learned.refused("m") == {capability}
    # an engine that now takes it (restarted with a projector) gets it after the ttl
    clock.now += 61
    engine.lacks = frozenset()
    engine.sent.clear()
    assert await _call(monkeypatch, deps, route, engine, _request(capability)) == "reply"
    assert [_parts(body) for body in engine.sent] == [{capability}]


async def test_a_refusal_of_a_request_quoting_the_wording_is_not_learnt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that quotes the refusal (say, pasting the error it got) with an image: this
    request is still sent again as text, but the route learns nothing from it."""
    learned = Learned(clock=Clock())
    deps, _ = _deps(learned)
    route = _route("llamacpp", "images")
    engine = Engine(lacks=frozenset({"images"}), refusal=(500, _llama(500, LLAMA_IMAGE)))
    req = _request("images", "text", "why do I get: IMAGE INPUT IS NOT SUPPORTED?")
    assert await _call(monkeypatch, deps, route, engine, req) == "reply"
    assert [_parts(body) for body in engine.sent] == [{"images"}, set()]
    assert learned.refused("m") == frozenset()


async def test_a_route_set_to_insist_gets_no_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    learned = Learned(clock=Clock())
    deps, _ = _deps(learned)
    route = replace(_route("llamacpp", "images"), images="yes")
    engine = Engine(lacks=frozenset({"images"}), refusal=(500, _llama(500, LLAMA_IMAGE)))
    err = await _call(monkeypatch, deps, route, engine, _request("images"))
    assert isinstance(err, errors.GatewayError) and err.refused == "images"
    assert len(engine.sent) == 1 and learned.refused("m") == frozenset()


@pytest.mark.parametrize(
    ("message", "refuses"),
    [
        (LLAMA_IMAGE, "images"),
        ("image input is not supported", "images"),  # builds before the hint
        ("  " + LLAMA_IMAGE + "\n", "images"),
        ("unsupported content[].type", "tool_references"),
        ("At most 0 image(s) may be provided in one prompt. (parameter=image)", "images"),
        ("this model is missing data required for image input", "images"),
        ("This server does not support embeddings. Start it with `--embeddings`", "server"),
        # quoting the client: the wording is not the whole message
        (LLAMA_SCHEMA.format("image input is not supported"), None),
        (
            "Unable to generate parser for this template. Automatic parser generation failed: JSON "
            "schema error at #: unsupported $ref image input is not supported, only references "
            "into the same document are supported",
            None,
        ),
        ("unsupported content[].type: image input is not supported", None),
        ("At most 0 image(s) may be provided in one prompt. x", None),
        ("At most 1 image(s) may be provided in one prompt.", None),  # a limit, not a refusal
        ("unrecognized type foo is not a multimodal model", None),
        ("x" * 600 + " is not a multimodal model", None),
        ("tool 'this model is missing data required for image input' not found", None),
    ],
)
def test_a_refusal_is_the_engines_whole_message(message: str, refuses: str | None) -> None:
    found = refusal(500, message)
    assert (found.refuses if found else None) == refuses


def test_learned_routes_are_bounded_and_expire_with_the_clock() -> None:
    clock = Clock()
    learned = Learned(limit=2, clock=clock)
    assert learned.learn("a", "images", 10) is True
    assert learned.learn("a", "images", 10) is False  # logged once per ttl
    assert learned.learn("a", "tool_references", 100) is True
    clock.now += 11
    assert learned.refused("a") == {"tool_references"}
    assert learned.learn("a", "images", 10) is True  # learnt anew past its ttl
    learned.learn("b", "images", 10)
    learned.learn("c", "images", 10)
    assert learned.refused("a") == frozenset()  # the oldest route forgotten past the bound
    assert len(learned._refused) == 2


@pytest.mark.parametrize(
    ("chat", "holds"),
    [
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image_url",
                                "image_url": {"url": "data:image/png;base64,AA=="},
                            }
                        ],
                    }
                ]
            },
            {"images"},
        ),
        (
            {
                "messages": [
                    {
                        "role": "tool",
                        "tool_call_id": "c",
                        "content": [{"type": "tool_reference", "name": "Read"}],
                    }
                ]
            },
            {"tool_references"},
        ),
        # the part's shape where no part is: in a schema, in text
        (
            {
                "messages": [{"role": "user", "content": 'a "type":"image_url" part'}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "schema": {
                            "type": "image_url",
                            "properties": {"type": {"type": "tool_reference"}},
                        }
                    },
                },
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "image_url"}},
                    }
                ],
            },
            set(),
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                    {"role": "assistant", "content": None},
                ]
            },
            set(),
        ),
    ],
)
def test_what_a_payload_holds_is_read_from_its_messages(
    chat: dict[str, Any], holds: set[str]
) -> None:
    assert held(jsonutil.dumpb(chat)) == holds
