"""The fleet, end to end: the real gateway against scripted replicas (threads of this test,
on loopback addresses).

* Active health probes: a replica failing its health route gets no client request, comes
  back once its probe passes, and goes again when it fails again (while it still answers
  requests: only the probes can have kept it out).
* DNS discovery: the gateway runs as ``python -m tests.fake_dns_gateway`` (the gateway with
  the answers of its resolver read from a file this test writes; see that module), on a name
  whose addresses are 127.0.0.1, .2 and .3 with one port. Addresses join and leave, a
  leaving replica's requests in flight finish, and a failed resolution keeps the set.

Which replica a session lands on is predicted with the gateway's own rendezvous function
over the replica URLs; every wait is for a state the gateway reports (a metric), bounded.
"""

from __future__ import annotations

import http.server
import json
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gateway.upstream.replicas import rendezvous
from tests.fake_dns_gateway import write_answers
from tests.procs import Proc, free_port, metric, post, wait_http
from tests.stub_upstream import TEXT, USAGE, completion
from tests.waits import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SESSIONS = 16


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Replica

    def do_GET(self) -> None:
        if self.path == "/health":
            self.server.probes += 1
            self._reply(self.server.health, b'{"status": "ok"}')
        else:
            self._reply(404, b"{}")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.server.chats.append(
            {
                "host": self.headers.get("Host"),
                "model": body.get("model"),
                "first": body["messages"][-1].get("content"),
            }
        )
        if body.get("model") == "slow":
            self.server.gate.wait(60)
        reply = completion(
            body.get("model", ""), {"role": "assistant", "content": "".join(TEXT)}, "stop", USAGE
        )
        self._reply(200, json.dumps(reply).encode())

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _Replica(http.server.ThreadingHTTPServer):
    """A scripted engine: GET /health answers ``health``; chat requests are kept in
    ``chats`` and answered at once (model ``slow``: once ``gate`` is set)."""

    daemon_threads = True

    def __init__(self, host: str, port: int = 0) -> None:
        super().__init__((host, port), _Handler)
        self.health = 200
        self.probes = 0
        self.chats: list[dict[str, Any]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def stop(self) -> None:
        self.gate.set()
        self.shutdown()
        self.server_close()


def _sessions(base: str, sids: list[str], model: str = "m") -> None:
    """One buffered request per session, 8 at once; every one must be a 200."""

    def one(sid: str) -> None:
        body = {
            "model": model,
            "max_tokens": 16,
            "messages": [{"role": "user", "content": f"hello from {sid}"}],
        }
        status, _, reply = post(f"{base}/llm/v1/messages", body, {"x-claude-code-session-id": sid})
        assert status == 200, (sid, status, reply[:300])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, sids))


def _home(sid: str, urls: list[str]) -> str:
    """The replica URL the gateway's rendezvous hashing picks for a session, all healthy."""
    return urls[rendezvous(f"h:{sid}".encode(), urls)[0]]


def _config(upstream: str) -> str:
    return f"""
[upstreams.fleet]
{upstream}

[[models]]
name = "m"
upstream = "fleet"
upstream_model = "ok"

[[models]]
name = "slow"
upstream = "fleet"
upstream_model = "slow"
"""


# ---------------------------------------------------------------- active health probes


