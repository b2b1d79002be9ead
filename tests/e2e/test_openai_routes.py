"""The OpenAI routes beyond chat, through a real gateway process, with the official OpenAI SDK.

``/v1/completions``, ``/v1/embeddings`` and ``/v1/responses`` under the same aliases as
chat: the upstream gets the route's ``upstream_model`` and the rest of the body as sent
(``stream_options``, ``encoding_format`` included); the client gets the alias back, in a
Responses stream inside ``response.model`` too, with every named event kept. Upstream
errors come back scrubbed in OpenAI's shape; an unknown model is a 404 with no upstream
call. Anthropic endpoints the gateway does not implement answer a 404 that says so.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests import sdk
from tests.conftest import llama_config, stub_config
from tests.procs import get, post, start_gateway

pytestmark = pytest.mark.e2e

MODELS = ("ok", "status:500:traceback", "status:400", "status:429", "cut-mid")
TEXT = "Hello from the stub."
LEAKS = ("Traceback", "File", "/opt/", "10.1.2.3", "http://", "CUDA")


@pytest.fixture(scope="module")
def base(stub_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One gateway for the module (before the stub): its base URL with the /llm prefix."""
    proc, url = start_gateway(
        stub_config(stub_url, models=MODELS), tmp_path_factory.mktemp("openai-routes")
    )
    try:
        yield url + "/llm"
    finally:
        proc.stop()


@pytest.fixture
def client(base: str) -> Iterator[openai.OpenAI]:
    made = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=10)
    yield made
    made.close()


def upstream_requests(stub_url: str) -> list[dict[str, Any]]:
    root = stub_url.removesuffix("/v1")
    seen = json.loads(get(root + "/_requests")[2])
    req = urllib.request.Request(root + "/_requests", method="DELETE")
    with urllib.request.urlopen(req, timeout=5) as resp:
        resp.read()
    return seen


def call(client: openai.OpenAI, route: str, model: str, *, stream: bool = False) -> Any:
    """One SDK call on a route; a stream is read to its end (a list of its events)."""
    if route == "completions":
        got: Any = client.completions.create(
            model=model, prompt="Say hi", max_tokens=5, stream=stream
        )
    elif route == "embeddings":
        got = client.embeddings.create(model=model, input="hi")
    else:
        got = client.responses.create(model=model, input="Say hi", stream=stream)
    return list(got) if stream else got


ROUTE_CALLS = [
    ("completions", False),
    ("completions", True),
    ("embeddings", False),
    ("responses", False),
    ("responses", True),
]
ROUTE_IDS = [f"{r}-{'stream' if s else 'buffered'}" for r, s in ROUTE_CALLS]


# --- completions -------------------------------------------------------------------------------


def test_completions_buffered(client: openai.OpenAI, stub_url: str) -> None:
    upstream_requests(stub_url)
    got = client.completions.create(model="m-ok", prompt="Say hi", max_tokens=5)
    assert got.model == "m-ok"
    assert got.choices[0].text == TEXT and got.choices[0].finish_reason == "stop"
    assert got.usage is not None and got.usage.prompt_tokens == 12
    [seen] = upstream_requests(stub_url)
    assert seen["path"] == "/v1/completions"
    assert seen["body"] == {"model": "ok", "prompt": "Say hi", "max_tokens": 5}


