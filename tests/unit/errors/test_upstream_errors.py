"""Every kind of upstream failure, through the real app in process: the client gets the
right envelope and status, with no secret the process knows, no URL and no path; the one
map (``errors.from_upstream``) runs once per failure, reads at most ``MAX_UPSTREAM_BODY``
bytes, and the error it makes keeps no body.

The upstream is an in-process aiohttp server that answers each request with the scenario its
``model`` names. Its words quote everything that must not reach a client: its own key, the
other upstream's key and host, a client's key, the signing key, its URL, a file path.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gateway import errors
from gateway.app import build_app
from gateway.errors import upstream_map
from gateway.ops import config
from gateway.upstream.known import known_secrets

KEY = "sk-up/stream+Key=9f3a"  # '/', '+' and '=' make the encoded forms differ
OTHER_KEY = "other-upstream-7d1c5e"
OTHER_HOST = "gpu-node-7.internal"
CLIENT_KEY = "sk-client-4b8e2a91"
SIGNING = "signing-key-0c6d3f7e5a"
PATH = "/opt/vllm/entrypoints/serving.py"
# the longest text an error may hold of an upstream's words (errors.MAX_RENDERED)
HELD = errors.MAX_RENDERED


def _leaks(url: str) -> str:
    """Upstream words quoting every secret, the upstream's URL and a path."""
    return (
        f"Invalid key {KEY} (Bearer {KEY}) for {url}/chat/completions in {PATH}; "
        f"also {OTHER_KEY} at {OTHER_HOST}, client {CLIENT_KEY}, signing {SIGNING}"
    )


def _secrets(url: str) -> tuple[str, ...]:
    host = url.split("://", 1)[1].split("/", 1)[0]
    return (KEY, OTHER_KEY, OTHER_HOST, CLIENT_KEY, SIGNING, url, host, PATH, "/opt/vllm")


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _answer(scenario: str, stream: bool, url: str) -> web.StreamResponse:
    leak = _leaks(url)
    if scenario == "openai-4xx":
        return web.json_response(
            {"error": {"message": leak, "type": "BadRequestError", "param": None, "code": 400}},
            status=400,
        )
    if scenario == "html-5xx":
        page = f"<html><body><h1>502 Bad Gateway</h1>{leak}</body></html>"
        return web.Response(status=502, text=page, content_type="text/html")
    if scenario == "rate-429":
        return web.json_response(
            {"error": {"message": f"slow down: {leak}", "code": 429}},
            status=429,
            headers={"Retry-After": "7"},
        )
    if scenario == "huge":  # 1 MiB of JSON, the secrets at its start and past 64 KiB
        message = leak + " " + "x" * (1 << 20) + " " + leak
        return web.json_response({"error": {"message": message, "code": 400}}, status=400)
    if scenario == "inband":  # a 200 whose body, or first event, is an error
        error = {"error": {"message": leak, "type": "BadRequestError", "code": 400}}
        if not stream:
            return web.json_response(error)
        return web.Response(
            body=_sse(error) + b"data: [DONE]\n\n", content_type="text/event-stream"
        )
    raise AssertionError(scenario)


async def _upstream(aiohttp_server: Any) -> str:
    url = ""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        return await _answer(body["model"], bool(body.get("stream")), url)

    async def tokenize(request: web.Request) -> web.StreamResponse:
        return await _answer((await request.json())["model"], False, url)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/tokenize", tokenize)
    server = await aiohttp_server(app)
    url = f"http://127.0.0.1:{server.port}/v1"
    return url


SCENARIOS = ("openai-4xx", "html-5xx", "rate-429", "huge", "inband")


def _config(url: str) -> config.Config:
    return config.parse(
        {
            "server": {"api_keys_env": "KEYS", "signing_key_env": "SIGN"},
            "upstreams": {
                "u": {"base_url": url, "kind": "vllm", "api_key_env": "UP_KEY"},
                "other": {"base_url": f"http://{OTHER_HOST}:8000/v1", "api_key_env": "OTHER_KEY"},
            },
            "models": [{"name": s, "upstream": "u", "upstream_model": s} for s in SCENARIOS],
        },
        "test.toml",
        {
            "KEYS": f"{CLIENT_KEY},sk-second-client-key",
            "SIGN": SIGNING,
            "UP_KEY": KEY,
            "OTHER_KEY": OTHER_KEY,
        },
    )