@pytest.fixture
def pair() -> Iterator[tuple[_Replica, _Replica]]:
    a, b = _Replica("127.0.0.1"), _Replica("127.0.0.1")
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def test_a_replica_failing_its_health_route_gets_no_request_until_it_passes(
    pair: tuple[_Replica, _Replica], gateway_factory: Callable[..., tuple[Proc, str]]
) -> None:
    a, b = pair
    b.health = 503  # llama.cpp's server while it loads the model
    urls = [f"http://127.0.0.1:{r.port}/v1" for r in pair]
    _, base = gateway_factory(
        _config(f"base_urls = {json.dumps(urls)}\nhealth_interval = 0.2\nhealth_timeout = 1.0")
    )
    wait_http(f"{base}/ready")
    b_label = f"127.0.0.1:{b.port}"
    sids = [f"probe-session-{i}" for i in range(SESSIONS)]
    on_b = [s for s in sids if _home(s, urls) == urls[1]]
    assert on_b  # some sessions are b's when it is healthy

    # failing its health route from the start: no client request reaches it
    _sessions(base, sids)
    assert b.chats == [] and len(a.chats) == SESSIONS
    assert b.probes >= 1
    assert metric(base, "llm_gateway_upstream_probes_total", replica=b_label, outcome="status") >= 1
    assert metric(base, "llm_gateway_upstream_replica_healthy", replica=b_label) == 0

    # its health route passes: back without a client request as its trial
    b.health = 200
    wait_until(
        lambda: metric(base, "llm_gateway_upstream_replica_healthy", replica=b_label) == 1,
        "the replica is back after a passing probe",
        timeout=15,
    )
    assert b.chats == []
    a.chats.clear()
    _sessions(base, sids)
    assert sorted(c["first"] for c in b.chats) == sorted(f"hello from {s}" for s in on_b)

    # failing again, while it still answers requests: the probes alone take it out
    b.health = 503
    wait_until(
        lambda: metric(base, "llm_gateway_upstream_replica_healthy", replica=b_label) == 0,
        "the replica is ejected after a failing probe",
        timeout=15,
    )
    b.chats.clear()
    _sessions(base, sids)
    assert b.chats == []
    assert metric(base, "llm_gateway_upstream_probes_total", replica=b_label, outcome="ok") >= 1


# ---------------------------------------------------------------- DNS discovery


@pytest.fixture
def trio() -> Iterator[list[_Replica]]:
    """Replicas on 127.0.0.1, .2 and .3 with one port (loopback, all of 127/8 on Linux)."""
    for _ in range(5):
        first = _Replica("127.0.0.1")
        started = [first]
        try:
            started += [_Replica(f"127.0.0.{n}", first.port) for n in (2, 3)]
        except OSError:  # the port is taken on another address: another port
            for r in started:
                r.stop()
            continue
        try:
            yield started
        finally:
            for r in started:
                r.stop()
        return
    pytest.fail("no port free on 127.0.0.1, .2 and .3")


