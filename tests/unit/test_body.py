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
    cfg = config.parse({"server": server,
                        "upstreams": {"u": {"base_url": "http://127.0.0.1:9/v1"}},
                        "models": [{"name": "m", "upstream": "u", "upstream_model": "m"}]},
                       "test.toml", {})
    return build_app(cfg, CollectorRegistry())


async def _held(first: bytes, release: asyncio.Event, rest: bytes) -> AsyncIterator[bytes]:
    yield first
    await release.wait()
    yield rest


async def test_past_the_budget_a_body_waits_its_turn_with_a_529(aiohttp_client: Any) -> None:
    app = _app(max_decoding_bytes=1000)
    client = await aiohttp_client(app)
    release = asyncio.Event()
    first = asyncio.create_task(client.post(
        "/llm/v1/messages", data=_held(b'{"model":"nope","pad":"' + b"x" * 800, release,
                                       b'"}')))
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
    resp = await client.post("/llm/v1/messages",
                             data=b'{"model":"nope","pad":"' + b"z" * 5000 + b'"}')
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
    resp = await client.post(path, data=_held(b'{"model":"m","pad":"' + b"x" * 3000, release,
                                              b'"}'))
    assert resp.status == 413
    assert "2000 bytes" in (await resp.text())
    assert app[STATE].decoding.held == 0


async def test_a_large_body_is_decoded_off_the_event_loop(aiohttp_client: Any,
                                                          monkeypatch: Any) -> None:
    """ujson holds the GIL, so a 32 MiB body decoded on the loop (0.3-0.5 s) stalled every
    other request; past ``decode_offload_bytes`` the count and the decode run in a child
    process, and the loop only loads the result. In process, ``jsonutil`` is poisoned: only
    the child may decode the large body; the small one still decodes in process."""
    from gateway.text import jsonutil
    app = _app(decode_offload_bytes=1000)
    client = await aiohttp_client(app)
    big = b'{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"' + \
        b"x" * 2000 + b'"}],"metadata":{"n":[1,2.5,null,true]}}'
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
    resp = await client.post("/llm/v1/messages/count_tokens", data=big,
                             headers={"anthropic-version": "2023-06-01"})
    assert resp.status == 200, await resp.text()
    assert seen[0]["messages"][0]["content"] == "x" * 2000
    assert seen[0]["metadata"] == {"n": [1, 2.5, None, True]}
    # the child's refusals are the in-process ones: the path of a lone surrogate, bad JSON
    resp = await client.post("/llm/v1/messages", data=big.replace(b'"x', b'"\\ud800x'))
    assert resp.status == 400 and "messages.0.content" in await resp.text()
    resp = await client.post("/llm/v1/messages", data=big[:-1])
    assert resp.status == 400 and "not valid JSON" in await resp.text()
    import io
    resp = await client.post("/llm/v1/messages",
                             data=io.BytesIO(b"[" + b"[]," * 600_000 + b"[]]"))
    assert resp.status == 413 and "JSON values" in await resp.text()
    assert app[STATE].decoding.held == 0