HI = [{"role": "user", "content": "hi"}]
MESSAGES = {"max_tokens": 16, "messages": HI}

# (case, path, scenario, stream, the status the client reads, its error.type, retry-after)
CASES: list[tuple[str, str, str, bool, int, str, str | None]] = [
    (
        "4xx with an OpenAI body",
        "/llm/v1/messages",
        "openai-4xx",
        False,
        400,
        "invalid_request_error",
        None,
    ),
    (
        "4xx, streamed head",
        "/llm/v1/messages",
        "openai-4xx",
        True,
        400,
        "invalid_request_error",
        None,
    ),
    ("5xx with HTML", "/llm/v1/messages", "html-5xx", False, 500, "api_error", None),
    # the engine's Retry-After: 7 is passed on
    ("429 with retry-after", "/llm/v1/messages", "rate-429", False, 429, "rate_limit_error", "7"),
    ("a 1 MiB body", "/llm/v1/messages", "huge", False, 400, "invalid_request_error", None),
    ("in-band, buffered", "/llm/v1/messages", "inband", False, 400, "invalid_request_error", None),
    ("in-band, streamed", "/llm/v1/messages", "inband", True, 200, "invalid_request_error", None),
    (
        "count_tokens",
        "/llm/v1/messages/count_tokens",
        "openai-4xx",
        False,
        400,
        "invalid_request_error",
        None,
    ),
    (
        "pass-through 4xx",
        "/llm/v1/chat/completions",
        "openai-4xx",
        False,
        400,
        "invalid_request_error",
        None,
    ),
    (
        "pass-through 429",
        "/llm/v1/chat/completions",
        "rate-429",
        False,
        429,
        "rate_limit_exceeded",
        "7",
    ),
    (
        "pass-through in-band, streamed",
        "/llm/v1/chat/completions",
        "inband",
        True,
        200,
        "invalid_request_error",
        None,
    ),
]


def _error_of(path: str, stream: bool, status: int, body: bytes) -> dict[str, Any]:
    """The error object the client read: the envelope, or the stream's error event."""
    if status != 200:
        return json.loads(body)["error"]
    assert stream
    events = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
    found = [json.loads(e) for e in events if e != "[DONE]" and "error" in json.loads(e)]
    assert len(found) == 1, body
    return found[0]["error"]


Mapped = list[tuple[int, int, errors.UpstreamError]]


async def _failure(
    aiohttp_client: Any,
    aiohttp_server: Any,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    scenario: str,
    stream: bool,
) -> tuple[str, int, bytes, Any, Mapped]:
    """(the upstream's URL, the client's status, body and headers, each run of the map:
    the upstream status, the bytes it was given, the error it made)."""
    url = await _upstream(aiohttp_server)
    client = await aiohttp_client(build_app(_config(url), CollectorRegistry()))
    mapped: Mapped = []
    from_upstream = errors.from_upstream

    def counted(status: int, body: Any, **kw: Any) -> errors.UpstreamError:
        err = from_upstream(status, body, **kw)
        mapped.append((status, len(body) if isinstance(body, bytes) else 0, err))
        return err

    monkeypatch.setattr(upstream_map, "from_upstream", counted)
    body: dict[str, Any] = {"model": scenario, **MESSAGES}
    if stream:
        body["stream"] = True
    async with client.post(path, json=body, headers={"x-api-key": CLIENT_KEY}) as resp:
        return url, resp.status, await resp.read(), resp.headers, mapped