def test_completions_stream_with_usage(client: openai.OpenAI, stub_url: str) -> None:
    upstream_requests(stub_url)
    chunks = list(
        client.completions.create(
            model="m-ok",
            prompt="Say hi",
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert {c.model for c in chunks} == {"m-ok"}
    assert "".join(c.choices[0].text for c in chunks if c.choices) == TEXT
    usage = chunks[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (12, 5)
    [seen] = upstream_requests(stub_url)
    # stream and stream_options go upstream as the client sent them, as on chat
    assert seen["body"]["stream"] is True
    assert seen["body"]["stream_options"] == {"include_usage": True}
    assert seen["body"]["model"] == "ok"


# --- embeddings --------------------------------------------------------------------------------


def test_embeddings(client: openai.OpenAI, stub_url: str) -> None:
    upstream_requests(stub_url)
    got = client.embeddings.create(model="m-ok", input=["first", "second"])
    assert got.model == "m-ok"
    assert [d.embedding for d in got.data] == [[1.0, 0.5, -0.25, 0.125], [2.0, 0.5, -0.25, 0.125]]
    assert got.usage.prompt_tokens == 12
    floats = client.embeddings.create(model="m-ok", input="x", encoding_format="float")
    assert floats.data[0].embedding == [1.0, 0.5, -0.25, 0.125]
    first, second = upstream_requests(stub_url)
    assert first["path"] == "/v1/embeddings"
    assert first["body"]["model"] == "ok" and first["body"]["input"] == ["first", "second"]
    assert second["body"] == {"model": "ok", "input": "x", "encoding_format": "float"}


# --- responses ---------------------------------------------------------------------------------


def test_responses_buffered(client: openai.OpenAI, stub_url: str) -> None:
    upstream_requests(stub_url)
    got = client.responses.create(model="m-ok", input="Say hi", max_output_tokens=16)
    assert got.model == "m-ok" and got.status == "completed"
    assert got.output_text == TEXT
    assert got.usage is not None and (got.usage.input_tokens, got.usage.output_tokens) == (12, 5)
    [seen] = upstream_requests(stub_url)
    assert seen["path"] == "/v1/responses"
    assert seen["body"] == {"model": "ok", "input": "Say hi", "max_output_tokens": 16}


def test_responses_stream(client: openai.OpenAI, stub_url: str) -> None:
    upstream_requests(stub_url)
    with client.responses.create(model="m-ok", input="Say hi", stream=True) as stream:
        events = list(stream)
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    created, completed = events[0], events[-1]
    assert created.response.model == "m-ok" and completed.response.model == "m-ok"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == TEXT
    assert completed.response.output_text == TEXT
    [seen] = upstream_requests(stub_url)
    assert seen["body"] == {"model": "ok", "input": "Say hi", "stream": True}


@pytest.mark.parametrize(
    ("route", "body"),
    [
        (
            "completions",
            {"prompt": "Say hi", "stream": True, "stream_options": {"include_usage": True}},
        ),
        ("responses", {"input": "Say hi", "stream": True}),
    ],
)
def test_streams_are_relayed_byte_exact_but_model(
    base: str, stub_url: str, route: str, body: dict[str, Any]
) -> None:
    """Every event as the upstream wrote it, ``event:`` lines and all; only model differs."""
    status, headers, relayed = post(f"{base}/v1/{route}", {"model": "m-ok", **body})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    direct = post(f"{stub_url}/{route}", {"model": "ok", **body})[2]
    assert relayed == direct.replace(b'"model":"ok"', b'"model":"m-ok"')
    assert relayed.count(b'"model":"m-ok"') == (7 if route == "completions" else 3)
    upstream_requests(stub_url)


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("route", "stream"), ROUTE_CALLS, ids=ROUTE_IDS)
def test_upstream_500_with_traceback_is_scrubbed(
    client: openai.OpenAI, route: str, stream: bool
) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        call(client, route, "m-status:500:traceback", stream=stream)
    assert info.value.status_code == 500
    assert info.value.body == {
        "message": "Internal server error",
        "type": "server_error",
        "param": None,
        "code": 500,
    }
    text = info.value.response.text
    for leak in LEAKS:
        assert leak not in text


@pytest.mark.parametrize(("route", "stream"), ROUTE_CALLS, ids=ROUTE_IDS)
def test_upstream_4xx_keeps_its_scrubbed_message(
    client: openai.OpenAI, route: str, stream: bool
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        call(client, route, "m-status:400", stream=stream)
    assert info.value.body == {
        "message": "stub says 400",
        "type": "invalid_request_error",
        "param": None,
        "code": 400,
    }
    with pytest.raises(openai.RateLimitError) as limited:
        call(client, route, "m-status:429", stream=stream)
    assert limited.value.response.headers.get("retry-after")


@pytest.mark.parametrize("route", ["completions", "embeddings", "responses"])
def test_unknown_model_is_404_without_an_upstream_call(
    client: openai.OpenAI, stub_url: str, route: str
) -> None:
    upstream_requests(stub_url)
    with pytest.raises(openai.NotFoundError) as info:
        call(client, route, "nope")
    assert info.value.body == {
        "message": "The model `nope` does not exist",
        "type": "not_found_error",
        "param": None,
        "code": 404,
    }
    assert info.value.response.headers["request-id"].startswith("req_")
    assert upstream_requests(stub_url) == []


@pytest.mark.parametrize("route", ["completions", "embeddings", "responses"])
@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": "hi"}, "model: required, a string"),
        ({"model": 7, "input": "hi"}, "model: required, a string"),
        ([{"model": "m-ok"}], "request body must be a JSON object"),
        (b"{not json", "request body is not valid JSON"),
    ],
)
def test_a_body_without_a_string_model_is_400(
    base: str, stub_url: str, route: str, body: Any, message: str
) -> None:
    upstream_requests(stub_url)
    status, _, raw = post(f"{base}/v1/{route}", body)
    assert status == 400
    assert json.loads(raw) == {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": 400}
    }
    assert upstream_requests(stub_url) == []


def test_a_cut_stream_ends_with_the_dialects_error_event(client: openai.OpenAI, base: str) -> None:
    """After the first byte a failure is in-band: chunks end with a ``data:`` error body,
    a Responses stream with an ``error`` event; the SDK raises on both."""
    for route in ("completions", "responses"):
        with pytest.raises(openai.APIError, match="Upstream connection lost"):
            call(client, route, "m-cut-mid", stream=True)
    _, _, raw = post(f"{base}/v1/responses", {"model": "m-cut-mid", "input": "x", "stream": True})
    last = raw.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b"event: error\ndata: ")
    event = json.loads(last.split(b"data: ", 1)[1])
    assert event["type"] == "error" and event["message"] == "Upstream connection lost"
    _, _, raw = post(
        f"{base}/v1/completions", {"model": "m-cut-mid", "prompt": "x", "stream": True}
    )
    assert (
        json.loads(raw.rstrip(b"\n").rsplit(b"\n\n", 1)[-1].removeprefix(b"data: "))["error"][
            "message"
        ]
        == "Upstream connection lost"
    )


