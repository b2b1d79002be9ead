"""Where start-up keeps Message Batches, and what it does when it cannot.

The default location (``batches.sqlite3`` in the state directory) is a convenience: when it
cannot be made or opened, the gateway starts with batches off (``batches_disabled``, naming
the folder and the fix). A location the operator named (``batches.database`` or
``database_env``) is a promise: failing to open it stops the start (``batch_store_failed``,
exit 1). ``--check-config`` opens the same store and reports the same way.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gateway import stores
from gateway.ops import config, config_schema

GOOD = """
[server]
host = "127.0.0.1"
port = 8080

[upstreams.u]
base_url = "http://127.0.0.1:9/v1"

[[models]]
name = "m"
upstream = "u"
upstream_model = "m"
"""


def _batches(env: dict[str, str], table: str = "") -> config_schema.BatchesConfig:
    text = GOOD + (f"\n[batches]\n{table}\n" if table else "")
    return config.parse(tomllib.loads(text), "test.toml", env).batches


def _blocked(tmp_path: Path) -> Path:
    """A path under a regular file: no one, root included, can make a folder there."""
    plain = tmp_path / "plain-file"
    plain.write_text("not a folder")
    return plain / "state"


def _close(store: object) -> None:
    assert store is not None
    asyncio.run(store.close())  # type: ignore[attr-defined]


def test_the_location_is_explicit_only_when_the_config_names_it(tmp_path: Path) -> None:
    env = {"STATE_DIRECTORY": str(tmp_path / "sd"), "DB": "sqlite:////x/y.sqlite3"}
    default = _batches(env)
    assert not default.database_explicit
    assert default.database_url == f"sqlite:///{tmp_path}/sd/batches.sqlite3"
    assert _batches(env, 'database = "/x/y.sqlite3"').database_explicit
    assert _batches(env, 'database_env = "DB"').database_explicit
    assert "database_explicit" not in config_schema.schema()  # derived, not a TOML key


def test_the_default_folder_is_made_0700_and_the_store_opened(tmp_path: Path) -> None:
    folder = tmp_path / "deep" / "state"
    store, off = stores.open_batch_store(_batches({"STATE_DIRECTORY": str(folder)}))
    try:
        assert off is None
        assert (folder / "batches.sqlite3").is_file()
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    finally:
        _close(store)


@pytest.mark.parametrize("where", ["folder cannot be made", "corrupt file", "no state dir"])
def test_a_default_location_that_cannot_be_kept_turns_batches_off(
    tmp_path: Path, where: str
) -> None:
    if where == "folder cannot be made":
        folder: Path | None = _blocked(tmp_path)
    elif where == "corrupt file":
        folder = tmp_path / "sd"
        folder.mkdir()
        (folder / "batches.sqlite3").write_bytes(b"this is not a SQLite database\n" * 400)
    else:
        folder = None
    env = {"STATE_DIRECTORY": str(folder)} if folder else {}
    cfg = config.Config(
        server=config.load(None, {}).server, upstreams={}, models={}, batches=_batches(env)
    )
    with capture_logs() as logs:
        assert stores.start_batch_store(cfg) is None
    [warning] = [e for e in logs if e["event"] == "batches_disabled"]
    assert warning["log_level"] == "warning"
    assert warning["folder"] == (str(folder) if folder else None)
    assert "STATE_DIRECTORY" in warning["fix"] and "batches.database" in warning["fix"]
    if folder is not None:
        assert str(folder) in warning["detail"]
    assert not [e for e in logs if e["event"] == "batch_store_failed"]


def test_an_explicit_location_that_cannot_be_opened_stops_the_start(tmp_path: Path) -> None:
    db = _blocked(tmp_path) / "batches.sqlite3"
    cfg = config.Config(
        server=config.load(None, {}).server,
        upstreams={},
        models={},
        batches=_batches({}, f'database = "{db}"'),
    )
    with capture_logs() as logs, pytest.raises(SystemExit) as stop:
        stores.start_batch_store(cfg)
    assert stop.value.code == 1
    [error] = [e for e in logs if e["event"] == "batch_store_failed"]
    assert str(db.parent) in error["detail"]
    assert not [e for e in logs if e["event"] == "batches_disabled"]


def test_an_explicit_location_is_not_created(tmp_path: Path) -> None:
    """Only the state directory is made; a folder the operator named must exist."""
    db = tmp_path / "missing" / "b.sqlite3"
    from gateway.batches.store import StoreError

    with pytest.raises(StoreError, match="does not exist"):
        stores.open_batch_store(_batches({}, f'database = "{db}"'))
    assert not db.parent.exists()


def test_batches_off_by_config_open_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "sd"
    assert stores.open_batch_store(
        _batches({"STATE_DIRECTORY": str(folder)}, "enabled = false")
    ) == (
        None,
        None,
    )
    assert not (folder / "batches.sqlite3").exists()


def _check_config(
    tmp_path: Path, table: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "gw.toml"
    path.write_text(GOOD + (f"\n[batches]\n{table}\n" if table else ""))
    return subprocess.run(
        [sys.executable, "-m", "gateway", "--check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
    )


def test_check_config_opens_the_store(tmp_path: Path) -> None:
    run = _check_config(tmp_path, "", {"STATE_DIRECTORY": str(tmp_path / "sd")})
    assert run.returncode == 0, run.stderr
    assert "config ok" in run.stdout and not run.stderr
    assert (tmp_path / "sd" / "batches.sqlite3").is_file()


def test_check_config_fails_on_an_explicit_location(tmp_path: Path) -> None:
    db = _blocked(tmp_path) / "batches.sqlite3"
    run = _check_config(tmp_path, f'database = "{db}"', {})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "batch store error" in run.stderr and str(db.parent) in run.stderr
    assert "config ok" not in run.stdout


def test_check_config_warns_for_the_default_location(tmp_path: Path) -> None:
    folder = _blocked(tmp_path)
    run = _check_config(tmp_path, "", {"STATE_DIRECTORY": str(folder)})
    assert run.returncode == 0, run.stderr
    assert "config ok" in run.stdout
    assert "batches would be disabled" in run.stderr and str(folder) in run.stderr
    assert "STATE_DIRECTORY" in run.stderr
