"""SIGHUP under load: the real gateway re-reads its config file while eight connections keep
sending requests (buffered and streamed) for two clients.

The file is rewritten and SIGHUP sent five times: a client added, a client's key changed, a
file that is not TOML, a file naming an unset variable, a client removed together with the
anonymous keys' variable changed. No request fails but those presenting a key the last reload
retired (401, and only once that reload was asked for); no connection is dropped; every
stream ends with ``message_stop``; a new client's key works as soon as the reload is logged;
a refused file keeps the previous table and logs why; the metric counts each outcome.
Bounded: eight threads, a few hundred requests, each step waiting on a count of answers.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.ops.workers import worker_setup
from tests.conftest import stub_config
from tests.logs import log_lines, matching, wait_for_line
from tests.procs import Proc, free_port, get, post, start_gateway, wait_http
from tests.waits import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

ENV = {"ANON_KEYS": "anon-1", "ANON2": "anon-2", "ALICE_KEY": "alice-1"}
WORKERS = 8  # connections at once: four for alice's key, four for bob's
STEP = 12  # answers between two reloads


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _client(name: str, key: str) -> str:
    return f'\n[[clients]]\nname = "{name}"\n{key}\n'


@dataclass
class Answer:
    key: str
    started: float
    ended: float
    status: int
    stream: bool
    complete: bool  # a message, or a stream ending in message_stop


class Load:
    """WORKERS threads, each on one keep-alive connection, alternating a buffered request and
    a streamed one (the stub's ``slow`` scenario: about a second) with its role's current key."""

    def __init__(self, port: int, keys: dict[str, str]) -> None:
        self.port = port
        self.keys = keys  # role -> the key its workers send now
        self.answers: list[Answer] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        roles = ["alice", "bob"] * (WORKERS // 2)
        self.threads = [
            threading.Thread(target=self._run, args=(r, i)) for i, r in enumerate(roles)
        ]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def done(self) -> int:
        with self.lock:
            return len(self.answers)

    def wait_more(self, count: int) -> None:
        target = self.done() + count
        wait_until(
            lambda: self.done() >= target or self.errors, f"{count} more answers", timeout=30
        )

    def _run(self, role: str, i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        n = 0
        try:
            while not self.stop.is_set() and n < 200:
                n += 1
                stream = (n + i) % 2 == 0
                key = self.keys[role]
                body = {
                    "model": "m-slow:20" if stream else "m-ok",
                    "max_tokens": 64,
                    "stream": stream,
                    "messages": [{"role": "user", "content": f"{role} {n}"}],
                }
                started = time.monotonic()
                conn.request(
                    "POST",
                    "/llm/v1/messages",
                    json.dumps(body),
                    {
                        "x-api-key": key,
                        "content-type": "application/json",
                        "anthropic-version": "2023-06-01",
                    },
                )
                resp = conn.getresponse()
                raw = resp.read()
                ended = time.monotonic()
                if resp.status != 200:
                    complete = False
                elif stream:
                    complete = raw.rstrip().endswith(b'data: {"type":"message_stop"}')
                else:
                    complete = json.loads(raw).get("type") == "message"
                with self.lock:
                    self.answers.append(Answer(key, started, ended, resp.status, stream, complete))
        except Exception as exc:  # a dropped connection, a timeout: what must not happen
            self.errors.append(f"{role}[{i}]: {type(exc).__name__}: {exc}")
        finally:
            conn.close()


def _metric(base: str, key: str, name: str, **labels: str) -> float:
    _, _, raw = get(f"{base}/metrics", headers={"x-api-key": key})
    return sum(
        s.value
        for f in text_string_to_metric_families(raw.decode())
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def _ask(base: str, key: str) -> int:
    body = {"model": "m-ok", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    return post(f"{base}/llm/v1/messages", body, headers={"x-api-key": key})[0]


def test_sighup_under_load(stub_url: str, tmp_path: Path) -> None:
    head = stub_config(
        stub_url, extra_server='api_keys_env = "ANON_KEYS"', models=("ok", "slow:20")
    )
    alice = _client("alice", 'key_env = "ALICE_KEY"')
    bob = _client("bob", f'key_sha256 = "{_sha("bob-1")}"')
    carol = _client("carol", f'key_sha256 = "{_sha("carol-1")}"')
    proc, base = start_gateway(head + alice + bob, tmp_path, env=ENV)
    path = next(tmp_path.glob("gateway-*.toml"))
    retired: dict[str, float] = {}  # key -> when the reload retiring it was asked for
    seen: dict[str, float] = {}  # key -> when that reload was logged
    asked: list[float] = []  # when each SIGHUP was sent

    def reload(text: str, event: str, nth: int, retire: tuple[str, ...] = ()) -> dict[str, Any]:
        path.write_text(text)
        now = time.monotonic()
        for key in retire:
            retired[key] = now
        asked.append(now)
        proc.signal(signal.SIGHUP)
        line = _nth_line(proc, event, nth)
        for key in retire:
            seen[key] = time.monotonic()
        return line

    try:
        with Load(int(base.rsplit(":", 1)[1]), {"alice": "alice-1", "bob": "bob-1"}) as load:
            load.wait_more(STEP)
            # 1. a client added: its key works at once
            line = reload(head + alice + bob + carol, "config_reloaded", 1)
            assert (line["clients"], line["added"], line["removed"]) == (3, ["carol"], [])
            assert _ask(base, "carol-1") == 200
            load.wait_more(STEP)
            # 2. bob's key changed (in the file: key_sha256)
            bob2 = _client("bob", f'key_sha256 = "{_sha("bob-2")}"')
            line = reload(head + alice + bob2 + carol, "config_reloaded", 2, retire=("bob-1",))
            assert line["changed"] == ["bob"] and line["needs_restart"] == []
            load.keys["bob"] = "bob-2"
            load.wait_more(STEP)
            # 3. not TOML: the previous table stays
            line = reload(head + alice + "[[clients]\nname =", "config_reload_failed", 1)
            assert "not valid TOML" in line["detail"] and str(path) in line["detail"]
            assert _ask(base, "carol-1") == 200 and _ask(base, "bob-2") == 200
            load.wait_more(STEP)
            # 4. a variable the file names is unset: refused, no key's value in the line
            nope = _client("dave", 'key_env = "NO_SUCH_KEY_VAR"')
            line = reload(head + alice + bob2 + carol + nope, "config_reload_failed", 2)
            assert "NO_SUCH_KEY_VAR is not set" in line["detail"]
            assert _ask(base, "carol-1") == 200
            load.wait_more(STEP)
            # 5. alice removed and the anonymous keys' variable changed, a port changed too
            # (not applied: it needs a restart)
            head2 = head.replace('api_keys_env = "ANON_KEYS"', 'api_keys_env = "ANON2"')
            head2 = head2.replace("connect_timeout = 2", "connect_timeout = 3")
            line = reload(head2 + bob2 + carol, "config_reloaded", 3, retire=("alice-1", "anon-1"))
            assert (line["removed"], line["server_keys_changed"]) == (["alice"], True)
            assert line["needs_restart"] == ["upstreams", "models"]
            load.keys["alice"] = "carol-1"
            assert _ask(base, "anon-2") == 200 and _ask(base, "anon-1") == 401
            load.wait_more(STEP)
        assert not load.errors, load.errors
        answers = load.answers
    finally:
        proc.stop()
    out = proc.output()
    assert len(answers) >= 5 * STEP
    failed = [a for a in answers if a.status != 200 or not a.complete]
    for a in failed:
        # only a retired key, refused (401), and only after its reload was asked for
        assert a.status == 401 and a.key in retired and a.ended > retired[a.key], a
    for key, when in seen.items():
        late = [a for a in answers if a.key == key and a.started > when]
        assert all(a.status == 401 for a in late), (key, late)
    # streams were in flight across the reloads, and each of them ended whole
    spanning = [a for a in answers if a.stream and any(a.started < t < a.ended for t in asked)]
    assert spanning and all(
        a.status == 200 and a.complete for a in spanning if a.key not in retired
    )
    assert matching(log_lines(out), "config_needs_restart")[0]["tables"] == ["upstreams", "models"]
    for secret in ("alice-1", "bob-1", "bob-2", "carol-1", "anon-1", "anon-2"):
        assert secret not in out


def _nth_line(proc: Proc, event: str, nth: int) -> dict[str, Any]:
    wait_for_line(
        proc.output,
        lambda ln: len(matching(log_lines(proc.output()), event)) >= nth,
        f"{event} #{nth}",
        timeout=15,
    )
    return matching(log_lines(proc.output()), event)[nth - 1]


def test_reloads_are_counted(stub_url: str, tmp_path: Path) -> None:
    text = stub_config(stub_url, extra_server='api_keys_env = "ANON_KEYS"', models=("ok",))
    proc, base = start_gateway(text, tmp_path, env=ENV)
    path = next(tmp_path.glob("gateway-*.toml"))
    count: Callable[[str], float] = lambda result: _metric(  # noqa: E731
        base, "anon-1", "llm_gateway_config_reloads_total", result=result
    )
    try:
        assert (count("ok"), count("failed")) == (0, 0)
        path.write_text(text + _client("erin", f'key_sha256 = "{_sha("erin-1")}"'))
        proc.signal(signal.SIGHUP)
        _nth_line(proc, "config_reloaded", 1)
        assert _ask(base, "erin-1") == 200
        path.unlink()
        proc.signal(signal.SIGHUP)
        line = _nth_line(proc, "config_reload_failed", 1)
        assert line["detail"] == f"{path}: cannot read: No such file or directory"
        assert _ask(base, "erin-1") == 200
        assert (count("ok"), count("failed")) == (1, 1)
    finally:
        proc.stop()


def test_the_workers_supervisor_forwards_sighup(stub_url: str, tmp_path: Path) -> None:
    """--workers 2: SIGHUP to the supervisor (systemd's $MAINPID) reaches every worker; one
    sent while the workers start stops none of them."""
    port = free_port()
    path = tmp_path / "gw.toml"
    text = stub_config(stub_url, extra_server='api_keys_env = "ANON_KEYS"', models=("ok",))
    path.write_text(text)
    args = ["--config", str(path), "--port", str(port), "--workers", "2"]
    proc = Proc([sys.executable, "-m", "gateway", *args], env=ENV)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_line(proc.output, lambda ln: ln.get("event") == "workers_started", timeout=15)
        proc.signal(signal.SIGHUP)  # workers just started: not a stop
        wait_http(base + "/health", proc=proc.popen)
        listening = lambda: {ln["pid"] for ln in matching(log_lines(proc.output()), "listening")}  # noqa: E731
        wait_until(lambda: len(listening()) == 2, "both workers listening", timeout=20)
        path.write_text(text + _client("frank", f'key_sha256 = "{_sha("frank-1")}"'))
        proc.signal(signal.SIGHUP)
        wait_until(
            lambda: (
                {ln["pid"] for ln in matching(log_lines(proc.output()), "config_reloaded")}
                == listening()
            ),
            "config_reloaded from each worker",
            timeout=15,
        )
        for _ in range(12):  # a new connection each time: the kernel spreads them
            status = post(
                f"{base}/llm/v1/messages",
                {"model": "m-ok", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]},
                headers={"x-api-key": "frank-1", "connection": "close"},
            )[0]
            assert status == 200
        assert _metric(base, "anon-1", "llm_gateway_config_reloads_total", result="ok") == 2
        assert not matching(log_lines(proc.output()), "worker_replaced")
        assert proc.popen.poll() is None
    finally:
        assert proc.stop() == 0


def test_a_worker_starts_with_sighup_ignored() -> None:
    """A SIGHUP the supervisor forwards while a worker is still importing (before its
    handler) is ignored, not the default action (the end of the process): the disposition
    set before exec stays through it."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        preexec_fn=functools.partial(worker_setup, os.getpid()),
    )
    try:
        status = Path(f"/proc/{child.pid}/status").read_text()
        ignored = int(
            next(ln for ln in status.splitlines() if ln.startswith("SigIgn:")).split()[1], 16
        )
        assert ignored & (1 << (signal.SIGHUP - 1))
        child.send_signal(signal.SIGHUP)
        assert child.poll() is None
    finally:
        assert child.stdin is not None
        child.stdin.close()
        assert child.wait(10) == 0
