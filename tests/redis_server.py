"""A real, throwaway redis-server for the tests (Debian's ``redis-server`` package).

Started on a free 127.0.0.1 port with no persistence (``--save "" --appendonly no``) in a
temporary directory, optionally with a password; stopped by its PID. ``stop()`` then
``start()`` again brings it back on the same port (a Redis that went away and came back).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import free_port

BINARY = "redis-server"


def unavailable() -> str | None:
    if shutil.which(BINARY) is None:
        return "redis-server absent (apt-get install redis-server)"
    return None


class RedisServer:
    """One server; ``url`` with the password when one is set."""

    def __init__(self, password: str = "") -> None:
        self.port = free_port()
        self.password = password
        self.dir = Path(tempfile.mkdtemp(prefix="redis-test-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        args = [
            BINARY,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
            "--logfile",
            str(self.dir / "redis.log"),
        ]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, cwd=self.dir, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                log = self.dir / "redis.log"
                text = log.read_text(errors="replace") if log.exists() else ""
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}:\n{text}")
            if self._answers():
                return
            if time.monotonic() > deadline:
                raise TimeoutError("redis-server did not answer PING")
            time.sleep(0.02)

    def _answers(self) -> bool:
        auth = b""
        if self.password:
            p = self.password.encode()
            auth = b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(p), p)
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(auth + b"*1\r\n$4\r\nPING\r\n")
                got = b""
                while b"PONG" not in got:
                    chunk = s.recv(256)
                    if not chunk:
                        return False
                    got += chunk
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM our server by its PID (SIGKILL if it lingers)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def running_redis(password: str = "") -> Iterator[RedisServer]:
    """A started throwaway server, stopped by PID after; skipped with the reason where
    redis-server is absent, a failure instead under CI."""
    reason = unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    server = RedisServer(password)
    try:
        server.start()
        yield server
    finally:
        server.close()
