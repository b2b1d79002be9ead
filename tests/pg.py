"""A real, throwaway PostgreSQL server for the tests (Debian's ``postgresql`` package).

initdb into a temporary directory, then ``postgres`` on a free 127.0.0.1 port with its unix
socket in that directory (fsync off: nothing here outlives the test run). PostgreSQL refuses
to run as root, so under root both run as the ``postgres`` system user (``Popen(user=...)``,
so the PID we hold is the server's own) and the directory is handed to that user. Password
authentication over TCP (scram), so the URLs the tests use carry a password like a real one.
Stopped by its PID.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import free_port

USER = "gateway"
PASSWORD = "pg-test-secret"


def find_bin() -> Path | None:
    """The newest Debian PostgreSQL bin directory with initdb and postgres, or None."""
    found = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    found = [d for d in found if (d / "postgres").exists()]
    if not found:
        return None
    return max(found, key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0)


def unavailable() -> str | None:
    """Why a server cannot be started here, or None."""
    if find_bin() is None:
        return "PostgreSQL binaries absent (/usr/lib/postgresql/*/bin; apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and no 'postgres' system user to run the server as"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg not installed (pip install '.[postgresql]')"
    return None


class PgServer:
    """One server; ``url(db)`` is a ``postgresql://`` URL with user and password."""

    def __init__(self) -> None:
        bindir = find_bin()
        assert bindir is not None
        self.bindir = bindir
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="pg-test-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self._user: dict[str, object] = {}
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        self.log = self.dir / "server.log"

    def url(self, db: str = "postgres", *, port: int | None = None) -> str:
        return f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{port or self.port}/{db}"

    def _run(self, args: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LC_ALL": "C",
            "TZ": "UTC",
            "HOME": str(self.dir),
        }
        return subprocess.Popen(
            args,
            env=env,
            cwd=self.dir,
            **self._user,  # type: ignore[call-overload]
            **kwargs,
        )

    def start(self, timeout: float = 30.0) -> None:
        pwfile = self.dir / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self._user:
            os.chown(pwfile, self._user["user"], self._user["group"])  # type: ignore[arg-type]
        data = self.dir / "data"
        init = self._run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                USER,
                f"--pwfile={pwfile}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        out, _ = init.communicate(timeout=120)
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{out.decode(errors='replace')}")
        with open(self.log, "wb") as log:
            self.proc = self._run(
                [
                    str(self.bindir / "postgres"),
                    "-D",
                    str(data),
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.dir),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=100",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait(timeout)

    def _wait(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"postgres exited with {self.proc.returncode}:\n"
                    + self.log.read_text(errors="replace")
                )
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def create_db(self, name: str) -> str:
        """Create database ``name``; -> its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
        return self.url(name)

    def stop(self) -> None:
        """Fast shutdown (SIGINT) of our server by its PID, SIGKILL if it lingers."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def running_server() -> Iterator[PgServer]:
    """A started throwaway server, stopped by PID after; the test is skipped with the reason
    where Debian's binaries or psycopg are absent, and fails instead under CI."""
    reason = unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    server = PgServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()
