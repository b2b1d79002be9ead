"""Three scripted replicas of one upstream behind one model name, default settings.

Which replica served a request is read back from the replicas themselves: each stub records
the chat body the gateway sent it, and each turn's body is its own (the session's system
prompt, the turn's number of assistant messages). Sessions
are named three ways (Claude Code's header, ``metadata.user_id``, nothing: the stable prefix)
and each sends several turns, so affinity is measured over what a session really repeats.
"""

from __future__ import annotations

import http.server
import json
import re
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.procs import REPO, Proc, free_port, get, metric, post, wait_http

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SESSIONS = 45
TURNS = 4


def _stub() -> tuple[Proc, str]:
    port = free_port()
    proc = Proc([sys.executable, str(REPO / "tests" / "stub_upstream.py"), str(port)])
    wait_http(f"http://127.0.0.1:{port}/health", proc=proc.popen)
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture
def stubs() -> Iterator[list[tuple[Proc, str]]]:
    started = [_stub() for _ in range(3)]
    try:
        yield started
    finally:
        for proc, _ in started:
            proc.stop()


class _Unavailable(http.server.BaseHTTPRequestHandler):
    """A replica answering 503 to everything."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"error": {"message": "overloaded", "code": 503}}'
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def unavailable() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _config(urls: list[str]) -> str:
    listed = ", ".join(f'"{u}/v1"' for u in urls)
    return f"""
[upstreams.fleet]
base_urls = [{listed}]

[[models]]
name = "m"
upstream = "fleet"
upstream_model = "ok"
"""


def _session_request(s: int, turn: int) -> tuple[dict[str, Any], dict[str, str]]:
    """Turn ``turn`` of session ``s``: a growing conversation, named one of three ways."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {s}: start"}]
    for t in range(turn):
        messages += [
            {"role": "assistant", "content": f"done {t}"},
            {"role": "user", "content": f"next {t}"},
        ]
    body: dict[str, Any] = {
        "model": "m",
        "max_tokens": 16,
        "system": f"you are agent {s}",
        "messages": messages,
        "stream": turn % 2 == 1,
    }
    headers: dict[str, str] = {}
    if s % 3 == 0:
        headers["x-claude-code-session-id"] = f"cc-session-{s}"
    elif s % 3 == 1:
        body["metadata"] = {"user_id": f"user_{s}_account__session_{s}"}
    return body, headers


def _run(base: str) -> dict[int, list[tuple[int, int]]]:
    """Every session's turns (8 sessions at once); -> session -> its (session, turn)s."""

    def session(s: int) -> list[tuple[int, int]]:
        turns = []
        for turn in range(TURNS):
            body, headers = _session_request(s, turn)
            status, _, reply = post(f"{base}/llm/v1/messages", body, headers)
            assert status == 200, (s, turn, status, reply[:300])
            if body["stream"]:
                assert b"event: error" not in reply and b"message_stop" in reply, reply[-300:]
            turns.append((s, turn))
        return turns

    with ThreadPoolExecutor(8) as pool:
        return dict(enumerate(pool.map(session, range(SESSIONS))))


def _served(stub_urls: list[str]) -> dict[tuple[int, int], int]:
    """(session, turn) -> index of the replica that answered it."""
    out = {}
    for i, url in enumerate(stub_urls):
        status, _, body = get(f"{url}/_requests")
        assert status == 200
        for req in json.loads(body):
            chat = req["body"]
            agent = re.search(r"you are agent (\d+)", json.dumps(chat))
            if agent and req["path"].endswith("/chat/completions"):
                turn = sum(1 for m in chat["messages"] if m.get("role") == "assistant")
                out[(int(agent[1]), turn)] = i
    return out


def _clear(stub_urls: list[str]) -> None:
    import urllib.request

    for url in stub_urls:
        urllib.request.urlopen(
            urllib.request.Request(f"{url}/_requests", method="DELETE"), timeout=5
        ).close()


def _placement(
    runs: dict[int, list[tuple[int, int]]], served: dict[tuple[int, int], int]
) -> dict[int, list[int]]:
    return {s: [served[turn] for turn in turns] for s, turns in runs.items()}


def test_sessions_stay_on_one_replica_and_survive_one_refusing_connections(
    stubs: list[tuple[Proc, str]], gateway_factory: Callable[..., tuple[Proc, str]]
) -> None:
    urls = [url for _, url in stubs]
    _, base = gateway_factory(_config(urls))

    # healthy: sessions keep to one replica, the work spreads, nobody sees an error
    before = _placement(_run(base), _served(urls))
    _clear(urls)
    home = {s: Counter(r).most_common(1)[0][0] for s, r in before.items()}
    kept = sum(1 for r in before.values() if len(set(r)) == 1)
    assert kept >= 0.9 * SESSIONS, before
    shares = Counter(i for r in before.values() for i in r)
    total = sum(shares.values())
    assert all(shares[i] >= 0.15 * total for i in range(3)), shares

    # replica 2 goes away: connections to it are refused
    stubs[2][0].stop()
    after = _placement(_run(base), _served(urls[:2]))
    others = [s for s in before if home[s] != 2]
    stayed = sum(1 for s in others if set(after[s]) == {home[s]})
    assert stayed >= 0.9 * len(others), (home, after)
    assert all(set(r) <= {0, 1} for r in after.values())
    label = urls[2].split("://")[1]
    assert metric(base, "llm_gateway_upstream_replica_healthy", replica=label) == 0
    assert metric(base, "llm_gateway_upstream_retries_total", upstream="fleet") >= 1
    assert (
        metric(
            base,
            "llm_gateway_upstream_replica_requests_total",
            replica=label,
            outcome="connect_error",
        )
        >= 1
    )


