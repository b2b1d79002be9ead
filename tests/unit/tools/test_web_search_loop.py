"""The web search loop in process (gateway/tools/rounds/loop.py): the gateway app against an
in-test scripted model (an OpenAI-compatible stream) and an in-test SearXNG, buffered and
streamed; the streamed reply's events compared exactly (ids normalised)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gateway.app import build_app
from gateway.messages import search_blocks as ws
from gateway.messages.from_chat.aggregate import aggregate
from gateway.ops import config
from gateway.text import jsonutil
from tests.anthropic_stream_check import check_stream

SEARCH_TOOL = {"type": "web_search_20250305", "name": "web_search"}
_URL = re.compile(r"https?://\S+")


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": "up",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


_USAGE = (
    b'data: {"id":"c","object":"chat.completion.chunk","model":"up","choices":[],'
    b'"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}\n\n'
)


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message["role"] == "user":
            content = message["content"]
            return content if isinstance(content, str) else content[-1]["text"]
    return ""


class Model:
    """A searching model: calls web_search with the last user text until a tool message
    answers it (or always, for a user text holding "always"), then names the first URL."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        messages = body["messages"]
        query = _last_user_text(messages)
        if "#die" in query and messages[-1]["role"] == "tool":
            return web.json_response({"error": {"message": "engine died"}}, status=500)
        if "#down" in query and messages[-1]["role"] == "tool" and body["model"] == "up":
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        if not body.get("stream"):  # a turn without the tool: a plain answer
            return web.json_response(
                {
                    "id": "c",
                    "object": "chat.completion",
                    "model": "up",
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "You are welcome."},
                        }
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
                }
            )
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        if messages[-1]["role"] == "tool" and "always" not in query:
            urls = _URL.findall(messages[-1]["content"])
            text = f"See {urls[0]}" if urls else "Nothing found."
            snippets = re.findall(r"^Snippet: (.*)$", messages[-1]["content"], re.M)
            if "#quote" in query:  # a verbatim quote of the first snippet, a near miss of
                # the second (its last character changed), in 7-character pieces
                near = snippets[1][:-1] + "?"
                text = f"They write: {snippets[0]} Others: {near} Done."
            await resp.write(_chunk({"role": "assistant", "content": ""}))
            # the text in 7-character pieces (#quote), one character at a time (#many)
            step = 7 if "#quote" in query else 1 if "#many" in query else len(text)
            for at in range(0, len(text), step):
                await resp.write(_chunk({"content": text[at : at + step]}))
            await resp.write(_chunk({}, "stop"))
        else:
            args = json.dumps({"query": query})
            await resp.write(
                _chunk(
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": f"call_{len(self.requests)}",
                                "type": "function",
                                "function": {"name": "web_search", "arguments": ""},
                            }
                        ],
                    }
                )
            )
            for piece in (args[:5], args[5:]):
                await resp.write(
                    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                )
            if "#client" in query:  # a client tool called in the same turn
                await resp.write(
                    _chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": 1,
                                    "id": "call_clock",
                                    "type": "function",
                                    "function": {"name": "clock", "arguments": "{}"},
                                }
                            ]
                        }
                    )
                )
            await resp.write(_chunk({}, "length" if "#cut" in query else "tool_calls"))
        await resp.write(_USAGE)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


