"""No engine running: what a client reads when the upstream's port is closed.

``pip install . && llm-gateway`` with no engine behind it answered every request
"529 Overloaded" while the log said "connection refused": a newcomer read a busy engine
where there was none. The reply keeps the status (529, 503 in OpenAI's dialect: the SDKs
retry both, and an engine that is starting up answers a moment later) and names the cause,
without the upstream's address (a secret: no host, URL or port reaches a client).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import stub_config
from tests.procs import free_port, post

pytestmark = pytest.mark.e2e

MESSAGE = "Upstream unreachable: connection refused"
_ASK = {"model": "m-ok", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}

# (case, path, request body, status, error type)
CASES = [
    ("messages-buffered", "/v1/messages", _ASK, 529, "overloaded_error"),
    ("messages-streamed", "/v1/messages", {**_ASK, "stream": True}, 529, "overloaded_error"),
    ("chat-buffered", "/v1/chat/completions", _ASK, 503, "server_error"),
    ("chat-streamed", "/v1/chat/completions", {**_ASK, "stream": True}, 503, "server_error"),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "etype"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_closed_upstream_port_is_named_unreachable(
    gateway_factory, path: str, body: dict, status: int, etype: str
) -> None:
    port = free_port()  # bound, then closed: nothing listens there
    _, url = gateway_factory(stub_config(f"http://127.0.0.1:{port}/v1", models=("ok",)))
    got, headers, raw = post(url + "/llm" + path, body)
    assert got == status, raw
    assert headers.get("retry-after")  # still an overload the SDKs retry
    error = json.loads(raw)["error"]
    assert error["type"] == etype
    assert error["message"] == MESSAGE
    assert "127.0.0.1" not in raw.decode() and str(port) not in raw.decode()
