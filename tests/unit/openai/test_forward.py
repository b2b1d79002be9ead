"""gateway/openai/forward.py and the pass-through's use of it: the client's bytes go upstream
with the top-level ``model``'s value spliced in, where the scan is certain of it; every other
body is encoded again from its decode, as before; either way the upstream reads the client's
request with ``model`` replaced. A one-replica route neither encodes the body again nor makes
a session key; a route of several replicas balanced by affinity still gets one.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gateway.app import build_app
from gateway.http import passthrough
from gateway.openai import forward
from gateway.ops import config
from gateway.text import jsonutil

UP = "up/model-7"

# (case, client bytes, the upstream model, the bytes spliced; None: encoded again instead)
SPLICE: list[tuple[str, bytes, str, bytes | None]] = [
    (
        "first key",
        b'{"model":"m","messages":[{"role":"user","content":"hi"}]}',
        UP,
        b'{"model":"up/model-7","messages":[{"role":"user","content":"hi"}]}',
    ),
    (
        "spaced and last",
        b'{ "input" : [1, 2.50] ,\n  "model" :\t"m" }',
        UP,
        b'{ "input" : [1, 2.50] ,\n  "model" :\t"up/model-7" }',
    ),
    (
        "non-ASCII alias",
        '{"model":"modèle","stream":true}'.encode(),
        UP,
        b'{"model":"up/model-7","stream":true}',
    ),
    (
        "escaped non-ASCII text",
        b'{"model":"m","prompt":"caf\\u00e9 \\ud83d\\ude00"}',
        UP,
        b'{"model":"up/model-7","prompt":"caf\\u00e9 \\ud83d\\ude00"}',
    ),
    ("upstream model needing escapes", b'{"model":"m"}', 'q"\\x', b'{"model":"q\\"\\\\x"}'),
    ("a model key nested", b'{"metadata":{"model":"x"},"model":"m"}', UP, None),
    ("duplicate model key", b'{"model":"m","n":1,"model":"m"}', UP, None),
    ("duplicate model key, the last wins", b'{"model":"x","model":"m"}', UP, None),
    ("model key escaped", b'{"mod\\u0065l":"m"}', UP, None),
    ("model key escaped, duplicated", b'{"model":"m","mod\\u0065l":"m"}', UP, None),
    ("model's bytes in a string", b'{"p":"say \\"model","model":"m"}', UP, None),
    ("model's bytes as a value", b'{"p":"model","model":"m"}', UP, None),
    ("escaped alias", b'{"model":"a\\/m"}', UP, None),
    ("escaped quote in the alias", b'{"model":"a\\"m","n":"x"}', UP, None),
    ("escaped alias, spaced", b'{"model" : "a\\/m"}', UP, None),
    ("duplicate stream key", b'{"model":"m","stream":false,"stream":true}', UP, None),
    ("stream key escaped", b'{"model":"m","str\\u0065am":true}', UP, None),
    # no top-level stream: the gateway reads none, nested ones are the upstream's
    (
        "stream keys nested",
        b'{"model":"m","a":{"stream":1},"b":{"stream":2}}',
        UP,
        b'{"model":"up/model-7","a":{"stream":1},"b":{"stream":2}}',
    ),
]


@pytest.mark.parametrize(
    ("raw", "upstream", "spliced"), [c[1:] for c in SPLICE], ids=[c[0] for c in SPLICE]
)
def test_the_model_is_spliced_only_where_the_scan_is_certain(
    raw: bytes, upstream: str, spliced: bytes | None
) -> None:
    body = jsonutil.loads(raw)
    span = forward.model_span(raw, body["model"], stream="stream" in body)
    sent = None if span is None else forward.splice(raw, span, upstream)
    assert sent == spliced
    if sent is not None:  # the request the upstream read when the body was encoded again
        assert json.loads(sent) == json.loads(jsonutil.dumpb({**body, "model": upstream}))


# -- the handler, in process, against an in-process upstream ---------------------------------


async def _upstream(aiohttp_server: Any, seen: list[bytes]) -> str:
    async def chat(request: web.Request) -> web.Response:
        seen.append(await request.read())
        return web.json_response(
            {
                "id": "c",
                "object": "chat.completion",
                "model": UP,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "hello"},
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    app = web.Application(client_max_size=8 << 20)
    app.router.add_post("/v1/chat/completions", chat)
    server = await aiohttp_server(app)
    return f"http://127.0.0.1:{server.port}/v1"


def _gateway(urls: list[str]) -> web.Application:
    upstream: dict[str, Any] = {"base_url": urls[0]} if len(urls) == 1 else {"base_urls": urls}
    cfg = config.parse(
        {
            "upstreams": {"u": upstream},
            "models": [{"name": "m", "upstream": "u", "upstream_model": UP}],
        },
        "test.toml",
        {},
    )
    return build_app(cfg, CollectorRegistry())


CHAT = b'{"model":"m","user":"u1","messages":[{"role":"user","content":"hi"}]}'
TWICE = b'{"model":"x","user":"u1","model":"m","messages":[]}'
# past server.decode_offload_bytes (1 MiB): decoded in the child process, spliced the same
LARGE = b'{"messages":[{"role":"user","content":"%s"}],"model":"m"}' % (b"w " * (1 << 20))
# (body, replicas, what the upstream gets, bodies encoded again, session keys made)
HANDLED: list[tuple[bytes, int, bytes, int, int]] = [
    (CHAT, 1, CHAT.replace(b'"m"', b'"%s"' % UP.encode()), 0, 0),
    (CHAT, 2, CHAT.replace(b'"m"', b'"%s"' % UP.encode()), 0, 1),  # affinity keys a replica
    # a duplicate model key: encoded again from the decode (the last wins), as before
    (TWICE, 1, b'{"model":"%s","user":"u1","messages":[]}' % UP.encode(), 1, 0),
    (LARGE, 1, LARGE.replace(b'"model":"m"', b'"model":"%s"' % UP.encode()), 0, 0),
]


@pytest.mark.parametrize(
    ("raw", "replicas", "upstream", "encodes", "sessions"),
    HANDLED,
    ids=["one replica", "two replicas", "duplicate model", "2 MiB"],
)
async def test_a_one_replica_route_neither_encodes_again_nor_keys_a_session(
    aiohttp_client: Any,
    aiohttp_server: Any,
    monkeypatch: pytest.MonkeyPatch,
    raw: bytes,
    replicas: int,
    upstream: bytes,
    encodes: int,
    sessions: int,
) -> None:
    seen: list[bytes] = []
    urls = [await _upstream(aiohttp_server, seen) for _ in range(replicas)]
    client = await aiohttp_client(_gateway(urls))
    encoded: list[Any] = []
    keyed: list[Any] = []
    dumpb, session_key = jsonutil.dumpb, passthrough.session_key

    def counted_dumpb(obj: Any) -> bytes:
        encoded.append(obj)
        return dumpb(obj)

    def counted_key(*args: Any) -> str | None:
        keyed.append(args)
        return session_key(*args)

    monkeypatch.setattr(jsonutil, "dumpb", counted_dumpb)
    monkeypatch.setattr(passthrough, "session_key", counted_key)
    resp = await client.post("/llm/v1/chat/completions", data=io.BytesIO(raw))
    assert resp.status == 200, await resp.text()
    assert seen == [upstream]
    assert len(keyed) == sessions
    assert len([o for o in encoded if isinstance(o, dict) and "messages" in o]) == encodes
