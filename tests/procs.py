"""Start and stop real processes for end-to-end tests (loopback only, by PID)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

REPO = Path(__file__).resolve().parent.parent


def require_demo_extra() -> None:
    """Skip (locally) or fail (under CI) when the demo extra is not installed."""
    import importlib.util

    import pytest

    missing = [m for m in ("xllamacpp", "gguf", "numpy") if importlib.util.find_spec(m) is None]
    if missing:
        reason = f"--demo needs {', '.join(missing)} (pip install '.[demo]')"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 15.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


class Proc:
    """A child process whose stderr goes to a file we can read back."""

    def __init__(
        self, args: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="proc-", suffix=".log", delete=False)
        full_env = {**os.environ, **(env or {})}
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        self.popen = subprocess.Popen(
            args, stdout=self.log, stderr=subprocess.STDOUT, env=full_env, cwd=str(cwd or REPO)
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.popen.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.popen.wait(5)
        self.log.close()
        return self.popen.returncode


def start_gateway(
    config_text: str,
    tmp_path: Path,
    *,
    env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
    port: int | None = None,
) -> tuple[Proc, str]:
    """Write the config, start ``python -m gateway`` (on ``port``, else a free one) and wait
    for /health. -> (proc, base url)"""
    port = port or free_port()
    cfg = tmp_path / f"gateway-{port}.toml"
    cfg.write_text(config_text)
    env = dict(env or {})
    if "STATE_DIRECTORY" not in env and "XDG_STATE_HOME" not in env:
        # the test's own state directory (signing key, batch database): gateways of one test
        # share it, and no batch a test leaves behind is picked up by another test's gateway
        env["XDG_STATE_HOME"] = str(tmp_path / "state")
    proc = Proc(
        [sys.executable, "-m", "gateway", "--config", str(cfg), "--port", str(port), *extra_args],
        env=env,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc=proc.popen)
    except Exception:
        proc.stop()
        raise RuntimeError("gateway did not start:\n" + proc.output()) from None
    return proc, f"http://127.0.0.1:{port}"


def send_request(req: urllib.request.Request, timeout: float) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:  # an unclosed error response leaks its socket
            return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def post(
    url: str, body: Any, headers: dict[str, str] | None = None, timeout: float = 30
) -> tuple[int, dict[str, str], bytes]:
    """POST JSON (or raw bytes); -> (status, lower-cased headers, body), errors included."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return send_request(
        urllib.request.Request(
            url,
            data=data,
            method="POST",
            headers={"Content-Type": "application/json", **(headers or {})},
        ),
        timeout,
    )


def form_post(
    url: str, fields: dict[str, str] | bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """POST a form (``application/x-www-form-urlencoded``), as OAuth clients and HTML forms do;
    -> (status, lower-cased headers, body), errors included."""
    data = fields if isinstance(fields, bytes) else urlencode(fields).encode()
    req = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"Content-Type": "application/x-www-form-urlencoded", **(headers or {})},
    )
    return send_request(req, 10)


def get(
    url: str, headers: dict[str, str] | None = None, timeout: float = 10
) -> tuple[int, dict[str, str], bytes]:
    return send_request(urllib.request.Request(url, headers=headers or {}), timeout)


def metric(base: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` on ``{base}/metrics`` whose labels include
    ``labels`` (0 when there are none)."""
    from prometheus_client.parser import text_string_to_metric_families

    _, _, body = get(f"{base}/metrics")
    return sum(
        sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def peak_rss_mb(pid: int) -> float:
    """A process's peak resident set since it started (``VmHWM``), in MiB."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")
