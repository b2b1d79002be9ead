"""Child processes die with a SIGKILLed gateway (gateway/ops/lifeline.py).

A gateway killed with SIGKILL runs no cleanup: its PDF worker went on with the job in hand
(up to ``pdf_cpu_seconds``), its body decoder's child kept the body, and the workers of a
killed ``--workers`` supervisor kept serving. Each case starts the real gateway, makes it
start its children, SIGKILLs it by pid and checks that every process below it is gone
within a bounded wait. Linux only (/proc)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import stub_config
from tests.pdfs import document, hostile_pdf
from tests.procs import Proc, post, start_gateway

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc"),
]

_GONE_WITHIN = 10.0  # seconds: a generous bound (the kernel signals at once)
_HEAVY = hostile_pdf(3_000_000)  # one document: tens of CPU seconds of pypdf


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return {pid for pid in found if _alive(pid)}


def _in_background(fn: Callable[[], object]) -> None:
    threading.Thread(target=lambda: _quietly(fn), daemon=True).start()


def _quietly(fn: Callable[[], object]) -> None:
    try:
        fn()
    except OSError:
        pass  # the gateway was killed under it


def _pdf_job(url: str) -> None:
    """A request whose PDFs keep a worker busy for a long time."""
    body = {
        "model": "m-ok",
        "max_tokens": 16,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "read"},
                    *(document(_HEAVY) for _ in range(4)),
                ],
            }
        ],
    }
    _in_background(lambda: post(f"{url}/llm/v1/messages", body, timeout=60))


def _large_body(url: str) -> None:
    """A body past decode_offload_bytes: decoded in the decoder's child."""
    text = "lorem ipsum " * 200_000  # 2.4 MB
    status, _, _ = post(
        f"{url}/llm/v1/messages",
        {"model": "m-ok", "max_tokens": 16, "messages": [{"role": "user", "content": text}]},
    )
    assert status in (200, 400, 413), status


@pytest.mark.parametrize(
    ("case", "extra_server", "start", "args"),
    [
        (
            "a PDF worker in the middle of a job",
            "pdf_cpu_seconds = 60\npdf_request_cpu_seconds = 600",
            _pdf_job,
            (),
        ),
        ("the body decoder's child", "", _large_body, ()),
        ("the workers of a --workers supervisor", "", lambda url: None, ("--workers", "2")),
    ],
)
def test_children_die_with_a_sigkilled_gateway(
    case: str,
    extra_server: str,
    start: Callable[[str], None],
    args: tuple[str, ...],
    stub_url: str,
    tmp_path: Path,
) -> None:
    proc: Proc
    proc, url = start_gateway(
        stub_config(stub_url, extra_server=extra_server), tmp_path, extra_args=args
    )
    try:
        pid = proc.popen.pid
        start(url)
        deadline = time.monotonic() + 20
        while not (children := _descendants(pid)):
            assert time.monotonic() < deadline, f"{case}: no child process started"
            time.sleep(0.05)
        time.sleep(0.5)  # the child at work (a PDF job under way)
        children = _descendants(pid)
        os.kill(pid, signal.SIGKILL)
        proc.popen.wait(10)
        deadline = time.monotonic() + _GONE_WITHIN
        while left := {child for child in children if _alive(child)}:
            assert time.monotonic() < deadline, f"{case}: still running: {sorted(left)}"
            time.sleep(0.05)
    finally:
        proc.stop()