@pytest.mark.llamacpp
def test_llamacpp_responses_and_completions(
    llama_server: str, tmp_path_factory: pytest.TempPathFactory, tiny_model: Any
) -> None:
    """A real llama.cpp: its own Responses events (``response.created`` without a model,
    reasoning deltas) and completions chunks, under an alias unlike the upstream's name."""
    proc, url = start_gateway(
        llama_config(llama_server, name="tiny"), tmp_path_factory.mktemp("openai-llama")
    )
    answer = tiny_model[1]["answer"]
    client = openai.OpenAI(base_url=url + "/llm/v1", api_key="unused", max_retries=0, timeout=60)
    try:
        with client.responses.create(model="tiny", input="Hi", stream=True) as stream:
            events = list(stream)
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        assert events[-1].response.model == "tiny"
        assert events[-1].response.output_text == answer
        got = client.responses.create(model="tiny", input="Hi")
        assert got.model == "tiny" and got.output_text == answer
        chunks = list(
            client.completions.create(model="tiny", prompt="Hi", max_tokens=8, stream=True)
        )
        assert {c.model for c in chunks} == {"tiny"}
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    finally:
        client.close()
        proc.stop()


# --- Anthropic endpoints the gateway does not implement ----------------------------------------


def test_files_api_is_a_404_naming_the_endpoint(base: str) -> None:
    client = sdk.client(base, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as info:
        client.beta.files.list()
    err = info.value
    request_id = err.response.headers["request-id"]
    assert err.body == {
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": "GET /v1/files is not supported by this gateway",
        },
        "request_id": request_id,
    }


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/files"),
        ("DELETE", "/v1/files/file_011"),
        ("GET", "/v1/files/file_011/content"),
        ("POST", "/v1/complete"),
    ],
)
def test_unimplemented_anthropic_endpoints_say_so(base: str, method: str, path: str) -> None:
    _says_not_supported(base, method, path)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/messages/batches"),
        ("GET", "/v1/messages/batches/msgbatch_1/results"),
    ],
)
def test_batches_switched_off_say_so(
    stub_url: str, gateway_factory: Any, method: str, path: str
) -> None:
    _, url = gateway_factory(
        stub_config(stub_url, models=MODELS) + "\n[batches]\nenabled = false\n"
    )
    _says_not_supported(url + "/llm", method, path)


def _says_not_supported(base: str, method: str, path: str) -> None:
    req = urllib.request.Request(
        base + path,
        data=b"{}" if method == "POST" else None,
        method=method,
        headers={"x-request-id": "unsupported-1"},
    )
    try:
        urllib.request.urlopen(req, timeout=5).close()
        raise AssertionError("expected a 404")
    except urllib.error.HTTPError as exc:
        with exc:
            status, headers, body = exc.code, exc.headers, json.loads(exc.read())
    assert status == 404 and headers["request-id"] == "unsupported-1"
    assert body == {
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": f"{method} {path} is not supported by this gateway",
        },
        "request_id": "unsupported-1",
    }


def test_other_unknown_paths_are_a_plain_404_envelope(base: str) -> None:
    for path in ("/v1/nope", "/v1/completionsx", "/v1/files_and_more"):
        status, headers, raw = post(base + path, {})
        assert status == 404 and headers["request-id"].startswith("req_")
        body = json.loads(raw)
        assert body["error"] == {"type": "not_found_error", "message": "Not found"}, path