def test_a_replica_answering_503_to_everything_costs_no_client_an_error(
    stubs: list[tuple[Proc, str]],
    unavailable: str,
    gateway_factory: Callable[..., tuple[Proc, str]],
) -> None:
    urls = [stubs[0][1], stubs[1][1], unavailable]
    _, base = gateway_factory(_config(urls))
    runs = _run(base)  # every reply a 200 (asserted inside)
    served = _served(urls[:2])
    assert all(turn in served for turns in runs.values() for turn in turns)
    label = unavailable.split("://")[1]
    assert (
        metric(
            base, "llm_gateway_upstream_replica_requests_total", replica=label, outcome="status_5xx"
        )
        >= 1
    )
    assert metric(base, "llm_gateway_upstream_retries_total", upstream="fleet") >= 1


def test_a_replica_cutting_every_stream_halfway_costs_no_client_a_word(
    stubs: list[tuple[Proc, str]], gateway_factory: Callable[..., tuple[Proc, str]]
) -> None:
    """Done when: one replica cutting every stream halfway: every client stream ends
    well-formed, ``end_turn``, with the whole answer; 0 error events."""
    from tests import sdk
    from tests.stub_upstream import TEXT

    stubs[2][0].stop()
    port = int(stubs[2][1].rsplit(":", 1)[1])
    cutter = Proc([sys.executable, str(REPO / "tests" / "stub_upstream.py"), str(port), "cut-all"])
    try:
        wait_http(f"{stubs[2][1]}/health", proc=cutter.popen)
        urls = [url for _, url in stubs]
        _, base = gateway_factory(_config(urls))
        client = sdk.client(f"{base}/llm", api_key="k", max_retries=0)

        def session(s: int) -> list[tuple[str, str | None]]:
            got = []
            for turn in range(TURNS):
                body, headers = _session_request(s, turn)
                with client.messages.stream(
                    model="m",
                    max_tokens=16,
                    system=body["system"],
                    messages=body["messages"],
                    extra_headers=headers,
                    **({"metadata": body["metadata"]} if "metadata" in body else {}),
                ) as stream:
                    kinds = [event.type for event in stream]
                    message = stream.get_final_message()
                assert "error" not in kinds and kinds[-1] == "message_stop", kinds
                got.append(
                    (
                        "".join(b.text for b in message.content if b.type == "text"),
                        message.stop_reason,
                    )
                )
            return got

        with ThreadPoolExecutor(8) as pool:
            replies = [r for got in pool.map(session, range(SESSIONS)) for r in got]
        assert replies == [("".join(TEXT), "end_turn")] * len(replies)
        _, _, stats = get(f"{stubs[2][1]}/_stats")
        assert json.loads(stats)["cut"] >= 1  # the cutting replica did cut streams
        continued = [
            r
            for r in json.loads(get(f"{urls[0]}/_requests")[2])
            + json.loads(get(f"{urls[1]}/_requests")[2])
            if r["body"]["messages"][-1]["role"] == "assistant"
            and r["body"]["messages"][-1]["content"] == TEXT[0]
        ]
        assert continued  # continuations, their prefill the text before the cut
        assert all(r["body"]["stream"] is True for r in continued)
    finally:
        cutter.stop()
        sdk.close_all()


def _raw_post(
    base: str, path: str, body: dict[str, Any], session: bytes
) -> tuple[int, dict[str, str], bytes]:
    """POST with the session header's raw bytes (no client library encodes them for us)."""
    import socket

    host, port = base.split("://")[1].split(":")
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head + b"x-claude-code-session-id: " + session + b"\r\n\r\n" + data)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    status_line, _, rest = reply.partition(b"\r\n")
    raw_headers, _, payload = rest.partition(b"\r\n\r\n")
    headers = {}
    for line in raw_headers.decode("latin-1").split("\r\n"):
        name, _, value = line.partition(": ")
        headers[name.lower()] = value
    return int(status_line.split()[1]), headers, payload


# raw header bytes: latin-1, bytes no text has, UTF-8 (the control)
NOT_UTF8 = [b"caf\xe9-1", b"\xff\xfe\x80\x81", "s\u00e9ance".encode()]


def test_a_session_header_that_is_not_utf8_is_a_session_like_any(
    stubs: list[tuple[Proc, str]], gateway_factory: Callable[..., tuple[Proc, str]]
) -> None:
    """It was a 500 and a traceback in the log on every request (the key could not be
    encoded to be hashed): now every turn is served, each session's on one replica."""
    urls = [url for _, url in stubs]
    proc, base = gateway_factory(_config(urls))
    failed = []
    for agent, session in enumerate(NOT_UTF8, start=7):
        turns = []
        for turn in range(3):
            body, _ = _session_request(agent, turn)
            body["stream"] = False
            chat = {
                "model": "m",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": f"turn {turn}"}],
            }
            for path, payload in (("/llm/v1/messages", body), ("/llm/v1/chat/completions", chat)):
                status, _, _ = _raw_post(base, path, payload, session)
                if status != 200:
                    failed.append((session, path, status))
                elif path.endswith("/messages"):
                    turns.append((agent, turn))
        served = _served(urls)
        assert len({served[t] for t in turns}) <= 1, session  # kept to one replica
    assert failed == []
    log = proc.output()
    assert "Traceback" not in log and "unhandled_error" not in log