class Searx:
    """SearXNG's JSON API, two results per query; ``#fail`` 500, ``#busy`` 429, ``#slow``
    past the gateway's timeout, ``#big`` past its response cap, ``#wait`` until the test
    releases it."""

    def __init__(self) -> None:
        self.queries: list[dict[str, str]] = []
        self.release = asyncio.Event()  # ``#wait`` answers once it is set

    async def handle(self, request: web.Request) -> web.Response:
        params = dict(request.query)
        self.queries.append(params)
        q = params["q"]
        if "#wait" in q:
            await self.release.wait()
        if "#fail" in q:
            return web.json_response({"error": "search error"}, status=500)
        if "#busy" in q:
            return web.Response(status=429)
        if "#slow" in q:
            await asyncio.sleep(30)
        slug = re.sub(r"[^a-z0-9]+", "-", q.lower()).strip("-")
        results = [
            {
                "url": f"https://{host}/{slug}",
                "title": f"{q} on {host}",
                "content": f"About {q}.",
                "engine": "stub",
                "score": 1.0,
                "category": "general",
                "publishedDate": "2026-05-01T10:00:00",
            }
            for host in ("docs.example.org", "news.example.com")
        ]
        if "#quote" in q:
            for n, result in enumerate(results):
                result["content"] = f"A passage worth quoting, number {n}, about {q}."
        if "#big" in q:
            results[0]["content"] = "x" * 100_000
        return web.json_response(
            {
                "query": q,
                "number_of_results": 2,
                "results": results,
                "answers": [],
                "corrections": [],
                "infoboxes": [],
                "suggestions": [],
                "unresponsive_engines": [],
            }
        )


@pytest.fixture
async def world(aiohttp_server: Any, aiohttp_client: Any) -> Any:
    model, searx = Model(), Searx()
    registry = CollectorRegistry()
    up = web.Application()
    up.router.add_post("/v1/chat/completions", model.handle)
    backend = web.Application()
    backend.router.add_get("/search", searx.handle)
    up_server = await aiohttp_server(up)
    searx_server = await aiohttp_server(backend)

    async def gateway(
        web_search: bool = True,
        server: dict[str, Any] | None = None,
        search: dict[str, Any] | None = None,
        fallback: bool = False,
    ) -> Any:
        data: dict[str, Any] = {
            "server": {"prefix": "", **(server or {})},
            "upstreams": {"u": {"base_url": f"http://127.0.0.1:{up_server.port}/v1"}},
            "models": [{"name": "m", "upstream": "u", "upstream_model": "up"}],
        }
        if fallback:  # another model (the same test server, upstream_model "spare")
            data["models"][0]["fallbacks"] = ["spare"]
            data["models"].append({"name": "spare", "upstream": "u", "upstream_model": "spare"})
        if web_search:
            data["web_search"] = {
                "searxng_url": f"http://127.0.0.1:{searx_server.port}",
                "timeout": 0.5,
                "max_response_bytes": 50_000,
                **(search or {}),
            }
        app = build_app(config.parse(data, "t.toml", {}), registry)
        return await aiohttp_client(app)

    gateway.registry = registry  # type: ignore[attr-defined]
    return gateway, model, searx


def _body(text: str, *, stream: bool = False, **tool: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 50,
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
        "tools": [{**SEARCH_TOOL, **tool}],
    }


