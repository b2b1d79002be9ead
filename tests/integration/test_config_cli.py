"""The command line on a config: a bad one exits 2 with one line naming the file and the key,
a good one passes ``--check-config`` (each test starts ``python -m gateway``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.ops import config_doc
from tests.config_cases import BAD, GOOD
from tests.procs import REPO


@pytest.mark.parametrize("case", [BAD[0], BAD[9], BAD[13]], ids=lambda c: c[0])
def test_bad_config_exits_2_with_one_line(tmp_path: Path, case: tuple) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(case[1])
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert str(path) in lines[0] and case[3] in lines[0]


def test_missing_file_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "--check-config",
            "--config",
            str(tmp_path / "nope.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "nope.toml: cannot read" in proc.stderr


def test_check_config_ok_and_env_var(tmp_path: Path) -> None:
    path = tmp_path / "good.toml"
    path.write_text(GOOD)
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "--check-config"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"GATEWAY_CONFIG": str(path), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    assert str(path) in proc.stdout


def test_the_command_prints_the_page() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "gateway.ops.config_doc"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == config_doc.render()
