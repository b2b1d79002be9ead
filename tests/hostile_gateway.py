"""The real gateway in front of tests/hostile_upstream.py, and a client that reads what it
got: shared by tests/e2e/test_hostile_upstream.py and tests/e2e/test_no_misdelivery.py.

* :func:`hostile_config` routes a model ``h-<scenario>`` to the upstream's scenario of that name
  (the hostile upstream picks its reply by the request's ``model``).
* Each request's prompt is a fresh token (:func:`new_token`); a normal reply's text is
  ``reply for <token>``, so a client can tell its reply from another's (:data:`TOKEN_RE`).
* The fixtures: ``hostile`` (module scope: the upstream process, its root URL) and
  ``own_gateway`` (gateways a test starts for itself, stopped at its end). A test module
  imports them to use them.
"""

from __future__ import annotations

import http.client
import json
import random
import re
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.procs import REPO, Proc, free_port, start_gateway, wait_http
from tests.waits import wait_until

KEY = "sk-hostile+Key=7f3a9b2c"  # '+' and '=' so that its URL-encoded form differs
KEY_ENV = "HOSTILE_UPSTREAM_KEY"
SCENARIOS = (
    "ok",
    "ok:300",
    "ok@noecho",
    "double",
    "double@noecho",
    "double-late:3",
    "overrun:30",
    "overrun:30@noecho",
    "cl-te",
    "http10-chunked",
    "bad-status:000",
    "bad-status:099",
    "bad-status:101",
    "bad-header:space-name",
    "bad-header:ctl-name",
    "bad-header:ctl-value",
    "bad-header:ws-value",
    "bad-header:te-ctl",
    "bad-header:leak",
    "cl30",
    "bare-lf",
    "flood-1xx",
    "drip-head:500",
    "drip-1xx:500",
    "drip-body:500",
    "drip-stream:500",
    "drip-trailer:500",
    "gzip-bomb",
    "size-bomb:512",
    "leak:400",
    "leak:413",
    "leak:422",
    "leak:429",
    "leak:500",
    "leak-inband:400",
    "leak-inband:500",
    "leak-disguised:escaped",
    "leak-disguised:event",
    "leak-disguised:type",
    "leak-disguised:text",
    "wrong-id",
    "reset",
    "malformed-head",
    "cut-body",
    "nan-inband",
)

# api -> (path under the prefix, does it stream)
APIS = {
    "messages": ("/v1/messages", True),
    "chat": ("/v1/chat/completions", True),
    "completions": ("/v1/completions", True),
    "embeddings": ("/v1/embeddings", False),
    "responses": ("/v1/responses", True),
}


# --- processes -------------------------------------------------------------------------


def hostile_config(
    upstream_url: str, *, upstream_extra: str = "", header: float = 3.0, idle: float = 3.0
) -> str:
    text = f"""
[server]
host = "127.0.0.1"
port = 8080
prefix = "/llm"

[upstreams.hostile]
base_url = "{upstream_url}/v1"
api_key_env = "{KEY_ENV}"
connect_timeout = 2
header_timeout = {header}
idle_timeout = {idle}
{upstream_extra}
"""
    for name in SCENARIOS:
        text += (
            f'\n[[models]]\nname = "h-{name}"\nupstream = "hostile"\nupstream_model = "{name}"\n'
        )
    return text


@dataclass
class Gateway:
    proc: Proc
    root: str  # http://127.0.0.1:PORT

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.root.removeprefix("http://").split(":")
        return host, int(port)

    def log(self, *, flushed: bool = False) -> str:
        """stderr so far; ``flushed``: once every line logged until now is written (info
        lines are flushed every 0.5 s, in order: a marker request's access line comes last)."""
        if not flushed:
            return self.proc.output()
        with urllib.request.urlopen(self.root + "/llm/v1/models", timeout=10) as resp:
            marker = resp.headers["request-id"]
        wait_until(lambda: marker in self.proc.output(), "the log flushed", every=0.05)
        return self.proc.output()


def start_hostile_gateway(tmp_path: Path, config: str) -> Gateway:
    proc, root = start_gateway(config, tmp_path, env={KEY_ENV: KEY})
    return Gateway(proc, root)


@pytest.fixture(scope="module")
def hostile() -> Iterator[str]:
    """The misbehaving upstream process; yields its root URL."""
    port = free_port()
    proc = Proc([sys.executable, str(REPO / "tests" / "hostile_upstream.py"), str(port)])
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc=proc.popen)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


@pytest.fixture
def own_gateway() -> Iterator[list[Gateway]]:
    """Gateways a test starts for itself; stopped at its end."""
    started: list[Gateway] = []
    yield started
    for gw in started:
        gw.proc.stop()


def upstream_requests(hostile: str) -> list[dict]:
    """Every request the hostile upstream has seen (its ``/_requests``: conn, token, ...)."""
    with urllib.request.urlopen(hostile + "/_requests", timeout=5) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


# --- the client side ---------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    seconds: float

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name), None)

    @property
    def visible(self) -> str:
        """Every byte a client sees (status line, headers, body without chunk framing)."""
        head = f"{self.status} {self.reason}\n" + "".join(f"{k}: {v}\n" for k, v in self.headers)
        return head + self.body.decode("utf-8", "replace")


_counter = iter(range(10**9))
_READ_CAP = 8 * 2**20


TOKEN_RE = re.compile(r"tok-\d+-\d+")


def new_token() -> str:
    return f"tok-{next(_counter)}-{random.randrange(10**9)}"