def _events(raw: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in raw.strip().split("\n\n"):
        name, data = frame.split("\n", 1)
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


async def test_streamed_reply_with_a_search_is_one_message(world: Any) -> None:
    gateway, model, _ = world
    client = await gateway()
    resp = await client.post("/v1/messages", json=_body("paris", stream=True))
    assert resp.status == 200
    events = _events(await resp.text())
    start = events[0][1]["message"]
    assert start["content"] == [] and start["usage"]["output_tokens"] == 0
    use_id = events[1][1]["content_block"]["id"]
    assert re.fullmatch(r"srvtoolu_[A-Za-z0-9]{24}", use_id)
    result = events[4][1]["content_block"]
    encrypted = [r.pop("encrypted_content") for r in result["content"]]
    assert ws.open_result((b"",), encrypted[0]) is None  # sealed under the app's key only
    assert events[1:] == [
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {
                    "type": "server_tool_use",
                    "id": use_id,
                    "name": "web_search",
                    "input": {},
                },
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": '{"query": "paris"}'},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {
                    "type": "web_search_tool_result",
                    "tool_use_id": use_id,
                    "content": [
                        {
                            "type": "web_search_result",
                            "url": "https://docs.example.org/paris",
                            "title": "paris on docs.example.org",
                            "page_age": "May 1, 2026",
                        },
                        {
                            "type": "web_search_result",
                            "url": "https://news.example.com/paris",
                            "title": "paris on news.example.com",
                            "page_age": "May 1, 2026",
                        },
                    ],
                },
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 2,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 2,
                "delta": {"type": "text_delta", "text": "See https://docs.example.org/paris"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 2}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {
                    "input_tokens": 20,
                    "output_tokens": 6,
                    "server_tool_use": {"web_search_requests": 1, "web_fetch_requests": 0},
                },
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    # the second round: the search call and the tool message the model saw, no prefill
    second = model.requests[1]
    call, tool_message = second["messages"][-2:]
    assert call["tool_calls"][0]["id"] == use_id
    assert call["tool_calls"][0]["function"] == {
        "name": "web_search",
        "arguments": '{"query":"paris"}',
    }
    assert tool_message["tool_call_id"] == use_id
    assert "URL: https://docs.example.org/paris\n" in tool_message["content"]
    assert "Snippet: About paris." in tool_message["content"]
    assert "continue_final_message" not in second


async def test_buffered_reply_and_its_replay(world: Any) -> None:
    gateway, model, _ = world
    client = await gateway()
    resp = await client.post("/v1/messages", json=_body("rome"))
    message = await resp.json()
    assert resp.status == 200
    assert [b["type"] for b in message["content"]] == [
        "server_tool_use",
        "web_search_tool_result",
        "text",
    ]
    assert message["content"][0]["input"] == {"query": "rome"}
    assert message["content"][2]["text"] == "See https://docs.example.org/rome"
    assert message["usage"]["server_tool_use"] == {
        "web_search_requests": 1,
        "web_fetch_requests": 0,
    }
    assert message["stop_reason"] == "end_turn"
    seen_then = model.requests[1]["messages"][-1]["content"]
    # the client sends the blocks back: the upstream sees the same call and tool message
    replay = {
        "model": "m",
        "max_tokens": 50,
        "messages": [
            {"role": "user", "content": "rome"},
            {"role": "assistant", "content": message["content"]},
            {"role": "user", "content": "thanks"},
        ],
    }
    resp = await client.post("/v1/messages", json=replay)
    assert resp.status == 200
    replayed = model.requests[-1]["messages"]
    assert replayed[2] == {
        "role": "tool",
        "tool_call_id": message["content"][0]["id"],
        "content": seen_then,
    }


@pytest.mark.parametrize(
    "query,code",
    [
        ("x #fail", "unavailable"),
        ("x #busy", "too_many_requests"),
        ("x #slow", "unavailable"),
        ("x #big", "unavailable"),
        ("q" * 501, "query_too_long"),
    ],
)
async def test_a_failed_search_is_an_error_result_and_the_model_goes_on(
    world: Any, query: str, code: str
) -> None:
    gateway, model, _ = world
    client = await gateway()
    message = await (await client.post("/v1/messages", json=_body(query))).json()
    assert message["content"][1]["content"] == {
        "type": "web_search_tool_result_error",
        "error_code": code,
    }
    assert message["content"][2]["text"] == "Nothing found."
    assert message["usage"]["server_tool_use"]["web_search_requests"] == 0
    assert model.requests[1]["messages"][-1]["content"].startswith(
        f"The web search failed ({code})"
    )
    errors = gateway.registry.get_sample_value(
        "llm_gateway_web_search_errors_total", {"backend": "searxng", "error_code": code}
    )
    assert errors == 1
    searched = gateway.registry.get_sample_value(
        "llm_gateway_web_searches_total", {"backend": "searxng", "outcome": "error"}
    )
    assert searched == (0 if code == "query_too_long" else 1)  # refused before the backend


async def test_an_upstream_failing_after_a_search_ends_the_stream_well_formed(world: Any) -> None:
    gateway, _, _ = world
    client = await gateway()
    resp = await client.post("/v1/messages", json=_body("x #die", stream=True))
    events = _events(await resp.text())
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_stop",
        "error",
        "message_stop",
    ]
    assert events[-2][1]["error"]["type"] == "api_error"
    buffered = await client.post("/v1/messages", json=_body("x #die"))
    assert buffered.status >= 500
    assert (await buffered.json())["type"] == "error"


