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
