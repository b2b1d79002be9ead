"""gateway/http/body.py in process: the decoding budget and the byte cap of a chunked body.

``server.max_decoding_bytes`` counts the bytes of every body being received and decoded at
once, as they arrive; past it a 529 (503 on the pass-through), unless the body is alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.app import build_app
from gateway.http.keys import STATE
from gateway.ops import config


def _app(**server: Any) -> Any:
    cfg = config.parse(
        {
            "server": server,
            "upstreams": {"u": {"base_url": "http://127.0.0.1:9/v1"}},
            "models": [{"name": "m", "upstream": "u", "upstream_model": "m"}],
        },
        "test.toml",
        {},
    )
    return build_app(cfg, CollectorRegistry())


async def _held(first: bytes, release: asyncio.Event, rest: bytes) -> AsyncIterator[bytes]:
    yield first
    await release.wait()
    yield rest


async def test_past_the_budget_a_body_waits_its_turn_with_a_529(aiohttp_client: Any) -> None:
    app = _app(max_decoding_bytes=1000)
    client = await aiohttp_client(app)
    release = asyncio.Event()
    first = asyncio.create_task(
        client.post(
            "/llm/v1/messages", data=_held(b'{"model":"nope","pad":"' + b"x" * 800, release, b'"}')
        )
    )
    for _ in range(200):  # until its first bytes are counted (bounded: 2 s)
        if app[STATE].decoding.held:
            break
        await asyncio.sleep(0.01)
    assert 800 <= app[STATE].decoding.held <= 1000
    for path, status in (("/llm/v1/messages", 529), ("/llm/v1/chat/completions", 503)):
        resp = await client.post(path, data=b'{"model":"m","pad":"' + b"y" * 300 + b'"}')
        assert resp.status == status and resp.headers["retry-after"] == "1"
        assert "Overloaded" in (await resp.text())
    release.set()
    resp = await first
    assert resp.status == 400  # decoded in full, then validated
    assert "messages: Field required" in (await resp.text())
    # alone, a body larger than the whole budget gets through
    resp = await client.post(
        "/llm/v1/messages", data=b'{"model":"nope","pad":"' + b"z" * 5000 + b'"}'
    )
    assert resp.status == 400
    assert app[STATE].decoding.held == 0


@pytest.mark.parametrize("path", ["/llm/v1/messages", "/llm/v1/embeddings"])
async def test_a_chunked_body_is_measured_as_it_arrives(aiohttp_client: Any, path: str) -> None:
    """No Content-Length for the middleware to check: the reader counts, and gives the
    budget back."""
    app = _app(max_body_bytes=2000)
    client = await aiohttp_client(app)
    release = asyncio.Event()
    release.set()
    resp = await client.post(
        path, data=_held(b'{"model":"m","pad":"' + b"x" * 3000, release, b'"}')
    )
    assert resp.status == 413
    assert "2000 bytes" in (await resp.text())
    assert app[STATE].decoding.held == 0


async def test_a_large_body_is_decoded_off_the_event_loop(
    aiohttp_client: Any, monkeypatch: Any
) -> None:
    """ujson holds the GIL, so a 32 MiB body decoded on the loop (0.3-0.5 s) stalled every
    other request; past ``decode_offload_bytes`` the count and the decode run in a child
    process, and the loop only loads the result. In process, ``jsonutil`` is poisoned: only
    the child may decode the large body; the small one still decodes in process."""
    from gateway.text import jsonutil

    app = _app(decode_offload_bytes=1000)
    client = await aiohttp_client(app)
    big = (
        b'{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"'
        + b"x" * 2000
        + b'"}],"metadata":{"n":[1,2.5,null,true]}}'
    )
    seen: list[Any] = []
    import gateway.http.anthropic as handler

    real = handler.validate_messages

    def spy(body: Any, **kw: Any) -> Any:
        seen.append(body)
        return real(body, **kw)

    monkeypatch.setattr(handler, "validate_messages", spy)

    def poisoned(*_: Any, **__: Any) -> Any:
        raise AssertionError("decoded on the event loop")

    monkeypatch.setattr(jsonutil, "loads", poisoned)
    monkeypatch.setattr(jsonutil, "too_many_values", poisoned)
    resp = await client.post(
        "/llm/v1/messages/count_tokens", data=big, headers={"anthropic-version": "2023-06-01"}
    )
    assert resp.status == 200, await resp.text()
    assert seen[0]["messages"][0]["content"] == "x" * 2000
    assert seen[0]["metadata"] == {"n": [1, 2.5, None, True]}
    # the child's refusals are the in-process ones: the path of a lone surrogate, bad JSON
    resp = await client.post("/llm/v1/messages", data=big.replace(b'"x', b'"\\ud800x'))
    assert resp.status == 400 and "messages.0.content" in await resp.text()
    resp = await client.post("/llm/v1/messages", data=big[:-1])
    assert resp.status == 400 and "not valid JSON" in await resp.text()
    import io

    resp = await client.post("/llm/v1/messages", data=io.BytesIO(b"[" + b"[]," * 600_000 + b"[]]"))
    assert resp.status == 413 and "JSON values" in await resp.text()
    assert app[STATE].decoding.held == 0


async def test_the_decoder_child_is_started_off_the_event_loop(monkeypatch: Any) -> None:
    """Its first spawn starts the forkserver, which imports the gateway before it forks: on
    the loop that stopped every other request (1.06 s measured under four 30 MiB bodies).
    Two bodies at once start one child."""
    import threading

    from gateway.http import decoder

    started: list[int] = []
    real = decoder._start

    def start() -> Any:
        started.append(threading.get_ident())
        return real()

    monkeypatch.setattr(decoder, "_start", start)
    dec = decoder.Decoder()
    try:
        outcomes = await asyncio.gather(dec.decode(b'{"a": [1]}', 100), dec.decode(b"[1, 2", 100))
    finally:
        dec.close()
    assert outcomes[0][0] == "ok" and outcomes[1] == ("not_json",)
    assert len(started) == 1 and started[0] != threading.get_ident()


async def test_a_large_buffered_upstream_reply_is_decoded_off_the_event_loop(
    aiohttp_client: Any, aiohttp_server: Any, monkeypatch: Any
) -> None:
    """A buffered reply past ``decode_offload_bytes`` (20 tool calls of 250 KiB arguments:
    5.9 MB, about 60 ms of ujson holding the GIL) is decoded in the decoder child; a small
    one still on the loop. In process, ``jsonutil.loads_upstream`` refuses large bodies."""
    from aiohttp import web

    from gateway.text import jsonutil

    args = '{"path": "a.py", "content": "' + "x = 1\\n" * 400 + '"}'
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": "write", "arguments": args}}
        for i in range(3)
    ]

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        big = body["messages"][-1]["content"] == "big"
        message = (
            {"role": "assistant", "content": None, "tool_calls": calls}
            if big
            else {"role": "assistant", "content": "hi"}
        )
        return web.json_response(
            {
                "id": "c1",
                "object": "chat.completion",
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if big else "stop",
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
            }
        )

    upstream = web.Application()
    upstream.router.add_post("/v1/chat/completions", chat)
    server = await aiohttp_server(upstream)
    cfg = config.parse(
        {
            "server": {"decode_offload_bytes": 2000},
            "upstreams": {"u": {"base_url": str(server.make_url("/v1"))}},
            "models": [{"name": "m", "upstream": "u", "upstream_model": "m"}],
        },
        "test.toml",
        {},
    )
    client = await aiohttp_client(build_app(cfg, CollectorRegistry()))
    real = jsonutil.loads_upstream
    in_process: list[int] = []

    def guarded(data: Any) -> Any:
        in_process.append(len(data))
        if len(data) > 2000:
            raise AssertionError("decoded on the event loop")
        return real(data)

    monkeypatch.setattr(jsonutil, "loads_upstream", guarded)
    tools = [{"name": "write", "input_schema": {"type": "object"}}]
    for content in ("big", "small"):
        resp = await client.post(
            "/llm/v1/messages",
            json={
                "model": "m",
                "max_tokens": 50,
                "tools": tools,
                "messages": [{"role": "user", "content": content}],
            },
            headers={"anthropic-version": "2023-06-01"},
        )
        assert resp.status == 200, await resp.text()
        reply = await resp.json()
        if content == "big":
            assert [b["type"] for b in reply["content"]] == ["tool_use"] * 3
            assert reply["content"][2]["input"]["content"] == "x = 1\n" * 400
        else:
            assert reply["content"] == [{"type": "text", "text": "hi"}]
    assert len(in_process) == 1 and in_process[0] < 2000  # the small reply only