async def test_a_later_round_does_not_fall_back_to_another_model(world: Any) -> None:
    """The first round's model began the reply: when it fails (503) in a later round, the
    stream ends with the error event; the fallback model is not asked to finish it."""
    gateway, model, _ = world
    client = await gateway(fallback=True)
    resp = await client.post("/v1/messages", json=_body("x #down", stream=True))
    events = _events(await resp.text())
    assert [name for name, _ in events][-2:] == ["error", "message_stop"]
    assert events[-2][1]["error"]["type"] == "overloaded_error"
    assert [r["model"] for r in model.requests] == ["up", "up"]


async def test_a_client_tool_called_with_a_search_ends_the_reply_for_the_client(world: Any) -> None:
    gateway, model, _ = world
    client = await gateway()
    body = _body("x #client")
    body["tools"].append({"name": "clock", "input_schema": {"type": "object"}})
    message = await (await client.post("/v1/messages", json=body)).json()
    assert [b["type"] for b in message["content"]] == [
        "server_tool_use",
        "tool_use",
        "web_search_tool_result",
    ]
    assert message["stop_reason"] == "tool_use"
    assert len(model.requests) == 1  # the client runs its tool first
    search, call, _ = message["content"]
    # the client answers its tool: the upstream sees both calls, then both results
    body["messages"] += [
        {"role": "assistant", "content": message["content"]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "noon"}],
        },
    ]
    assert (await client.post("/v1/messages", json=body)).status == 200
    sent = model.requests[1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in sent[1]["tool_calls"]] == [search["id"], call["id"]]
    assert [m["tool_call_id"] for m in sent[2:]] == [search["id"], call["id"]]


async def test_max_uses_then_pause_turn(world: Any) -> None:
    gateway, model, searx = world
    client = await gateway()
    message = await (await client.post("/v1/messages", json=_body("always", max_uses=1))).json()
    kinds = [
        (b["type"], b["content"]["error_code"] if isinstance(b.get("content"), dict) else None)
        for b in message["content"]
    ]
    assert kinds == [
        ("server_tool_use", None),
        ("web_search_tool_result", None),
        ("server_tool_use", None),
        ("web_search_tool_result", "max_uses_exceeded"),
        ("server_tool_use", None),
        ("web_search_tool_result", "max_uses_exceeded"),
    ]
    assert message["stop_reason"] == "pause_turn"
    assert message["usage"]["server_tool_use"]["web_search_requests"] == 1
    assert len(searx.queries) == 1 and len(model.requests) == 3


async def test_domains_and_language_reach_the_backend(world: Any) -> None:
    gateway, _, searx = world
    client = await gateway()
    body = _body(
        "oslo",
        blocked_domains=["example.org"],
        user_location={"type": "approximate", "country": "NO"},
    )
    message = await (await client.post("/v1/messages", json=body)).json()
    assert [r["url"] for r in message["content"][1]["content"]] == ["https://news.example.com/oslo"]
    assert searx.queries == [{"q": "oslo", "format": "json", "language": "nb-NO"}]


async def test_a_forced_search_is_forced_once(world: Any) -> None:
    gateway, model, _ = world
    client = await gateway()
    body = {**_body("lima"), "tool_choice": {"type": "tool", "name": "web_search"}}
    assert (await client.post("/v1/messages", json=body)).status == 200
    assert model.requests[0]["tool_choice"] == {
        "type": "function",
        "function": {"name": "web_search"},
    }
    assert model.requests[1]["tool_choice"] == "auto"


