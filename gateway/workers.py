"""``--workers N``: N gateway processes on one port (SO_REUSEPORT), one supervisor.

The supervisor starts each worker as ``python -m gateway`` with the same
arguments, ``LLM_GATEWAY_WORKER=1`` (listen with SO_REUSEPORT, so the kernel
spreads connections across workers) and ``PROMETHEUS_MULTIPROC_DIR`` (each
worker writes its metric values to files there; ``/metrics`` on any worker
serves the sum over all workers). SIGTERM/SIGINT are forwarded, every worker
drains, and the supervisor exits 0 once all have. A worker that dies on its own
is replaced (and its live gauges dropped).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import structlog
from prometheus_client import multiprocess

from gateway import log
from gateway.config import SHARED_KEY_ENV, WORKER_ENV

_log = structlog.get_logger("gateway.workers")


def _say(event: str, **fields: object) -> None:
    """One supervisor line, written at once: the supervisor runs no flush timer, and its
    lines would otherwise wait in the log buffer until it exits."""
    _log.info(event, **fields)
    log.flush()


def _clean(path: str) -> None:
    for name in os.listdir(path):
        if name.endswith(".db"):
            os.unlink(os.path.join(path, name))


def supervise(args: list[str], workers: int, metrics_dir: str | None) -> int:
    own_dir = metrics_dir is None
    path = metrics_dir or tempfile.mkdtemp(prefix="llm-gateway-metrics-")
    os.makedirs(path, exist_ok=True)
    _clean(path)  # values of a previous run would be summed in
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": path, WORKER_ENV: "1"}
    # one thinking-signature key for every worker, even where no key file can be kept
    env.setdefault(SHARED_KEY_ENV, secrets.token_hex(32))
    cmd = [sys.executable, "-m", "gateway", *args]
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    procs = [subprocess.Popen(cmd, env=env) for _ in range(workers)]
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    _say("workers_started", workers=workers, pids=[p.pid for p in procs], metrics_dir=path)
    try:
        while any(p.poll() is None for p in procs):
            time.sleep(0.2)
            if stopping:
                continue
            for i, proc in enumerate(procs):
                code = proc.poll()
                if code is None:
                    continue
                multiprocess.mark_process_dead(proc.pid, path)
                if code == 2:  # bad config or arguments: restarting cannot help
                    on_signal(signal.SIGTERM, None)
                    break
                # worker_pid: the pipeline's own pid field is the supervisor's
                _log.warning("worker_replaced", worker_pid=proc.pid, exit_code=code)
                procs[i] = subprocess.Popen(cmd, env=env)
    finally:
        if own_dir:
            shutil.rmtree(path, ignore_errors=True)
    codes = [p.returncode for p in procs]
    _say("workers_stopped", exit_codes=codes)
    return 0 if stopping and all(c == 0 for c in codes) else max(1, *codes)


def strip_workers_flag(argv: list[str]) -> list[str]:
    """The worker's arguments: the supervisor's own, without --workers."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--workers":
            skip = True
            continue
        if arg.startswith("--workers="):
            continue
        out.append(arg)
    return out