def request_body(api: str, alias: str, token: str, stream: bool) -> dict:
    if api == "messages":
        return {
            "model": alias,
            "max_tokens": 32,
            "stream": stream,
            "messages": [{"role": "user", "content": token}],
        }
    if api == "chat":
        return {"model": alias, "stream": stream, "messages": [{"role": "user", "content": token}]}
    if api == "completions":
        return {"model": alias, "stream": stream, "prompt": token}
    if api == "embeddings":
        return {"model": alias, "input": token}
    return {"model": alias, "stream": stream, "input": token}


def call(
    gw: Gateway,
    api: str,
    scenario: str,
    *,
    stream: bool = False,
    token: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Reply:
    """POST one request through the gateway; a cut reply returns what arrived."""
    body = json.dumps(request_body(api, f"h-{scenario}", token or new_token(), stream))
    conn = http.client.HTTPConnection(*gw.host_port, timeout=timeout)
    t0 = time.monotonic()
    try:
        conn.request(
            "POST",
            "/llm" + APIS[api][0],
            body=body,
            headers={"content-type": "application/json", **(headers or {})},
        )
        resp = conn.getresponse()
        data = b""
        try:
            while len(data) < _READ_CAP:  # a bomb passed on is not held whole here either
                piece = resp.read(65536)
                if not piece:
                    break
                data += piece
        except (http.client.IncompleteRead, OSError):
            pass  # a cut reply: what arrived is what the client saw
        return Reply(resp.status, resp.reason, resp.getheaders(), data, time.monotonic() - t0)
    finally:
        conn.close()


def sse_events(body: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) of each SSE event."""
    out = []
    for block in body.decode("utf-8", "replace").split("\n\n"):
        name, data = None, []
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            out.append((name, "\n".join(data)))
    return out


def stream_text(api: str, events: list[tuple[str | None, str]]) -> str:
    parts = []
    for _, data in events:
        if data == "[DONE]":
            continue
        doc = json.loads(data)
        if api == "messages":
            if doc.get("type") == "content_block_delta" and doc["delta"]["type"] == "text_delta":
                parts.append(doc["delta"]["text"])
        elif doc.get("choices"):
            parts.append(doc["choices"][0]["delta"].get("content") or "")
    return "".join(parts)


def text_of(api: str, stream: bool, body: bytes) -> str:
    """The reply's text (a success's)."""
    if stream:
        return stream_text(api, sse_events(body))
    doc = json.loads(body)
    if api == "messages":
        return "".join(b.get("text", "") for b in doc["content"])
    return doc["choices"][0]["message"]["content"]  # type: ignore[no-any-return]


@dataclass
class Outcome:
    text: str | None  # the reply's text, when the client got a whole reply
    error: tuple[int | None, str] | None  # the error envelope it got, in-band ones included
    after_end: list[str]  # events after a stream's last one (message_stop, [DONE]): none
    strays: set[str] = field(default_factory=set)  # other requests' tokens in the reply


def outcome(api: str, stream: bool, reply: Reply) -> Outcome:
    err = error_of(api, reply)
    if not stream or reply.status != 200:
        return Outcome(text_of(api, False, reply.body) if err is None else None, err, [])
    events = sse_events(reply.body)
    ends = [
        i
        for i, (name, data) in enumerate(events)
        if (name == "message_stop" if api == "messages" else data == "[DONE]")
    ]
    if not ends:
        return Outcome(None, err, [])
    whole, after = events[: ends[0] + 1], events[ends[0] + 1 :]
    broken = any(name == "error" or data.startswith('{"error"') for name, data in whole)
    return Outcome(None if broken else stream_text(api, whole), err, [d for _, d in after])


def is_broken_upstream(err: tuple[int | None, str] | None) -> bool:
    """The envelope of a broken upstream reply: 500 api_error (server_error on OpenAI
    routes), or the same in-band; never an overload the client would retry."""
    return err is not None and err[0] in (500, None) and err[1] in ("api_error", "server_error")


def error_of(api: str, reply: Reply) -> tuple[int | None, str] | None:
    """(status, error type) of an error reply, an in-band one included (its status is its
    ``code`` on OpenAI routes, None on Anthropic's); None for a success."""

    def from_doc(doc: object, status: int | None) -> tuple[int | None, str] | None:
        if not isinstance(doc, dict) or not isinstance(doc.get("error"), dict):
            return None
        err = doc["error"]
        if api == "messages":
            assert doc.get("type") == "error", doc
            assert isinstance(err.get("message"), str) and err["message"], doc
            return status, err["type"]
        code = err.get("code")
        return (code if isinstance(code, int) else status), str(err.get("type"))

    if reply.status != 200:
        found = from_doc(json.loads(reply.body), reply.status)
        assert found is not None, f"{reply.status} without an error envelope: {reply.body[:300]!r}"
        return found
    ctype = reply.header("content-type") or ""
    if not ctype.startswith("text/event-stream"):
        return from_doc(json.loads(reply.body), None if api == "messages" else 200)
    for name, data in sse_events(reply.body):
        if name == "error" or data.startswith('{"error"'):
            return from_doc(json.loads(data), None)
    return None


def metric_samples(gw: Gateway, name: str) -> dict[str, float]:
    with urllib.request.urlopen(gw.root + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, _, value = line.rpartition(" ")
            out[labels] = float(value)
    return out


def load_plan(n: int, doubles: dict[str, float], ok: str, seed: int) -> list[tuple[str, str, bool]]:
    """``n`` requests (api, scenario, stream): each scenario of ``doubles`` takes its share,
    the rest are ``ok``; seeded, so a failure replays."""
    rnd = random.Random(seed)
    plan = []
    for _ in range(n):
        x = rnd.random()
        scenario = ok
        for name, share in doubles.items():
            if x < share:
                scenario = name
                break
            x -= share
        plan.append((rnd.choice(("messages", "chat")), scenario, rnd.random() < 0.5))
    return plan