async def test_count_tokens_counts_the_search_function(world: Any) -> None:
    gateway, _, _ = world
    client = await gateway()
    body = _body("x")
    del body["max_tokens"], body["stream"]
    with_tool = await (await client.post("/v1/messages/count_tokens", json=body)).json()
    del body["tools"]
    without = await (await client.post("/v1/messages/count_tokens", json=body)).json()
    assert with_tool["input_tokens"] > without["input_tokens"]


async def test_without_the_table_a_web_search_tool_is_a_400(world: Any) -> None:
    gateway, model, _ = world
    client = await gateway(web_search=False)
    resp = await client.post("/v1/messages", json=_body("x"))
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("tools.0.type: 'web_search_20250305' is an Anthropic")
    assert model.requests == []


async def test_a_verbatim_quote_of_a_snippet_is_cited_and_nothing_else(world: Any) -> None:
    gateway, _, _ = world
    client = await gateway()
    resp = await client.post("/v1/messages", json=_body("x #quote", stream=True))
    events = _events(await resp.text())
    after = [
        (name, data.get("index"), data.get("delta", data.get("content_block")))
        for name, data in events[6:-2]
    ]  # after the search's two blocks
    snippet = "A passage worth quoting, number 0, about x #quote."
    citations = [
        d["citation"]
        for name, _, d in after
        if name == "content_block_delta" and d["type"] == "citations_delta"
    ]
    assert len(citations) == 1
    citation = citations[0]
    assert citation == {
        "type": "web_search_result_location",
        "url": "https://docs.example.org/x-quote",
        "title": "x #quote on docs.example.org",
        "encrypted_index": citation["encrypted_index"],
        "cited_text": snippet,
    }
    text = [
        d["text"]
        for name, _, d in after
        if name == "content_block_delta" and d["type"] == "text_delta"
    ]
    assert "".join(text) == (
        f"They write: {snippet} Others: A passage worth quoting, number 1, about x #quote? Done."
    )
    blocks = [(i, d["type"]) for name, i, d in after if name == "content_block_start"]
    assert blocks == [(2, "text"), (3, "text"), (4, "text")]
    assert [(name, i) for name, i, d in after if d is None or d.get("type") != "text_delta"] == [
        ("content_block_start", 2),
        ("content_block_stop", 2),
        ("content_block_start", 3),
        ("content_block_delta", 3),
        ("content_block_stop", 3),
        ("content_block_start", 4),
        ("content_block_stop", 4),
    ]
    buffered = await (await client.post("/v1/messages", json=_body("x #quote"))).json()
    texts = buffered["content"][2:]
    assert [t.get("citations") is not None for t in texts] == [False, True, False]
    assert texts[1]["text"] == snippet
    assert texts[1]["citations"][0]["cited_text"] == snippet


async def test_a_round_cut_by_max_tokens_ends_the_reply_after_its_searches(world: Any) -> None:
    gateway, model, _ = world
    client = await gateway()
    message = await (await client.post("/v1/messages", json=_body("x #cut"))).json()
    assert [b["type"] for b in message["content"]] == ["server_tool_use", "web_search_tool_result"]
    assert message["stop_reason"] == "max_tokens"
    assert len(model.requests) == 1


