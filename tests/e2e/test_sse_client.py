"""A generic SSE client (aiohttp-sse-client) reads both of the gateway's stream kinds.

Anthropic streams: every event is named and its name equals the JSON ``type``. OpenAI
pass-through streams: unnamed ``data:`` events ending with ``[DONE]``. The client reconnects
(re-sending the POST) when a stream ends, so the tests stop at the terminal event.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp_sse_client.client import EventSource

pytestmark = pytest.mark.e2e

BODY = {"max_tokens": 20, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def _events(url: str, body: dict, last: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    async with EventSource(
        url, option={"method": "POST"}, json=body, max_connect_retry=0
    ) as source:
        async for event in source:
            out.append((event.type, event.data))
            if event.data == last or event.type == last:
                break
    return out


def test_anthropic_stream_events_are_named_by_type(stub_gateway) -> None:
    _, base = stub_gateway
    events = asyncio.run(
        asyncio.wait_for(
            _events(base + "/v1/messages", {**BODY, "model": "m-reasoning"}, "message_stop"), 20
        )
    )
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    for name, data in events:
        assert json.loads(data)["type"] == name


def test_openai_pass_through_stream_ends_with_done(stub_gateway) -> None:
    _, base = stub_gateway
    events = asyncio.run(
        asyncio.wait_for(
            _events(base + "/v1/chat/completions", {**BODY, "model": "m-ok"}, "[DONE]"), 20
        )
    )
    assert events[-1][1] == "[DONE]" and {name for name, _ in events} <= {None, "message"}
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert {c["model"] for c in chunks} == {"m-ok"}
    assert (
        "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        == "Hello from the stub."
    )
