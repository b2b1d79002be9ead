"""No upstream secret or internal name reaches a client or a log line, on any route.

A real gateway in front of the scripted stub, whose upstreams have keys: the stub's
``quote-key`` scenarios quote the credential they were sent (the ``Authorization`` header,
the bare key, its URL-encoded form) beside an internal ``host:port`` and IPv6 address, in
an HTTP 4xx/5xx error body, a 200 error body, or an error event in the middle of a stream
(Responses: an ``error`` event and ``response.failed``). On every route, buffered and
streamed, none of it is in any byte the client gets (body and headers) nor in any line
the gateway logs; a 4xx keeps its scrubbed words, a 5xx is replaced whole.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from tests.conftest import stub_config
from tests.logs import log_lines
from tests.procs import Proc, post, start_gateway

pytestmark = pytest.mark.e2e

KEY = "sk-e2e/Secret+Key=7f3a"  # '/', '+' and '=' give it a URL-encoded form of its own
OTHER_KEY = "sk-second-upstream-5b9c"
SCENARIOS = (
    "status:400:quote-key",
    "status:413:quote-key",
    "status:422:quote-key",
    "status:429:quote-key",
    "status:500:quote-key",
    "quote-key:400",
    "quote-key:500",
)
# the keys in every form, and pieces of them: a rule that cut a key in two leaves one
LEAKS = (
    KEY,
    quote(KEY, safe=""),
    quote(KEY, safe="").lower(),
    "Secret+Key",
    "Secret%2",
    "Secret%2b",
    "sk-e2e",
    "7f3a",
    OTHER_KEY,
    "second-upstream",
    "gpu-node-7",
    "internal.example",
    "fd00",
)
ROUTES = [
    # (api, path, body without model, streams)
    (
        "messages",
        "/v1/messages",
        {"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
        True,
    ),
    ("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, True),
    ("completions", "/v1/completions", {"prompt": "hi"}, True),
    ("responses", "/v1/responses", {"input": "hi"}, True),
    ("embeddings", "/v1/embeddings", {"input": "hi"}, False),
]
CASES = [
    (api, path, body, stream)
    for api, path, body, streams in ROUTES
    for stream in ((False, True) if streams else (False,))
]


@pytest.fixture(scope="module")
def gateway(stub_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, str]]:
    """One gateway, two keyed upstreams (both the stub): ``m-<scenario>`` on the first,
    ``o-quote-key:400`` on the second."""
    config = stub_config(stub_url, models=SCENARIOS, extra_upstream='api_key_env = "STUB_KEY"')
    config += f"""
[upstreams.other]
base_url = "{stub_url}"
api_key_env = "OTHER_KEY"

[[models]]
name = "o-quote-key:400"
upstream = "other"
upstream_model = "quote-key:400"
"""
    proc, url = start_gateway(
        config, tmp_path_factory.mktemp("secrets"), env={"STUB_KEY": KEY, "OTHER_KEY": OTHER_KEY}
    )
    try:
        yield proc, url + "/llm"
    finally:
        proc.stop()


def _leaks(data: str) -> list[str]:
    return [leak for leak in LEAKS if leak in data]


def test_the_stub_really_quotes_the_key(stub_url: str) -> None:
    """Without the gateway, every scenario's text holds the key and the internal names."""
    headers = {"Authorization": f"Bearer {KEY}"}
    for model in ("status:400:quote-key", "quote-key:400"):
        for path, body in (("/chat/completions", {"messages": []}), ("/responses", {})):
            for stream in (False, True):
                text = post(stub_url + path, {**body, "model": model, "stream": stream}, headers)[
                    2
                ].decode()
                assert set(_leaks(text)) >= {KEY, quote(KEY, safe=""), "gpu-node-7", "fd00"}


@pytest.mark.parametrize(
    ("api", "path", "body", "stream"),
    CASES,
    ids=[f"{c[0]}-{'stream' if c[3] else 'buffered'}" for c in CASES],
)
def test_no_secret_in_any_client_byte_or_log_line(
    gateway: tuple[Proc, str], api: str, path: str, body: dict, stream: bool
) -> None:
    proc, base = gateway
    ids = []
    for alias in [f"m-{s}" for s in SCENARIOS] + ["o-quote-key:400"]:
        request_id = f"leak-test-{api}-{int(stream)}-{len(ids)}"
        ids.append(request_id)
        status, headers, reply = post(
            base + path,
            {**body, "model": alias, "stream": stream},
            {"x-request-id": request_id, "anthropic-version": "2023-06-01"},
        )
        text = reply.decode()
        seen = text + json.dumps(headers)
        assert not _leaks(seen), (alias, status, text)
        code = int(alias.split(":")[1])
        inband = "status" not in alias
        # an in-band error in a stream comes after the first byte, and a failed Response is
        # a Response: both a 200; any other error has the upstream's status (422: a 400)
        ok = inband and (stream or api == "responses")
        assert status == (200 if ok else {422: 400}.get(code, code)), (alias, status, text)
        # a 4xx keeps its words, scrubbed; a 5xx's (and a failed Response's) are replaced
        if code < 500 and not (inband and api == "responses" and not stream):
            assert "[redacted]" in text, (alias, text)
        else:
            assert "Internal server error" in text, (alias, text)
    log = _log_after(proc, ids)
    assert not _leaks(log), [line for line in log.splitlines() if _leaks(line)]
    errors = [
        line.get("error") or ""
        for line in log_lines(log)
        if any(i in json.dumps(line) for i in ids)
    ]
    if not stream:  # the access line's error field: the scrubbed words
        assert any("[redacted]" in e for e in errors), errors


def _log_after(proc: Proc, ids: list[str], timeout: float = 5.0) -> str:
    """The gateway's log once the access lines of ``ids`` are in it (flushed on a timer)."""
    deadline = time.monotonic() + timeout
    while True:
        out = proc.output()
        if all(f'"{i}"' in out for i in ids) or time.monotonic() > deadline:
            return out
        time.sleep(0.1)