def _sample(registry: Any, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


# (metric, its labels): what one Messages reply records, searched or not
_REPLY_METRICS = [
    ("llm_gateway_time_to_first_token_seconds_count", {"api": "messages", "model": "m"}),
    ("llm_gateway_time_per_output_token_seconds_count", {"model": "m"}),
    ("llm_gateway_overhead_seconds_count", {"api": "messages"}),
    ("llm_gateway_stop_reasons_total", {"model": "m", "stop_reason": "end_turn"}),
    ("llm_gateway_tokens_total", {"model": "m", "type": "input"}),
    ("llm_gateway_tokens_total", {"model": "m", "type": "output"}),
    (
        "llm_gateway_stream_terminations_total",
        {"api": "messages", "model": "m", "reason": "completed"},
    ),
]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "buffered"])
async def test_a_searched_reply_counts_once_like_any_reply(world: Any, stream: bool) -> None:
    """A reply of two rounds (a search, then the answer) records what a reply without
    search records, once: TTFT (streamed: its first content block), TPOT, the gateway's
    overhead, the stop reason, and the tokens of both rounds summed, not per round."""
    gateway, model, _ = world
    client = await gateway()
    registry = gateway.registry

    def figures() -> list[float]:
        return [_sample(registry, name, **labels) for name, labels in _REPLY_METRICS]

    before = figures()
    plain = {
        "model": "m",
        "max_tokens": 50,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    resp = await client.post("/v1/messages", json=plain)  # the plain reply, for comparison
    assert resp.status == 200 and "event: message_stop" in await resp.text()
    after_plain = figures()
    resp = await client.post("/v1/messages", json=_body("paris", stream=stream))
    assert resp.status == 200
    if stream:
        assert "web_search_tool_result" in await resp.text()
    else:
        assert (await resp.json())["usage"]["output_tokens"] == 6
    after = figures()
    assert len(model.requests) == 3  # the plain reply, then two rounds
    plain_delta = [a - b for a, b in zip(after_plain, before, strict=True)]
    searched = [a - b for a, b in zip(after, after_plain, strict=True)]
    # the stub's every round reports 10 prompt and 3 completion tokens; offered no tool, it
    # still calls one (stop_reason tool_use): a plain reply all the same
    assert plain_delta == [1, 1, 1, 0, 10, 3, 1]
    if stream:
        assert searched == [1, 1, 1, 1, 20, 6, 1]
    else:  # no first token on the wire, no stream: as a buffered reply without search
        assert searched == [0, 0, 1, 1, 20, 6, 0]
    ttft = _sample(
        registry, "llm_gateway_time_to_first_token_seconds_sum", api="messages", model="m"
    )
    took = _sample(
        registry,
        "llm_gateway_request_duration_seconds_sum",
        api="messages",
        model="m",
        stream="true",
    )
    assert 0 < ttft < took


async def test_a_stream_is_kept_alive_with_pings_while_a_search_runs(world: Any) -> None:
    """The search waits (within its timeout) until the client has read a ping sent after
    the search's server_tool_use block: the stream is kept alive as for a slow upstream,
    and stays well-formed; the search then answers and the reply goes on. Without pings
    the search would time out, and its result would be an error."""
    gateway, _, searx = world
    client = await gateway(server={"ping_interval": 0.05}, search={"timeout": 30})
    resp = await client.post("/v1/messages", json=_body("x #wait", stream=True))
    assert resp.status == 200
    raw = b""
    searching = False
    pinged = 0
    async for line in resp.content:
        raw += line
        if line != b"\n":
            continue
        frame = raw.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
        if frame.startswith(b"event: content_block_stop") and b'"index":0' in frame:
            searching = True  # the search call is out: the search runs now
        elif frame.startswith(b"event: content_block_start") and searching:
            searching = False  # its result came
        elif frame.startswith(b"event: ping") and searching:
            pinged += 1
            searx.release.set()
    assert pinged >= 1
    events = check_stream(raw)
    kinds = [e["type"] for e in events if e["type"] != "ping"]
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    result = [e for e in events if e["type"] == "content_block_start"][1]["content_block"]
    assert [r["url"] for r in result["content"]] == [  # the search answered, in time
        "https://docs.example.org/x-wait",
        "https://news.example.com/x-wait",
    ]


@pytest.mark.parametrize(
    "max_tokens,rounds,second_max,stop_reason",
    [
        (50, 2, 47, "end_turn"),  # round 1 spent 3 of the 50: round 2 may spend the rest
        (4, 2, 1, "end_turn"),
        (3, 1, None, "max_tokens"),  # nothing left for a round 2: the reply ends there
    ],
)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "buffered"])
async def test_max_tokens_is_one_budget_for_all_rounds(
    world: Any, stream: bool, max_tokens: int, rounds: int, second_max: int | None, stop_reason: str
) -> None:
    """The client's max_tokens bounds the reply's output, every round's summed: each
    round is asked for what the earlier rounds left, never the whole budget again."""
    gateway, model, _ = world
    client = await gateway()
    body = {**_body("paris", stream=stream), "max_tokens": max_tokens}
    resp = await client.post("/v1/messages", json=body)
    assert resp.status == 200
    if stream:
        events = _events(await resp.text())
        delta = next(e for name, e in events if name == "message_delta")
        got_stop, output = delta["delta"]["stop_reason"], delta["usage"]["output_tokens"]
    else:
        message = await resp.json()
        got_stop, output = message["stop_reason"], message["usage"]["output_tokens"]
    assert len(model.requests) == rounds
    assert model.requests[0]["max_tokens"] == max_tokens
    if second_max is not None:
        assert model.requests[1]["max_tokens"] == second_max
    assert got_stop == stop_reason
    assert output == 3 * rounds


