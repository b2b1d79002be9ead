"""A saturated model's queue (models[].queue_timeout, gateway/http/admission.py), end to end:
the real gateway in front of the stub, whose ``delay:MS`` model holds a slot for MS ms.

- a request past max_concurrency waits and is answered once the slot frees;
- past queue_timeout: 529 overloaded_error with retry-after, counted as queue_timeout (a
  stream that waited past ping_interval got pings first and ends with the error event);
- a waiting stream gets pings, then its reply (raw bytes and the Python SDK's helper);
- a client that leaves while waiting leaves the queue: the slot goes to the next one and
  its request never reaches the upstream.

Ordering is by observed state (the stub saw a request, the queue gauge reached N), never by
timing.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import anthropic
import pytest

from tests.anthropic_stream_check import check_stream
from tests.conftest import clear_stub, stub_config, stub_requests
from tests.procs import metric

pytestmark = pytest.mark.timeout(60)


def _config(stub_url: str, hold_ms: int, queue_timeout: float, ping: float = 10.0) -> str:
    return (
        stub_config(stub_url, models=(f"delay:{hold_ms}",), extra_server=f"ping_interval = {ping}")
        + f"max_concurrency = 1\nqueue_timeout = {queue_timeout}\n"
    )


def _msg(model: str, text: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


def _seen(stub_url: str, tag: str) -> list[str]:
    """The user texts of the stub's requests carrying ``tag``."""
    out = []
    for r in stub_requests(stub_url):
        body = r.get("body") or {}
        for m in body.get("messages", []):
            content = m.get("content")
            if isinstance(content, str) and tag in content:
                out.append(content)
    return out


async def _until(check: Callable[[], bool], what: str, limit: float = 15.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.02)


def _queued(base: str, model: str) -> float:
    return metric(base, "llm_gateway_model_queue_requests", model=model)


async def _post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[int, dict[str, str], bytes]:
    async with session.post(url, json=body) as resp:
        return resp.status, {k.lower(): v for k, v in resp.headers.items()}, await resp.read()


async def test_a_queued_request_is_answered_when_the_slot_frees(stub_url, gateway_factory) -> None:
    _, url = gateway_factory(_config(stub_url, 800, queue_timeout=20))
    base, model, tag = url + "/llm", "m-delay:800", uuid.uuid4().hex
    clear_stub(stub_url)
    async with aiohttp.ClientSession() as session:
        first = asyncio.create_task(_post(session, base + "/v1/messages", _msg(model, f"{tag} A")))
        await _until(lambda: len(_seen(stub_url, tag)) == 1, "A reached the upstream")
        second = asyncio.create_task(_post(session, base + "/v1/messages", _msg(model, f"{tag} B")))
        await _until(lambda: _queued(url, model) == 1, "B waits")
        statuses = [(await first)[0], (await second)[0]]
    assert statuses == [200, 200]
    assert _seen(stub_url, tag) == [f"{tag} A", f"{tag} B"]
    assert (
        metric(url, "llm_gateway_model_queue_outcomes_total", model=model, outcome="admitted") == 1
    )
    assert (
        metric(url, "llm_gateway_model_queue_wait_seconds_count", model=model, client="anonymous")
        == 1
    )
    assert _queued(url, model) == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_past_queue_timeout_a_529_with_retry_after(stub_url, gateway_factory, stream) -> None:
    # ping_interval (10 s) is past queue_timeout: even a stream gets a plain JSON 529
    _, url = gateway_factory(_config(stub_url, 2500, queue_timeout=0.5))
    base, model, tag = url + "/llm", "m-delay:2500", uuid.uuid4().hex
    clear_stub(stub_url)
    async with aiohttp.ClientSession() as session:
        first = asyncio.create_task(_post(session, base + "/v1/messages", _msg(model, f"{tag} A")))
        await _until(lambda: len(_seen(stub_url, tag)) == 1, "A reached the upstream")
        status, headers, body = await _post(
            session, base + "/v1/messages", _msg(model, f"{tag} B", stream=stream)
        )
        assert (await first)[0] == 200
    assert status == 529 and headers.get("retry-after") == "1"
    assert headers["content-type"].startswith("application/json")
    assert json.loads(body)["error"]["type"] == "overloaded_error"
    assert metric(url, "llm_gateway_rejected_total", reason="queue_timeout") == 1
    assert metric(url, "llm_gateway_rejected_total", reason="overloaded") == 0
    assert (
        metric(url, "llm_gateway_model_queue_outcomes_total", model=model, outcome="timed_out") == 1
    )
    assert _seen(stub_url, tag) == [f"{tag} A"]


async def test_a_waiting_stream_gets_pings_then_its_reply(stub_url, gateway_factory) -> None:
    _, url = gateway_factory(_config(stub_url, 1200, queue_timeout=20, ping=0.2))
    base, model, tag = url + "/llm", "m-delay:1200", uuid.uuid4().hex
    clear_stub(stub_url)
    async with aiohttp.ClientSession() as session:
        first = asyncio.create_task(_post(session, base + "/v1/messages", _msg(model, f"{tag} A")))
        await _until(lambda: len(_seen(stub_url, tag)) == 1, "A reached the upstream")
        status, headers, raw = await _post(
            session, base + "/v1/messages", _msg(model, f"{tag} B", stream=True)
        )
        assert (await first)[0] == 200
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = check_stream(raw)
    types = [e["type"] for e in events]
    start = types.index("message_start")
    assert start >= 1 and set(types[:start]) == {"ping"}, types  # pings while it waited
    assert types[-1] == "message_stop" and "error" not in types
    assert _seen(stub_url, tag) == [f"{tag} A", f"{tag} B"]


