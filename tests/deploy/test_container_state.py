"""Each shipped config, started the way the image starts it: uid/gid 10001, HOME=/nonexistent.

The configs are deploy/gateway.example.toml (the image's default), deploy/kubernetes's
gateway.toml and the one inlined in deploy/compose.yaml. Without a state directory the gateway
must still start (/health and /ready 200), warn ``batches_disabled`` and answer the batches
routes with the "not supported" 404; with ``STATE_DIRECTORY`` on a folder of the user's own
(what the image's volume, the Kubernetes emptyDir and the compose volume give it), Message
Batches work. The upstreams are unreachable here: neither /health, /ready nor creating a batch
waits on them.

Needs root (to run the gateway as uid 10001, with ``setpriv``) and an interpreter and
repository that uid 10001 can read; skips with the reason otherwise (fails, under CI, where
the interpreter is out of reach: .ci/run opens the way).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy_files import COMPOSE, EXAMPLE, K8S, env_names
from tests.logs import log_lines, matching
from tests.procs import REPO, Proc, free_port, get, post, wait_http

yaml = pytest.importorskip("yaml")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

UID = GID = 10001
API_KEY = "sk-container-test"
START_WAIT_S = 20.0


def _shipped() -> dict[str, str]:
    compose = yaml.safe_load(COMPOSE.read_text())
    return {
        "example": EXAMPLE.read_text(),
        "kubernetes": (K8S / "base" / "gateway.toml").read_text(),
        "compose": compose["configs"]["gateway-toml"]["content"],
    }


def _runnable_env(extra: dict[str, str]) -> dict[str, str]:
    """The whole environment of the child: what the image's user would have, and no more."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if os.environ.get("LD_LIBRARY_PATH"):  # an interpreter that finds libpython through it
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    return {**env, **extra}


def _as_image_user(env: dict[str, str], *argv: str) -> list[str]:
    """argv run as uid/gid 10001 with exactly ``env`` (setpriv and env exec: one PID)."""
    setpriv = shutil.which("setpriv")
    assert setpriv
    return [
        setpriv,
        "--reuid",
        str(UID),
        "--regid",
        str(GID),
        "--clear-groups",
        "/usr/bin/env",
        "-i",
        *(f"{k}={v}" for k, v in env.items()),
        *argv,
    ]


@pytest.fixture(scope="module")
def image_user() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to start the gateway as uid 10001 (CI runs it as root)")
    if not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is not installed")
    probe = subprocess.run(
        _as_image_user(_runnable_env({}), sys.executable, "-c", "import gateway.app"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode != 0:
        why = (
            f"uid {UID} cannot run {sys.executable} on {REPO} (an interpreter under "
            f"/root?): {(probe.stderr or probe.stdout).strip()[-200:]}"
        )
        if os.environ.get("CI"):  # .ci/run opens the way (o+x on /root): a failure there
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture
def own_dir() -> Iterator[Path]:
    """A folder of uid 10001's own, 0700 (pytest's tmp_path is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="llm-gateway-image-user-"))
    os.chown(path, UID, GID)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _start(text: str, folder: Path, env: dict[str, str]) -> tuple[Proc, str, dict[str, object]]:
    """Write the config (metrics_port moved to a free port) and start the gateway as the
    image's user on 127.0.0.1:<free port>. -> (proc, base URL, the config as TOML data)"""
    if re.search(r"^metrics_port\s*=", text, flags=re.M):
        text = re.sub(r"^metrics_port\s*=.*$", f"metrics_port = {free_port()}", text, flags=re.M)
    data = tomllib.loads(text)
    path = folder / "gateway.toml"
    path.write_text(text)
    os.chown(path, UID, GID)
    keys = {name: "test-secret" for name in env_names(data)}
    keys[data["server"].get("api_keys_env", "GATEWAY_API_KEYS")] = API_KEY
    port = free_port()
    proc = Proc(
        _as_image_user(
            _runnable_env({**keys, **env}),
            sys.executable,
            "-m",
            "gateway",
            "--config",
            str(path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        )
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=START_WAIT_S, proc=proc.popen)
    except Exception:
        proc.stop()
        raise RuntimeError("gateway did not start:\n" + proc.output()) from None
    return proc, f"http://127.0.0.1:{port}", data


def _events(output: str, name: str) -> list[dict[str, object]]:
    return matching(log_lines(output), name)


def _batch_body(data: dict[str, object]) -> dict[str, object]:
    models = data["models"]
    assert isinstance(models, list)
    params = {
        "model": models[0]["name"],
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
    }
    return {"requests": [{"custom_id": "one", "params": params}]}


@pytest.mark.parametrize("name", sorted(_shipped()))
def test_without_a_state_directory_it_starts_with_batches_off(
    image_user: None, own_dir: Path, name: str
) -> None:
    proc, base, data = _start(_shipped()[name], own_dir, {})
    try:
        wait_http(f"{base}/ready", timeout=START_WAIT_S, proc=proc.popen)
        assert get(f"{base}/health")[0] == 200
        prefix = data["server"].get("prefix", "/llm")  # type: ignore[union-attr]
        auth = {"x-api-key": API_KEY}
        status, _, body = post(f"{base}{prefix}/v1/messages/batches", _batch_body(data), auth)
        assert status == 404, body
        assert b"not supported" in body or b"not enabled" in body, body
        assert get(f"{base}{prefix}/v1/models", auth)[0] == 200  # the rest is served
    finally:
        code = proc.stop()
    output = proc.output()
    assert code == 0, output
    [warning] = _events(output, "batches_disabled")
    assert warning["level"] == "warning", warning
    assert warning["folder"] == "/nonexistent/.local/state/llm-gateway", warning
    assert "STATE_DIRECTORY" in str(warning["fix"]), warning
    assert not _events(output, "batch_store_failed"), output


@pytest.mark.parametrize("name", sorted(_shipped()))
def test_with_a_state_directory_batches_work(image_user: None, own_dir: Path, name: str) -> None:
    state = own_dir / "state"
    state.mkdir(mode=0o700)
    os.chown(state, UID, GID)
    proc, base, data = _start(_shipped()[name], own_dir, {"STATE_DIRECTORY": str(state)})
    try:
        wait_http(f"{base}/ready", timeout=START_WAIT_S, proc=proc.popen)
        prefix = data["server"].get("prefix", "/llm")  # type: ignore[union-attr]
        auth = {"x-api-key": API_KEY}
        status, _, body = post(f"{base}{prefix}/v1/messages/batches", _batch_body(data), auth)
        assert status == 200, body
        batch = json.loads(body)
        assert (
            batch["type"] == "message_batch"
            and batch["request_counts"]["processing"]
            + batch["request_counts"]["errored"]
            + batch["request_counts"]["succeeded"]
            == 1
        )
        status, _, body = get(f"{base}{prefix}/v1/messages/batches/{batch['id']}", auth)
        assert status == 200, body
        assert post(f"{base}{prefix}/v1/messages/batches/{batch['id']}/cancel", {}, auth)[0] == 200
    finally:
        code = proc.stop(timeout=15)
    output = proc.output()
    assert code == 0, output
    assert not _events(output, "batches_disabled"), output
    db = state / "batches.sqlite3"
    assert db.is_file() and db.stat().st_uid == UID
