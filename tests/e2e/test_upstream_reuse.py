"""Upstream keep-alive across streams, through the real gateway and the scripted stub.

vLLM, SGLang and aiohttp servers send a stream's chunked terminator as a write of its
own after ``data: [DONE]``. The gateway has finished the client's stream at ``[DONE]``;
it then waits a moment (``_DRAIN_SECONDS`` in gateway/upstream/client.py) for that
terminator so the connection goes back to the pool instead of being closed. A terminator
that does not come in time means the connection is closed, and the client never waits
for it.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from tests.conftest import stub_config
from tests.procs import post


def _peers(stub_url: str, model: str) -> list[int]:
    """The client port of every chat request the stub saw for ``model``: one per connection."""
    with urllib.request.urlopen(stub_url.removesuffix("/v1") + "/_requests", timeout=5) as r:
        return [req["peer"] for req in json.loads(r.read())
                if isinstance(req["body"], dict) and req["body"].get("model") == model]


@pytest.mark.parametrize(("scenario", "reused"), [
    ("end-late:20", True),     # the terminator 20 ms after [DONE]: inside the wait
    ("end-late:1500", False),  # 1.5 s after: the connection is closed instead
])
def test_a_stream_ended_by_done_leaves_its_connection_for_the_next(
        stub_url, gateway_factory, scenario: str, reused: bool) -> None:
    _, url = gateway_factory(stub_config(stub_url, models=(scenario,)))
    seen = len(_peers(stub_url, scenario))  # the stub is shared by the whole session
    for _ in range(3):
        t = time.monotonic()
        status, _, body = post(url + "/llm/v1/messages", {
            "model": f"m-{scenario}", "max_tokens": 32, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]})
        took = time.monotonic() - t
        assert status == 200
        assert body.rstrip().endswith(b'data: {"type":"message_stop"}')
        assert took < 1.0  # never the 1.5 s of a late terminator
        time.sleep(0.06)  # until then the connection is still waiting for its terminator
    peers = _peers(stub_url, scenario)[seen:]
    assert len(peers) == 3
    assert (len(set(peers)) == 1) is reused, peers


def test_buffered_and_pass_through_replies_reuse_one_connection(stub_url,
                                                                 gateway_factory) -> None:
    _, url = gateway_factory(stub_config(stub_url, models=("ok",)))
    seen = len(_peers(stub_url, "ok"))
    for stream in (False, True):
        status, _, _ = post(url + "/llm/v1/messages", {
            "model": "m-ok", "max_tokens": 32, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]})
        assert status == 200
        status, _, _ = post(url + "/llm/v1/chat/completions", {
            "model": "m-ok", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
        assert status == 200
    peers = _peers(stub_url, "ok")[seen:]
    assert len(peers) == 4
    assert len(set(peers)) == 1, peers
