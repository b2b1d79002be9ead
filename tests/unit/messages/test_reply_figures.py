"""One reply, one record (gateway/messages/from_chat/figures.py): each kind of Messages reply
records its own series exactly once, whatever ran it (gateway/messages/reply.py): buffered,
streamed, a cut stream continued (buffered and streamed), a web search's two rounds (buffered and
streamed), a batch request. The real app in process, against an in-test scripted model and
an in-test SearXNG."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gateway.app import build_app
from gateway.batches.store import BatchStore
from gateway.ops import config

SEARCH_TOOL = {"type": "web_search_20250305", "name": "web_search"}
_USAGE = (
    b'data: {"id":"c","object":"chat.completion.chunk","model":"up","choices":[],'
    b'"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}\n\n'
    b"data: [DONE]\n\n"
)


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": "up",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _model(request: web.Request) -> web.StreamResponse:
    """Buffered: a plain answer. Streamed: ``#search`` calls web_search until a tool message
    answers it; ``#cut`` ends its first answer without a finish (continued: the prefill's
    continuation finishes it); else a plain answer. Every answer: 10 prompt, 3 completion
    tokens."""
    body = await request.json()
    messages = body["messages"]
    text = json.dumps(messages)
    if not body.get("stream"):
        return web.json_response(
            {
                "id": "c",
                "object": "chat.completion",
                "model": "up",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "Hello there."},
                    }
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
            }
        )
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_chunk({"role": "assistant", "content": ""}))
    last = messages[-1]["role"]
    if "#search" in text and last != "tool":
        await resp.write(
            _chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "web_search", "arguments": '{"query": "q"}'},
                        }
                    ]
                }
            )
        )
        await resp.write(_chunk({}, "tool_calls") + _USAGE)
    elif "#cut" in text and last != "assistant":
        await resp.write(_chunk({"content": "Hel"}))
        await resp.write(_chunk({"content": "lo"}))  # ends without a finish: cut
        await resp.write_eof()
        return resp
    else:
        await resp.write(_chunk({"content": "Hello"}))
        await resp.write(_chunk({"content": " there."}))
        await resp.write(_chunk({}, "stop") + _USAGE)
    await resp.write_eof()
    return resp


async def _searx(request: web.Request) -> web.Response:
    return web.json_response(
        {
            "query": "q",
            "number_of_results": 1,
            "results": [
                {
                    "url": "https://example.org/q",
                    "title": "q",
                    "content": "About q.",
                    "engine": "stub",
                    "score": 1.0,
                    "category": "general",
                }
            ],
            "answers": [],
            "corrections": [],
            "infoboxes": [],
            "suggestions": [],
            "unresponsive_engines": [],
        }
    )


# (metric, its labels): a reply's own series (requests are the middleware's)
_SERIES = [
    ("llm_gateway_tokens_total", {"model": "m", "type": "input"}),
    ("llm_gateway_tokens_total", {"model": "m", "type": "output"}),
    ("llm_gateway_stop_reasons_total", {"model": "m", "stop_reason": "end_turn"}),
    ("llm_gateway_time_to_first_token_seconds_count", {"api": "messages", "model": "m"}),
    ("llm_gateway_time_per_output_token_seconds_count", {"model": "m"}),
    ("llm_gateway_overhead_seconds_count", {"api": "messages"}),
    (
        "llm_gateway_stream_terminations_total",
        {"api": "messages", "model": "m", "reason": "completed"},
    ),
]

# kind -> (request text, client stream, tools, what the reply records: input and output
# tokens, then once or never each of stop reason, TTFT, TPOT, overhead, termination)
KINDS = {
    "buffered": ("hi", False, None, [10, 3, 1, 0, 0, 1, 0]),
    "streamed": ("hi", True, None, [10, 3, 1, 1, 1, 1, 1]),
    # the usage the client was told: the first part's prompt (cut before its usage: the
    # request's estimate), the first part's two content chunks and the continuation's 3
    "continued streamed": ("#cut", True, None, [32, 5, 1, 1, 1, 1, 1]),
    "web search buffered": ("#search", False, [SEARCH_TOOL], [20, 6, 1, 0, 0, 1, 0]),
    "web search streamed": ("#search", True, [SEARCH_TOOL], [20, 6, 1, 1, 1, 1, 1]),
    # not timed (no client waits on it): no overhead
    "batch request": ("hi", None, None, [10, 3, 1, 0, 0, 0, 0]),
}


@pytest.fixture
async def gateway(aiohttp_server: Any, aiohttp_client: Any, tmp_path: Any) -> Any:
    up, searx = web.Application(), web.Application()
    up.router.add_post("/v1/chat/completions", _model)
    searx.router.add_get("/search", _searx)
    up_server, searx_server = await aiohttp_server(up), await aiohttp_server(searx)
    data: dict[str, Any] = {
        "server": {"prefix": ""},
        "upstreams": {
            "u": {"base_url": f"http://127.0.0.1:{up_server.port}/v1", "max_continuations": 1}
        },
        "models": [{"name": "m", "upstream": "u", "upstream_model": "up"}],
        "web_search": {"searxng_url": f"http://127.0.0.1:{searx_server.port}"},
        "batches": {"database": f"sqlite:///{tmp_path}/batches.sqlite3", "poll_interval": 0.05},
    }
    registry = CollectorRegistry()
    store = BatchStore.open(f"sqlite:///{tmp_path}/batches.sqlite3")
    app = build_app(
        config.parse(data, "t.toml", {"HOME": str(tmp_path)}), registry, batch_store=store
    )
    return await aiohttp_client(app), registry


async def _batch(client: Any, body: dict[str, Any]) -> None:
    resp = await client.post(
        "/v1/messages/batches", json={"requests": [{"custom_id": "a", "params": body}]}
    )
    assert resp.status == 200, await resp.text()
    batch = await resp.json()
    deadline = time.monotonic() + 20
    while batch["processing_status"] != "ended":
        assert time.monotonic() < deadline, batch
        await asyncio.sleep(0.05)
        batch = await (await client.get(f"/v1/messages/batches/{batch['id']}")).json()
    assert batch["request_counts"]["succeeded"] == 1, batch


@pytest.mark.parametrize("kind", list(KINDS))
async def test_each_kind_of_reply_records_its_figures_once(gateway: Any, kind: str) -> None:
    client, registry = gateway
    text, stream, tools, expected = KINDS[kind]

    def figures() -> list[float]:
        return [registry.get_sample_value(name, labels) or 0.0 for name, labels in _SERIES]

    body: dict[str, Any] = {
        "model": "m",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": text}],
    }
    if tools:
        body["tools"] = tools
    before = figures()
    if stream is None:
        await _batch(client, body)
    else:
        resp = await client.post("/v1/messages", json={**body, "stream": stream})
        assert resp.status == 200
        raw = await resp.text()
        if stream:
            assert raw.rstrip().endswith('data: {"type":"message_stop"}')
        else:
            assert json.loads(raw)["stop_reason"] == "end_turn"
    deadline = time.monotonic() + 5  # a stream is counted as its handler returns
    while True:
        got = [a - b for a, b in zip(figures(), before, strict=True)]
        if got == expected or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    assert got == expected