TABLE = pytest.mark.parametrize(
    ("path", "scenario", "stream", "status", "etype", "retry_after"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)


@TABLE
async def test_an_upstream_failure_reaches_the_client_scrubbed_of_every_secret(
    aiohttp_client: Any,
    aiohttp_server: Any,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    scenario: str,
    stream: bool,
    status: int,
    etype: str,
    retry_after: str | None,
) -> None:
    url, got, raw, headers, _ = await _failure(
        aiohttp_client, aiohttp_server, monkeypatch, path, scenario, stream
    )
    assert got == status, raw
    error = _error_of(path, stream, got, raw)
    assert error["type"] == etype
    assert headers.get("retry-after") == retry_after
    text = raw.decode()
    for secret in _secrets(url):
        assert secret.lower() not in text.lower(), (secret, text[:300])
    if status >= 500:
        assert error["message"] == "Internal server error"
    else:
        assert "[redacted]" in error["message"]


@TABLE
async def test_an_upstream_failure_is_mapped_once_and_its_error_holds_no_body(
    aiohttp_client: Any,
    aiohttp_server: Any,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    scenario: str,
    stream: bool,
    status: int,
    etype: str,
    retry_after: str | None,
) -> None:
    *_, mapped = await _failure(aiohttp_client, aiohttp_server, monkeypatch, path, scenario, stream)
    assert len(mapped) == 1, [m[0] for m in mapped]
    _, read, err = mapped[0]
    assert read <= errors.MAX_UPSTREAM_BODY
    held = [*vars(err).values(), *err.args]
    assert not [v for v in held if isinstance(v, bytes | bytearray | tuple | list | dict)]
    assert all(len(v) <= HELD for v in held if isinstance(v, str))


def test_the_process_redactor_knows_every_secret_of_the_config() -> None:
    url = "http://10.1.2.3:8000/v1"
    redactor = known_secrets(_config(url))
    leak = _leaks(url)
    err = errors.from_upstream(
        400, json.dumps({"error": {"message": leak}}).encode(), secrets=redactor
    )
    for secret in _secrets(url):
        assert secret not in err.message
    assert err.message.count("[redacted]") >= 6
    # relayed bytes lose the upstream keys alone (a model's answer may name a host)
    relayed = redactor.redact_bytes(f"{KEY} {OTHER_KEY} {OTHER_HOST} {CLIENT_KEY}".encode())
    assert relayed == f"[redacted] [redacted] {OTHER_HOST} {CLIENT_KEY}".encode()


def test_named_clients_and_admin_keys_are_scrubbed_and_a_reload_adopts_new_ones() -> None:
    url = "http://10.1.2.3:8000/v1"
    named, admin, later = "sk-alice-77c1e0", "sk-admin-5e9a02", "sk-carol-3b61d4"

    def parsed(clients: list[dict[str, str]]) -> config.Config:
        return config.parse(
            {
                "server": {"admin_keys_env": "ADMIN"},
                "upstreams": {"u": {"base_url": url}},
                "models": [{"name": "m", "upstream": "u", "upstream_model": "m"}],
                "clients": clients,
            },
            "test.toml",
            {"ALICE": named, "ADMIN": admin, "CAROL": later},
        )

    redactor = known_secrets(parsed([{"name": "alice", "key_env": "ALICE"}]))
    quoted = f"keys {named} {admin} {later}"
    assert redactor(quoted) == f"keys [redacted] [redacted] {later}"
    # the reloaded config's keys, in the same object every holder already has
    redactor.adopt(known_secrets(parsed([{"name": "carol", "key_env": "CAROL"}])))
    assert redactor(quoted) == f"keys {named} [redacted] [redacted]"


def test_the_oidc_secret_and_the_collectors_key_are_scrubbed() -> None:
    url = "http://10.1.2.3:8000/v1"
    oidc, collector = "oidc-secret-8d2f41c9", "otlp-key-5a7e0b13"
    cfg = config.parse(
        {
            "upstreams": {"u": {"base_url": url}},
            "models": [{"name": "m", "upstream": "u", "upstream_model": "m"}],
            "auth": {
                "oidc_issuer": "https://idp.example.com",
                "oidc_client_id": "gw",
                "oidc_client_secret_env": "OIDC",
            },
        },
        "test.toml",
        {"OIDC": oidc},
    )
    assert known_secrets(cfg)(f"secret {oidc}") == "secret [redacted]"
    if importlib.util.find_spec("opentelemetry.sdk") is None:
        pytest.skip("the otel extra (pip install '.[otel]')")
    cfg = config.parse(
        {
            "upstreams": {"u": {"base_url": url}},
            "models": [{"name": "m", "upstream": "u", "upstream_model": "m"}],
            "telemetry": {"otlp_endpoint": "http://127.0.0.1:4318", "headers_env": "OTLP"},
        },
        "test.toml",
        {"OTLP": f"authorization=Bearer {collector},x-tenant=t1"},
    )
    assert known_secrets(cfg)(f"header {collector}") == "header [redacted]"