async def test_a_waiting_stream_that_times_out_ends_with_the_error_event(
    stub_url, gateway_factory
) -> None:
    _, url = gateway_factory(_config(stub_url, 2500, queue_timeout=0.9, ping=0.2))
    base, model, tag = url + "/llm", "m-delay:2500", uuid.uuid4().hex
    clear_stub(stub_url)
    async with aiohttp.ClientSession() as session:
        first = asyncio.create_task(_post(session, base + "/v1/messages", _msg(model, f"{tag} A")))
        await _until(lambda: len(_seen(stub_url, tag)) == 1, "A reached the upstream")
        status, _, raw = await _post(
            session, base + "/v1/messages", _msg(model, f"{tag} B", stream=True)
        )
        assert (await first)[0] == 200
    assert status == 200
    events = check_stream(raw)  # an error stream: no block open, one error, message_stop
    types = [e["type"] for e in events]
    assert types[0] == "ping" and types[-2:] == ["error", "message_stop"], types
    assert events[-2]["error"]["type"] == "overloaded_error"
    assert metric(url, "llm_gateway_rejected_total", reason="queue_timeout") == 1
    assert _seen(stub_url, tag) == [f"{tag} A"]


async def test_the_sdk_stream_helper_reads_a_waiting_stream(stub_url, gateway_factory) -> None:
    """messages.stream() through pings to the reply; timed out after pings, the SDK raises
    the stream's error event (overloaded_error)."""
    got: list[Any] = []
    for hold, queue_timeout in ((1200, 20.0), (2500, 0.9)):
        _, url = gateway_factory(_config(stub_url, hold, queue_timeout=queue_timeout, ping=0.2))
        base, model, tag = url + "/llm", f"m-delay:{hold}", uuid.uuid4().hex
        clear_stub(stub_url)
        sdk = anthropic.AsyncAnthropic(base_url=base, api_key="unused", max_retries=0)
        async with aiohttp.ClientSession() as session:
            first = asyncio.create_task(
                _post(session, base + "/v1/messages", _msg(model, f"{tag} A"))
            )
            await _until(lambda t=tag: len(_seen(stub_url, t)) == 1, "A reached the upstream")
            try:
                async with sdk.messages.stream(**_msg(model, f"{tag} B")) as stream:
                    got.append(await stream.get_final_text())
            except anthropic.APIStatusError as exc:
                got.append(exc)
            finally:
                await sdk.close()
            assert (await first)[0] == 200
    text, err = got
    assert isinstance(text, str) and text
    assert isinstance(err, anthropic.APIStatusError)
    assert err.body["error"]["type"] == "overloaded_error"  # type: ignore[index]


async def test_a_client_that_leaves_while_waiting_leaves_the_queue(
    stub_url, gateway_factory
) -> None:
    _, url = gateway_factory(_config(stub_url, 1500, queue_timeout=20))
    base, model, tag = url + "/llm", "m-delay:1500", uuid.uuid4().hex
    clear_stub(stub_url)
    host, port = url.removeprefix("http://").split(":")
    async with aiohttp.ClientSession() as session:
        first = asyncio.create_task(_post(session, base + "/v1/messages", _msg(model, f"{tag} A")))
        await _until(lambda: len(_seen(stub_url, tag)) == 1, "A reached the upstream")
        body = json.dumps(_msg(model, f"{tag} B")).encode()
        gone = socket.create_connection((host, int(port)), timeout=5)
        try:
            gone.sendall(
                b"POST /llm/v1/messages HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            await _until(lambda: _queued(url, model) == 1, "B waits")
            third = asyncio.create_task(
                _post(session, base + "/v1/messages", _msg(model, f"{tag} C"))
            )
            await _until(lambda: _queued(url, model) == 2, "C waits behind B")
        finally:
            gone.close()
        await _until(lambda: _queued(url, model) == 1, "B left the queue")
        statuses = [(await first)[0], (await third)[0]]
    assert statuses == [200, 200]
    assert _seen(stub_url, tag) == [f"{tag} A", f"{tag} C"]  # B never reached the upstream
    assert metric(url, "llm_gateway_model_queue_outcomes_total", model=model, outcome="left") == 1
    assert (
        metric(url, "llm_gateway_model_queue_outcomes_total", model=model, outcome="admitted") == 1
    )


@pytest.mark.parametrize(
    ("kind", "send", "expected"),
    [("vllm", True, -10), ("sglang", True, 10), ("vllm", False, None)],
)
def test_send_priority_sends_the_clients_weight(
    stub_url, gateway_factory, kind, send, expected
) -> None:
    """upstreams.NAME.send_priority: a weight-2 client's requests carry priority -10 to
    vLLM (lower first), +10 to SGLang (higher first), on Messages and the pass-through."""
    from tests.procs import post

    cfg = stub_config(
        stub_url,
        models=("ok",),
        extra_upstream=f'kind = "{kind}"\nsend_priority = {str(send).lower()}',
    )
    cfg += '\n[[clients]]\nname = "team"\nkey_env = "TEAM_KEY"\nweight = 2\n'
    _, url = gateway_factory(cfg, env={"TEAM_KEY": "team-key-0123456789"})
    tag = uuid.uuid4().hex
    clear_stub(stub_url)
    headers = {"x-api-key": "team-key-0123456789"}
    for path in ("/v1/messages", "/v1/chat/completions"):
        status, _, _ = post(url + "/llm" + path, _msg("m-ok", f"{tag} {path}"), headers=headers)
        assert status == 200
    bodies = [
        r["body"]
        for r in stub_requests(stub_url)
        if r.get("body") and tag in json.dumps(r["body"].get("messages"))
    ]
    assert len(bodies) == 2
    assert [b.get("priority") for b in bodies] == [expected, expected]
