"""``--workers N``: N gateway processes on one port (SO_REUSEPORT), one supervisor.

The supervisor starts each worker as ``python -m gateway`` with the same
arguments, ``LLM_GATEWAY_WORKER=1`` (listen with SO_REUSEPORT, so the kernel
spreads connections across workers) and ``PROMETHEUS_MULTIPROC_DIR`` (each
worker writes its metric values to files there; ``/metrics`` on any worker
serves the sum over all workers). SIGTERM/SIGINT are forwarded, every worker
drains, and the supervisor exits 0 once all have. A worker that dies on its own
is replaced (and its live gauges dropped). SIGHUP is forwarded to every worker,
which re-reads the config file's clients and keys itself (gateway/http/reload.py);
a worker starts with SIGHUP ignored until its handler is in place, so an early
one cannot stop it.

Readiness: each worker gets ``NOTIFY_SOCKET`` naming a datagram socket of the
supervisor's (abstract namespace; the kernel attaches the sender's pid, so only
the supervisor's current workers count) and sends ``READY=1`` once it listens.
When every current worker has, the supervisor logs ``workers_ready`` and sends
``READY=1`` to its own ``$NOTIFY_SOCKET`` (systemd's, under ``Type=notify``);
``STOPPING=1`` when a stop signal arrives (gateway/ops/notify.py).
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import structlog
from prometheus_client import multiprocess

from gateway.ops import lifeline, log, notify
from gateway.ops.config import WORKER_ENV
from gateway.ops.signing_key import SHARED_KEY_ENV

_log = structlog.get_logger("gateway.ops.workers")


def _say(event: str, **fields: object) -> None:
    """One supervisor line, written at once: the supervisor runs no flush timer, and its
    lines would otherwise wait in the log buffer until it exits."""
    _log.info(event, **fields)
    log.flush()


def _clean(path: str) -> None:
    for name in os.listdir(path):
        if name.endswith(".db"):
            os.unlink(os.path.join(path, name))


_UCRED = struct.Struct("=iII")  # struct ucred: pid, uid, gid


def _ready_socket() -> tuple[socket.socket | None, str | None]:
    """(socket, its NOTIFY_SOCKET name) for the workers' READY=1; (None, None) where the
    platform has no abstract sockets or no sender credentials (then nothing is awaited)."""
    passcred = getattr(socket, "SO_PASSCRED", None)
    if passcred is None or not sys.platform.startswith("linux"):
        return None, None
    name = f"@llm-gateway-{os.getpid()}-{secrets.token_hex(8)}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.SOL_SOCKET, passcred, 1)
        sock.bind("\0" + name[1:])
    except OSError:
        sock.close()
        return None, None
    return sock, name


def _ready_pid(sock: socket.socket, timeout: float) -> int | None:
    """The pid that sent READY=1 within ``timeout`` s, else None (the supervisor's tick)."""
    sock.settimeout(timeout)
    try:
        data, ancillary, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
    except (TimeoutError, BlockingIOError):
        return None
    if b"READY=1" not in data.split(b"\n"):
        return None
    for level, kind, cdata in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return int(_UCRED.unpack_from(cdata)[0])
    return None


def supervise(
    args: list[str], workers: int, metrics_dir: str | None, notifier: notify.Notifier | None = None
) -> int:
    own_dir = metrics_dir is None
    path = metrics_dir or tempfile.mkdtemp(prefix="llm-gateway-metrics-")
    os.makedirs(path, exist_ok=True)
    _clean(path)  # values of a previous run would be summed in
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": path, WORKER_ENV: "1"}
    # one thinking-signature key for every worker, even where no key file can be kept
    env.setdefault(SHARED_KEY_ENV, secrets.token_hex(32))
    cmd = [sys.executable, "-m", "gateway", *args]
    notifier = notifier or notify.Notifier(None)
    ready_sock, ready_name = _ready_socket()
    env.pop("NOTIFY_SOCKET", None)  # workers never talk to systemd themselves
    if ready_name is not None:
        env["NOTIFY_SOCKET"] = ready_name
    ready: set[int] = set()
    announced = False
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        if not stopping:
            notifier.send("STOPPING=1")
        stopping = True
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    def on_reload(signum: int, _frame: object) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGHUP)

    # a worker drains and stops when the supervisor dies, even of a SIGKILL (lifeline);
    # the supervisor has no threads, so a preexec_fn is safe here
    start = functools.partial(
        subprocess.Popen,
        cmd,
        env=env,
        preexec_fn=functools.partial(worker_setup, os.getpid()),
    )
    procs = [start() for _ in range(workers)]
    # until here SIGHUP is ignored (main()): the workers are reading the file anyway
    signal.signal(signal.SIGHUP, on_reload)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    _say("workers_started", workers=workers, pids=[p.pid for p in procs], metrics_dir=path)
    try:
        while any(p.poll() is None for p in procs):
            if ready_sock is None:
                time.sleep(0.2)
            elif (pid := _ready_pid(ready_sock, 0.2)) is not None:
                ready.add(pid)
            if (
                not announced
                and not stopping
                and (ready_sock is None or {p.pid for p in procs} <= ready)
            ):
                announced = True
                _say("workers_ready", pids=[p.pid for p in procs])
                notifier.send("READY=1")
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
                procs[i] = start()
    finally:
        if ready_sock is not None:
            ready_sock.close()
        if own_dir:
            shutil.rmtree(path, ignore_errors=True)
    codes = [p.returncode for p in procs]
    _say("workers_stopped", exit_codes=codes)
    return 0 if stopping and all(c == 0 for c in codes) else max(1, *codes)


def worker_setup(supervisor: int) -> None:
    """In the worker, before exec: stop with the supervisor; SIGHUP ignored (a disposition
    exec keeps) until the worker's own reload handler replaces it."""
    lifeline.die_with_parent(supervisor, signal.SIGTERM)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


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
