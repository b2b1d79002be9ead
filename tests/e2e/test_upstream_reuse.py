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
from collections.abc import Callable

import pytest

from tests.conftest import stub_config
from tests.procs import post

_ALWAYS = 'keepalive = "always"'


def _open_streams(stub_url: str) -> int:
    """Streams the stub has not finished writing (its terminator not yet sent)."""
    with urllib.request.urlopen(stub_url.removesuffix("/v1") + "/_stats", timeout=5) as r:
        return int(json.loads(r.read())["open_streams"])


def _stub_streams_at_most(stub_url: str, n: int) -> Callable[[], bool]:
    return lambda: _open_streams(stub_url) <= n


def _upstream_connections(url: str) -> float:
    """The gateway's connections open to the stub now, busy or idle."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith('llm_gateway_upstream_connections{upstream="stub"}'):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _wait_until(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def _peers(stub_url: str, model: str) -> list[int]:
    """The client port of every chat request the stub saw for ``model``: one per connection."""
    with urllib.request.urlopen(stub_url.removesuffix("/v1") + "/_requests", timeout=5) as r:
        # /tokenize requests (count_tokens of an earlier test) are recorded without a peer
        return [
            req["peer"]
            for req in json.loads(r.read())
            if req.get("peer") is not None
            and isinstance(req["body"], dict)
            and req["body"].get("model") == model
        ]


@pytest.mark.parametrize(
    ("scenario", "reused"),
    [
        ("end-late:20", True),  # the terminator 20 ms after [DONE]: inside the wait
        ("end-late:30000", False),  # 30 s after: the connection is closed instead
    ],
)
def test_a_stream_ended_by_done_leaves_its_connection_for_the_next(
    stub_url, gateway_factory, scenario: str, reused: bool
) -> None:
    # the stub echoes no X-Request-Id: reuse here is the operator's call ("always")
    _, url = gateway_factory(stub_config(stub_url, models=(scenario,), extra_upstream=_ALWAYS))
    seen = len(_peers(stub_url, scenario))  # the stub is shared by the whole session
    for _ in range(3):
        streams = _open_streams(stub_url)
        t = time.monotonic()
        status, _, body = post(
            url + "/llm/v1/messages",
            {
                "model": f"m-{scenario}",
                "max_tokens": 32,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
        took = time.monotonic() - t
        assert status == 200
        assert body.rstrip().endswith(b'data: {"type":"message_stop"}')
        assert took < 15  # the client never waits for a late terminator (30 s late here)
        if reused:  # the stub has sent the terminator: the connection is back in the pool
            _wait_until(_stub_streams_at_most(stub_url, streams))
        else:  # the gateway gave up waiting for it and closed the connection
            _wait_until(lambda: _upstream_connections(url) == 0)
    peers = _peers(stub_url, scenario)[seen:]
    assert len(peers) == 3
    assert len(set(peers)) == (1 if reused else 3), peers


def test_buffered_and_pass_through_replies_reuse_one_connection(stub_url, gateway_factory) -> None:
    _, url = gateway_factory(stub_config(stub_url, models=("ok",), extra_upstream=_ALWAYS))
    seen = len(_peers(stub_url, "ok"))
    for stream in (False, True):
        status, _, _ = post(
            url + "/llm/v1/messages",
            {
                "model": "m-ok",
                "max_tokens": 32,
                "stream": stream,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
        assert status == 200
        status, _, _ = post(
            url + "/llm/v1/chat/completions",
            {"model": "m-ok", "stream": stream, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert status == 200
    peers = _peers(stub_url, "ok")[seen:]
    assert len(peers) == 4
    assert len(set(peers)) == 1, peers