_IDS = re.compile(
    r'"(srvtoolu|toolu|msg)_[A-Za-z0-9_-]+"|"(encrypted_content|encrypted_index|'
    r'signature)":"[^"]*"'
)


def _normalised(message: dict[str, Any]) -> str:
    """A message's JSON with its ids and sealed fields (new in every reply) normalised."""
    return _IDS.sub(
        lambda m: f'"{m[1]}_"' if m[1] else f'"{m[2]}":""',
        json.dumps(message, separators=(",", ":")),
    )


@pytest.mark.parametrize(
    "query,tools",
    [
        ("paris", []),
        ("x #quote", []),
        ("x #fail", []),
        ("x #many", []),
        ("x #cut", []),
        ("always", []),
        ("x #client", [{"name": "clock", "input_schema": {"type": "object"}}]),
    ],
)
async def test_the_buffered_reply_is_its_stream_folded(
    world: Any, query: str, tools: list[Any]
) -> None:
    """The buffered reply (made of the blocks the rounds keep) equals the streamed reply's
    events folded the way the SDKs fold them."""
    gateway, _, _ = world
    client = await gateway()
    body = _body(query, max_uses=1)
    body["tools"] += tools
    streamed = await (await client.post("/v1/messages", json={**body, "stream": True})).read()
    buffered = await (await client.post("/v1/messages", json=body)).json()
    assert _normalised(buffered) == _normalised(aggregate(streamed))
    assert buffered["content"][0]["type"] == "server_tool_use"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "buffered"])
async def test_the_rounds_do_not_parse_their_events_again(
    world: Any, monkeypatch: Any, stream: bool
) -> None:
    """The rounds read the translator's frames by their prefixes and decode only what the
    next round's request needs, once per block: JSON decodes in the web search modules
    (and in folding events into a message) do not grow with the stream's events."""
    gateway, _, _ = world
    client = await gateway()
    counts = {"re-parsed": 0}
    real_loads, real_upstream = jsonutil.loads, jsonutil.loads_upstream

    def counted(real: Any) -> Any:
        def loads(data: Any) -> Any:
            caller = sys._getframe(1).f_code.co_filename
            if f"{os.sep}tools{os.sep}" in caller or caller.endswith("aggregate.py"):
                counts["re-parsed"] += 1
            return real(data)

        return loads

    monkeypatch.setattr(jsonutil, "loads", counted(real_loads))
    monkeypatch.setattr(jsonutil, "loads_upstream", counted(real_upstream))
    # a failed search (no snippets to quote), then "Nothing found." one character a chunk
    resp = await client.post("/v1/messages", json=_body("x #many #fail", stream=stream))
    assert resp.status == 200
    text = await resp.text()
    assert text.count("text_delta") > 10 if stream else "Nothing found." in text
    # the search call's input (its delta body, its JSON) and the text block: 3, where
    # parsing every event again took one per event (25 streamed; 49 buffered, folding
    # the events into the message once more)
    assert counts["re-parsed"] <= 4
