"""systemd ``Type=notify`` and the journal: READY=1 once the port is bound, STOPPING=1 at the
drain, log lines at their syslog priority when stderr is the journal's stream.

The tests play systemd: they own the unix datagram socket named by ``NOTIFY_SOCKET`` (a path,
or ``@name`` in the abstract namespace) and set ``JOURNAL_STREAM`` to the device and inode of
the file the gateway's stderr goes to, as systemd does for a journal stream.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import stub_config
from tests.logs import parse_line
from tests.procs import REPO, free_port

UNIT = REPO / "deploy" / "systemd" / "llm-gateway.service"


def test_unit_is_type_notify_and_only_the_main_process_notifies() -> None:
    lines = [ln.strip() for ln in UNIT.read_text().splitlines()]
    assert "Type=notify" in lines
    assert "NotifyAccess=main" in lines  # the --workers supervisor, never a worker


def _receive(
    sock: socket.socket, want: bytes, proc: subprocess.Popen[bytes], timeout: float = 20
) -> float:
    """Wait for a datagram holding the line ``want``; the monotonic time it arrived."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"gateway exited with {proc.returncode}"
        sock.settimeout(0.2)
        try:
            data = sock.recv(4096)
        except TimeoutError:
            continue
        if want in data.split(b"\n"):
            return time.monotonic()
    raise AssertionError(f"no {want!r} within {timeout}s")


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.e2e
@pytest.mark.parametrize("workers", [1, 2])
def test_ready_arrives_after_bind_and_stopping_at_the_drain(
    stub_url: str, tmp_path: Path, workers: int
) -> None:
    port = free_port()
    cfg = tmp_path / "gw.toml"
    cfg.write_text(stub_config(stub_url, models=("ok",)))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if workers == 1:  # a path, as systemd's own /run/systemd/notify
        name = str(tmp_path / "notify.sock")
        sock.bind(name)
    else:  # the abstract namespace
        name = f"@llm-gateway-test-{secrets.token_hex(6)}"
        sock.bind("\0" + name[1:])
    stderr = open(tmp_path / "stderr.log", "wb")  # closed in the finally block
    st = os.fstat(stderr.fileno())
    env = {**os.environ, "NOTIFY_SOCKET": name, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    env.pop("GATEWAY_API_KEYS", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway",
            "--config",
            str(cfg),
            "--port",
            str(port),
            "--workers",
            str(workers),
        ],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        env=env,
        cwd=REPO,
    )
    try:
        _receive(sock, b"READY=1", proc)
        assert _accepts(port), "READY=1 came before the port accepted connections"
        proc.send_signal(signal.SIGTERM)
        _receive(sock, b"STOPPING=1", proc, timeout=10)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        stderr.close()
        sock.close()
    lines = (tmp_path / "stderr.log").read_bytes().splitlines()
    events = {doc["event"]: ln[:3] for ln in lines if (doc := parse_line(ln))}
    # every line carries journald's priority prefix: stderr is the journal stream here
    assert all(ln[:1] == b"<" for ln in lines if ln.strip()), lines[:5]
    assert events["listening"] == b"<6>"
    assert events["auth_disabled"] == b"<4>"
    if workers > 1:
        assert events["workers_ready"] == b"<6>"


_LEVELS_SCRIPT = """
import sys
from gateway.ops import log
log.configure("debug", journal_stream=sys.argv[1])
g = log.get("t")
g.debug("d"); g.info("i"); g.warning("w"); g.error("e")
log.access(log.Access("req_x", "x", 200))
log.flush()
"""


@pytest.mark.parametrize("matches", [True, False])
def test_journal_priority_prefix_only_when_stderr_is_the_journal_stream(
    tmp_path: Path, matches: bool
) -> None:
    out = tmp_path / "stderr.log"
    with open(out, "wb") as stderr:
        st = os.fstat(stderr.fileno())
        stream = f"{st.st_dev}:{st.st_ino}" if matches else f"{st.st_dev}:{st.st_ino + 1}"
        subprocess.run(
            [sys.executable, "-c", _LEVELS_SCRIPT, stream],
            stderr=stderr,
            check=True,
            cwd=REPO,
            timeout=30,
        )
    lines = out.read_bytes().splitlines()
    prefixes = [ln[: ln.index(b"{")] for ln in lines]
    events = [doc["event"] for ln in lines if (doc := parse_line(ln))]
    assert events == ["d", "i", "w", "e", "access"]
    want = [b"<7>", b"<6>", b"<4>", b"<3>", b"<6>"] if matches else [b""] * 5
    assert prefixes == want