def _dns_gateway(tmp_path: Path, config: str, answers: Path) -> tuple[Proc, str]:
    port = free_port()
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(config)
    proc = Proc(
        [sys.executable, "-m", "tests.fake_dns_gateway", "--config", str(cfg), "--port", str(port)],
        env={"FAKE_DNS_FILE": str(answers), "XDG_STATE_HOME": str(tmp_path / "state")},
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/ready", proc=proc.popen)
    except Exception:
        proc.stop()
        raise RuntimeError("gateway did not start:\n" + proc.output()) from None
    return proc, f"http://127.0.0.1:{port}"


def test_replicas_follow_the_dns_answer(trio: list[_Replica], tmp_path: Path) -> None:
    port = trio[0].port
    name = "fleet.test"
    answers = tmp_path / "dns.json"
    url = {n: f"http://127.0.0.{n}:{port}/v1" for n in (1, 2, 3)}
    by_url = {url[n]: trio[n - 1] for n in (1, 2, 3)}
    write_answers(answers, {name: ["127.0.0.2", "127.0.0.1"]})
    proc, base = _dns_gateway(
        tmp_path,
        _config(f'base_url = "http://{name}:{port}/v1"\ndiscover = "dns"\nresolve_interval = 0.2'),
        answers,
    )
    try:

        def replicas() -> float:
            return metric(base, "llm_gateway_upstream_replicas", upstream="fleet")

        sids = [f"dns-session-{i}" for i in range(SESSIONS)]

        # two addresses: sessions where rendezvous puts them, Host the name's
        assert replicas() == 2
        two = [url[1], url[2]]
        _sessions(base, sids)
        for u, r in by_url.items():
            want = sorted(f"hello from {s}" for s in sids if u in two and _home(s, two) == u)
            assert sorted(c["first"] for c in r.chats) == want
        assert {c["host"] for r in trio for c in r.chats} == {f"{name}:{port}"}

        # a third address joins: it takes its sessions, every other session stays put
        write_answers(answers, {name: ["127.0.0.1", "127.0.0.2", "127.0.0.3"]})
        wait_until(lambda: replicas() == 3, "the third address joins", timeout=15)
        for r in trio:
            r.chats.clear()
        three = [url[1], url[2], url[3]]
        _sessions(base, sids)
        moved = [s for s in sids if _home(s, three) != _home(s, two)]
        assert moved and all(_home(s, three) == url[3] for s in moved)
        assert sorted(c["first"] for c in trio[2].chats) == sorted(f"hello from {s}" for s in moved)

        # .2 leaves while three requests on it are in flight: they finish, nothing new goes
        mine = [s for s in (f"slow-{i}" for i in range(200)) if _home(s, three) == url[2]][:3]
        for r in trio:
            r.chats.clear()
        trio[1].gate.clear()
        with ThreadPoolExecutor(3) as pool:
            slow = pool.map(lambda s: _sessions(base, [s], model="slow"), mine)
            wait_until(lambda: len(trio[1].chats) == 3, "the slow requests reach .2", timeout=15)
            write_answers(answers, {name: ["127.0.0.1", "127.0.0.3"]})
            wait_until(lambda: replicas() == 2, "the address leaves", timeout=15)
            _sessions(base, sids)
            assert len(trio[1].chats) == 3  # only the slow ones
            trio[1].gate.set()
            list(slow)  # every slow request a 200 (asserted inside)
        # ... answered by .2 itself: none was cut and sent again to another replica
        assert [c["model"] for r in (trio[0], trio[2]) for c in r.chats].count("slow") == 0

        # the name stops resolving: the set stays, counted, requests still served
        write_answers(answers, {})
        wait_until(
            lambda: (
                metric(
                    base,
                    "llm_gateway_upstream_resolutions_total",
                    upstream="fleet",
                    outcome="failed",
                )
                >= 2
            ),
            "failed resolutions are counted",
            timeout=15,
        )
        assert replicas() == 2
        for r in trio:
            r.chats.clear()
        _sessions(base, sids)
        assert trio[1].chats == [] and len(trio[0].chats) + len(trio[2].chats) == SESSIONS
        assert "upstream_resolve_failed" in proc.output()
    finally:
        proc.stop()


def test_a_name_with_no_address_at_start_is_a_529_until_one_appears(
    trio: list[_Replica], tmp_path: Path
) -> None:
    answers = tmp_path / "dns.json"
    write_answers(answers, {})
    port = trio[0].port
    proc, base = _dns_gateway(
        tmp_path,
        _config(
            f'base_url = "http://fleet.test:{port}/v1"\ndiscover = "dns"\nresolve_interval = 0.2'
        ),
        answers,
    )
    try:
        body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
        status, _, reply = post(f"{base}/llm/v1/messages", body)
        assert status == 529, reply
        err = json.loads(reply)
        assert err["type"] == "error" and err["error"]["type"] == "overloaded_error"
        assert "fleet.test" not in reply.decode() and "127.0.0" not in reply.decode()
        write_answers(answers, {"fleet.test": ["127.0.0.3"]})
        wait_until(
            lambda: metric(base, "llm_gateway_upstream_replicas", upstream="fleet") == 1,
            "the address appears",
            timeout=15,
        )
        status, _, reply = post(f"{base}/llm/v1/messages", body)
        assert status == 200, reply
        assert len(trio[2].chats) == 1
    finally:
        proc.stop()
