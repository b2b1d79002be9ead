"""count_tokens' JSON (gateway/messages/tokens.py, gateway/text/tokenizer_json.py): the prompt
encoded once, and large JSON work done in the decoder child, not on the event loop.

Against a local llama.cpp-shaped and vLLM-shaped tokenizer server (aiohttp on 127.0.0.1)
answering as the engines do: ``/apply-template`` -> ``{"prompt":"..."}`` (compact),
``/tokenize`` -> ``{"tokens":[...]}`` (llama.cpp) or ``{"count":N,...}`` (vLLM). Counts of
encodes and decodes, not timings: ujson holds the GIL for a whole call, so every large one
done in the gateway's process is a stall of its loop.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gateway.http.decoder import Decoder
from gateway.messages import tokens
from gateway.ops.config import ModelRoute, UpstreamConfig
from gateway.ops.metrics import Metrics
from gateway.text import jsonutil, tokenizer_json
from gateway.text.redact import NO_SECRETS
from gateway.upstream.client import UpstreamClient
from gateway.upstream.send import Upstreams

MARK = 'a prompt of code, "quoted",\n\ttabbed, non-ASCII é and 😀 '
TAIL = {"add_special": True, "parse_special": True}


def _template(messages: list[dict[str, Any]]) -> str:
    return "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages) + "<|assistant|>"


def _engine(seen: list[str]) -> web.Application:
    """llama.cpp's two routes and vLLM's /tokenize (one token per 4 characters)."""

    async def apply_template(request: web.Request) -> web.Response:
        seen.append("apply-template")
        body = await request.json()
        prompt = _template(body["messages"])
        return web.Response(
            body=json.dumps({"prompt": prompt}, separators=(",", ":")),
            content_type="application/json",
        )

    async def tokenize(request: web.Request) -> web.Response:
        seen.append("tokenize")
        body = await request.json()
        if "content" in body:  # llama.cpp
            assert {k: body[k] for k in TAIL} == TAIL
            tokens = list(range(len(body["content"]) // 4))  # compact, as llama.cpp answers
            return web.Response(
                body=json.dumps({"tokens": tokens}, separators=(",", ":")),
                content_type="application/json",
            )
        n = len(_template(body["messages"])) // 4
        return web.json_response({"count": n, "max_model_len": 4096, "tokens": list(range(n))})

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/apply-template", apply_template)
    app.router.add_post("/tokenize", tokenize)
    return app


@pytest.fixture
async def engine(aiohttp_server: Any) -> AsyncIterator[tuple[str, list[str]]]:
    seen: list[str] = []
    server = await aiohttp_server(_engine(seen))
    yield f"http://127.0.0.1:{server.port}/v1", seen


@pytest.fixture
async def decoder() -> AsyncIterator[Decoder]:
    d = Decoder()
    yield d
    d.close()


async def _count(
    url: str, kind: str, chat: dict[str, Any], off: tokens.OffLoop
) -> tuple[int, bool]:
    upstream = UpstreamConfig(name="u", base_url=url, kind=kind)
    route = ModelRoute(name="m", upstream=upstream, upstream_model="org/model")
    client = UpstreamClient(upstream)
    await client.start()
    try:
        ups = Upstreams(
            clients={"u": client}, metrics=Metrics(CollectorRegistry()), secrets=NO_SECRETS
        )
        return await tokens.count(ups, route, chat, "req_1", off=off)
    finally:
        await client.close()


class _Counted:
    """How many encodes and decodes of the prompt this process did (the child's are its own)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, size: int) -> None:
        self.encodes = self.decodes = 0
        dumpb, dumps, loads = jsonutil.dumpb, jsonutil.dumps, jsonutil.loads_upstream

        def counted_dumpb(obj: Any) -> bytes:
            out = dumpb(obj)
            self.encodes += len(out) >= size
            return out

        def counted_dumps(obj: Any) -> str:
            out = dumps(obj)
            self.encodes += len(out) >= size
            return out

        def counted_loads(data: bytes | str) -> Any:
            self.decodes += len(data) >= size
            return loads(data)

        monkeypatch.setattr(jsonutil, "dumpb", counted_dumpb)
        monkeypatch.setattr(jsonutil, "dumps", counted_dumps)
        monkeypatch.setattr(jsonutil, "loads_upstream", counted_loads)


def _chat(size: int) -> dict[str, Any]:
    text = (MARK * (size // len(MARK) + 1))[:size]
    return {
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
    }


# (kind, what the engine counts, exact?, the prompt's encodes, large decodes) on the loop
ON_LOOP_CASES = [
    ("llamacpp", True, 1, 1),  # the request; the template reply checked, the tokens counted
    ("vllm", True, 1, 1),
    ("openai", False, 1, 0),  # the estimate: the request's size as JSON
]


@pytest.mark.parametrize(("kind", "exact", "encodes", "decodes"), ON_LOOP_CASES)
async def test_the_prompt_is_encoded_once(
    engine: tuple[str, list[str]],
    kind: str,
    exact: bool,
    encodes: int,
    decodes: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, seen = engine
    size = 200_000
    chat = _chat(size)
    expected = (
        len(_template(chat["messages"])) // 4
        if exact
        else len(jsonutil.dumpb(chat["messages"])) // 4
    )
    counted = _Counted(monkeypatch, size // 2)
    assert await _count(url, kind, chat, tokens.ON_LOOP) == (expected, exact)
    assert (counted.encodes, counted.decodes) == (encodes, decodes)
    assert (
        seen
        == {"llamacpp": ["apply-template", "tokenize"], "vllm": ["tokenize"], "openai": []}[kind]
    )


@pytest.mark.parametrize("kind", ["llamacpp", "vllm", "openai"])
async def test_large_json_work_runs_in_the_decoder_child(
    engine: tuple[str, list[str]], decoder: Decoder, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``past`` bytes, neither the request's encode nor a reply's decode happens in the
    gateway's process; the count is the same; a small request stays on the loop."""
    url, _ = engine
    size = 200_000
    chat = _chat(size)
    on_loop = await _count(url, kind, chat, tokens.ON_LOOP)
    counted = _Counted(monkeypatch, 1000)
    off = tokens.OffLoop(decoder.run, 64 * 1024)
    assert await _count(url, kind, chat, off) == on_loop
    assert (counted.encodes, counted.decodes) == (0, 0)
    small = _chat(2000)
    counted.encodes = 0
    await _count(url, kind, small, off)
    assert counted.encodes == 1


# (label, /apply-template reply, spliced as it came?); the tokenize body always decodes
# to {"content": the prompt, ...TAIL}, or the reply is refused (None)
PROMPT = 'line "one"\n\tline two é 😀 \\ </s>'
REPLIES: list[tuple[str, bytes, str | None, bool]] = [
    (
        "compact, as llama.cpp answers",
        json.dumps({"prompt": PROMPT}, separators=(",", ":")).encode(),
        PROMPT,
        True,
    ),
    (
        "compact, non-ASCII escaped",
        json.dumps({"prompt": PROMPT}, separators=(",", ":"), ensure_ascii=True).encode(),
        PROMPT,
        True,
    ),
    ("spaces around the value", b'{"prompt": "a b" }\n', "a b", True),
    ("spaces after the brace", b'{ "prompt":"a b"}', "a b", False),
    ("another key first", b'{"x":1,"prompt":"a"}', "a", False),
    ("another key after", b'{"prompt":"a","x":1}', "a", False),
    ("two prompts (the last wins)", b'{"prompt":"a","prompt":"b"}', "b", False),
    ("a prompt that looks like the end", b'{"prompt":"a\\"}"}', 'a"}', True),
    ("an empty prompt", b'{"prompt":""}', "", True),
    ("the prompt not a string", b'{"prompt":["a"]}', None, False),
    ("the prompt null", b'{"prompt":null}', None, False),
    ("no prompt", b'{"text":"a"}', None, False),
    ("a trailing comma", b'{"prompt":"a",}', None, False),
    ("cut short", b'{"prompt":"a', None, False),
    ("not JSON", b"<html>", None, False),
    ("an array", b'["prompt"]', None, False),
    ("empty", b"", None, False),
]


@pytest.mark.parametrize(
    ("reply", "prompt", "spliced"), [r[1:] for r in REPLIES], ids=[r[0] for r in REPLIES]
)
def test_the_tokenize_body_from_the_template_reply(
    reply: bytes, prompt: str | None, spliced: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = _Counted(monkeypatch, 0)
    body = tokenizer_json.llamacpp_tokenize_body(reply)
    if prompt is None:
        assert body is None
        return
    assert body is not None
    assert json.loads(body) == {"content": prompt, **TAIL}
    assert counted.encodes == (0 if spliced else 1)


# (label, reply, key, count)
TOKEN_REPLIES: list[tuple[str, bytes, str, int | None]] = [
    ("llama.cpp tokens", b'{"tokens":[1,2,3]}', "tokens", 3),
    ("llama.cpp no tokens", b'{"tokens":[]}', "tokens", 0),
    ("llama.cpp one token", b'{"tokens":[7]}\n', "tokens", 1),
    ("llama.cpp spaced", b'{"tokens": [1, 2, 3]}', "tokens", 3),
    (
        "llama.cpp with pieces",
        b'{"tokens":[{"id":1,"piece":"a,b"},{"id":2,"piece":"c"}]}',
        "tokens",
        2,
    ),
    ("an empty id", b'{"tokens":[1,,2]}', "tokens", None),
    ("a leading comma", b'{"tokens":[,1]}', "tokens", None),
    ("a trailing comma", b'{"tokens":[1,]}', "tokens", None),
    ("a lone comma", b'{"tokens":[,]}', "tokens", None),
    ("another key after", b'{"tokens":[1,2],"x":[3]}', "tokens", 2),
    ("a negative id", b'{"tokens":[-1,2]}', "tokens", 2),
    ("vLLM count", b'{"count":7,"max_model_len":4096,"tokens":[1]}', "count", 7),
    ("count a bool", b'{"count":true}', "count", None),
    ("count a string", b'{"count":"7"}', "count", None),
    ("tokens missing", b'{"count":7}', "tokens", None),
    ("not an object", b"[1,2]", "tokens", None),
    ("not JSON", b"oops", "count", None),
]


@pytest.mark.parametrize(
    ("reply", "key", "n"), [r[1:] for r in TOKEN_REPLIES], ids=[r[0] for r in TOKEN_REPLIES]
)
def test_the_count_in_a_tokenize_reply(reply: bytes, key: str, n: int | None) -> None:
    assert tokenizer_json.token_count(reply, key) == n


# (label, value, limit, weighs more?)
SIZES: list[tuple[str, Any, int, bool]] = [
    ("a long string", ["x" * 2000], 1000, True),
    ("a short string", ["x" * 100], 1000, False),
    ("many small values", [{"a": 1}] * 100, 1000, True),
    ("strings deep down", [{"c": [{"t": "x" * 600}]}, {"c": [{"t": "y" * 600}]}], 1000, True),
    ("empty", {}, 0, True),
    ("nothing to weigh", (), 100, False),
]


@pytest.mark.parametrize(
    ("value", "limit", "more"), [s[1:] for s in SIZES], ids=[s[0] for s in SIZES]
)
def test_what_weighs_more_than_the_offload_size(value: Any, limit: int, more: bool) -> None:
    assert tokenizer_json.size_at_least(value, limit) is more
