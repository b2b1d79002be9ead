"""Run llama.cpp's HTTP server (embedded in the `xllamacpp` wheel) as a child process.

Facts relied on (xllamacpp 2026.x): ``xllamacpp.Server(CommonParams)`` loads the model, starts
llama-server's HTTP listener and worker threads in the calling process, and returns once it is
listening; ``Server.listening_address`` is ``"http://HOST:PORT"`` (port 0 in the params means the
OS picked a free one). Dropping the object stops it. ``CommonParams`` mirrors llama-server's CLI
(``n_ctx`` = ``--ctx-size``, shared by ``n_parallel`` slots; ``use_jinja`` = ``--jinja``;
``reasoning_format`` = ``--reasoning-format``).

The server runs in a separate Python process so that its threads never compete with the
gateway's event loop for the GIL, and so that it can be killed by PID. The child prints one JSON
line with its address on stdout, then blocks reading stdin: when the parent closes the pipe (or
dies), the child exits, so no server outlives its owner.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import IO, Any


class LlamaServerError(RuntimeError):
    """The llama.cpp server could not be started."""


class LlamaServer:
    """A llama.cpp server serving one GGUF on loopback, in a child process.

    ``extra_args`` are ``"name=value"`` assignments to xllamacpp ``CommonParams`` fields, dotted
    for nested ones (``"kv_unified=true"``, ``"sampling.seed=1"``, ``"n_batch=512"``).
    """

    def __init__(
        self,
        model_path: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ctx_size: int = 2048,
        parallel: int = 2,
        threads: int = 1,
        alias: str | None = None,
        extra_args: Sequence[str] = (),
        log_path: str | None = None,
    ) -> None:
        self.model_path = model_path
        self.host = host
        self.port = port
        self.ctx_size = ctx_size
        self.parallel = parallel
        self.threads = threads
        self.alias = alias  # the "model" llama.cpp puts in replies (default: the file path)
        self.extra_args = tuple(extra_args)
        self.log_path = log_path
        self.root_url: str | None = None  # "http://127.0.0.1:PORT", once started
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._own_log = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def base_url(self) -> str | None:
        """The OpenAI-compatible base URL ("http://127.0.0.1:PORT/v1"), once started."""
        return f"{self.root_url}/v1" if self.root_url else None

    def command(self) -> list[str]:
        argv = [
            sys.executable, "-m", "gateway.demo.llama",
            "--model", self.model_path,
            "--host", self.host,
            "--port", str(self.port),
            "--ctx-size", str(self.ctx_size),
            "--parallel", str(self.parallel),
            "--threads", str(self.threads),
        ]  # fmt: skip
        if self.alias:
            argv += ["--alias", self.alias]
        for assignment in self.extra_args:
            argv += ["--set", assignment]
        return argv

    def start(self, timeout: float = 60) -> str:
        """Start the server; return its base URL once ``/health`` answers 200."""
        if self._proc is not None:
            raise LlamaServerError("already started")
        if self.log_path is None:
            fd, self.log_path = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            self._own_log = True
        self._log = open(self.log_path, "wb")  # closed in stop()
        self._proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + timeout
        try:
            self.root_url = self._read_address(deadline)
            self._wait_healthy(deadline)
        except BaseException:
            tail = self.log_tail()
            self.stop()
            raise LlamaServerError(f"llama server did not start; log tail:\n{tail}") from None
        assert self.base_url is not None
        return self.base_url

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s) and release its pipes."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._own_log and self.log_path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.log_path)
            self.log_path = None
            self._own_log = False
        self.root_url = None

    def log_tail(self, limit: int = 4000) -> str:
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - limit))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _read_address(self, deadline: float) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            if not sel.select(max(0.0, deadline - time.monotonic())):
                raise TimeoutError("no address from the llama server")
        line = self._proc.stdout.readline()
        if not line:
            raise LlamaServerError("llama server exited before listening")
        return str(json.loads(line)["address"])

    def _wait_healthy(self, deadline: float) -> None:
        while True:
            try:
                with urllib.request.urlopen(f"{self.root_url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # 503 while loading, or not accepting yet
            if self._proc is None or self._proc.poll() is not None:
                raise LlamaServerError("llama server exited")
            if time.monotonic() > deadline:
                raise TimeoutError("llama server not healthy in time")
            time.sleep(0.05)


# --- the child process ------------------------------------------------------------------------


def _coerce(current: Any, text: str) -> Any:
    """Turn the CLI text of an assignment into the type the field already has."""
    if isinstance(current, bool):
        return text.lower() in ("1", "true", "yes", "on")
    if isinstance(current, int) and not hasattr(current, "name"):
        return int(text)
    if isinstance(current, float):
        return float(text)
    if isinstance(current, (list, set)):
        return type(current)(item for item in text.split(",") if item)
    if hasattr(current, "name"):  # a Cython enum: accept its member name
        return type(current)[text] if not text.lstrip("-").isdigit() else type(current)(int(text))
    return text


def _assign(params: Any, assignment: str) -> None:
    name, sep, value = assignment.partition("=")
    if not sep:
        raise SystemExit(f"--set wants name=value, got {assignment!r}")
    *parents, leaf = name.split(".")
    target = params
    for part in parents:
        target = getattr(target, part)
    setattr(target, leaf, _coerce(getattr(target, leaf), value))


def _params(args: argparse.Namespace) -> Any:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx_size
    params.n_parallel = args.parallel
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.n_threads_http = max(2, args.parallel + 1)
    if args.alias:
        params.model_alias = {args.alias}
    # --jinja: the model's own template, so <think> is split into reasoning_content
    params.use_jinja = True
    params.reasoning_format = xllamacpp.common_reasoning_format.COMMON_REASONING_FORMAT_DEEPSEEK
    params.warmup = False
    params.ui = False
    for assignment in args.set:
        _assign(params, assignment)
    return params


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gateway.demo.llama", description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ctx-size", type=int, default=2048)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--alias")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args(argv)

    import xllamacpp

    # SIGTERM raises SystemExit in the main thread, so the server object is dropped cleanly.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = xllamacpp.Server(_params(args))
    sys.stdout.write(json.dumps({"address": server.listening_address, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    try:
        sys.stdin.buffer.read()  # returns when the parent closes the pipe or dies
    finally:
        del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
