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
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import certs
from tests.procs import free_port

BINARY = "redis-server"


def unavailable() -> str | None:
    if shutil.which(BINARY) is None:
        return "redis-server absent (apt-get install redis-server)"
    return None


class RedisServer:
    """One server; ``url`` with the password when one is set."""

    def __init__(self, password: str = "", *, tls: bool = False) -> None:
        self.port = free_port()
        self.password = password
        self.tls = tls
        self.dir = Path(tempfile.mkdtemp(prefix="redis-test-"))
        self.proc: subprocess.Popen[bytes] | None = None
        if tls:
            self._make_certs()

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"{'rediss' if self.tls else 'redis'}://{auth}127.0.0.1:{self.port}/0"

    @property
    def ca_file(self) -> Path:
        """With ``tls``: the CA that signed the server's certificate (for 127.0.0.1)."""
        return self.dir / "ca.pem"

    def _make_certs(self) -> None:
        """A throwaway CA, and a server certificate it signs for IP 127.0.0.1."""
        certs.make_ca(self.dir)
        certs.make_leaf(self.dir, san="IP:127.0.0.1")

    def start(self, timeout: float = 10.0) -> None:
        listen = ["--port", str(self.port)]
        if self.tls:
            listen = ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"]
            for flag, name in (
                ("cert", "server.pem"),
                ("key", "server.key"),
                ("ca-cert", "ca.pem"),
            ):
                listen += [f"--tls-{flag}-file", str(self.dir / name)]
        args = [
            BINARY,
            *listen,
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
            with contextlib.ExitStack() as stack:
                s = stack.enter_context(socket.create_connection(("127.0.0.1", self.port), 1))
                if self.tls:
                    context = ssl.create_default_context(cafile=self.ca_file)
                    s = stack.enter_context(context.wrap_socket(s, server_hostname="127.0.0.1"))
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
def running_redis(password: str = "", *, tls: bool = False) -> Iterator[RedisServer]:
    """A started throwaway server, stopped by PID after; skipped with the reason where
    redis-server is absent, a failure instead under CI."""
    reason = unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    server = RedisServer(password, tls=tls)
    try:
        server.start()
        yield server
    finally:
        server.close()
