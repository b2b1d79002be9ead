"""PDF text extraction in a small pool of worker processes, bounded in CPU and cancellable.

Why processes, not threads: pypdf is pure Python, so a thread that parses holds the GIL
(the event loop waited 1.3 s beside hostile PDFs), and a thread cannot be stopped, so
the work went on after its client hung up (four hung-up clients: 81 CPU seconds). A
worker process (:mod:`.pdf_worker`) parses beside the loop, not in it, counts its own CPU
time, and can be killed. Not ``concurrent.futures.ProcessPoolExecutor``: it cannot stop
one running task, and a worker killed under it breaks the whole pool and every task in it.

The bounds:

* ``server.pdf_workers`` processes at most: the CPU cores PDFs can take at once; a request
  waits for a free worker (and waits no longer once its client has gone).
* Turns: a job is one document, not a request's all, and a request has one document in a
  worker at a time; a freed worker goes to the waiting request that has had the fewest
  documents read (then the first to come). When one request's PDFs were one job, two
  requests of many heavy PDFs held both workers for their whole CPU budgets while another
  request's one-page PDF waited (59 s); now it waits for one document at most.
* ``server.pdf_cpu_seconds`` of CPU time a document and ``server.pdf_request_cpu_seconds``
  for all of a request's documents, enforced in the worker with a CPU-time timer; past
  either, 400 ``invalid_request_error`` naming the document (``messages.N.content.M``).
* When the waiting task is cancelled (aiohttp's handler cancellation: the client hung up)
  or a job outlasts :func:`_wall_limit` seconds of wall-clock time (a starved machine), its
  worker is killed at once (SIGKILL) and a fresh one started for the next job.

Workers start on first use (a Python with pypdf imported: about 0.2 s) and are kept for
the next job; :meth:`PdfPool.close` stops them with the app.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import struct
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from gateway.errors import InvalidRequest
from gateway.messages.documents import pdf_text as documents

__all__ = ["PdfPool"]

_HEAD = struct.Struct(">I")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_log = structlog.get_logger("gateway.messages.documents.pdf_pool")


def _wall_limit(request_cpu: float) -> float:
    """Wall-clock seconds a job may take: its CPU budget, stretched for a busy machine."""
    return 3 * request_cpu + 30


class _Worker:
    __slots__ = ("proc",)

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls) -> _Worker:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway.messages.documents.pdf_worker",
            str(os.getpid()),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=env,
        )
        return cls(proc)

    async def call(self, job: bytes) -> dict[str, Any]:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        stdin.write(_HEAD.pack(len(job)) + job)
        await stdin.drain()
        size = _HEAD.unpack(await stdout.readexactly(_HEAD.size))[0]
        reply: dict[str, Any] = json.loads(await stdout.readexactly(size))
        return reply

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()


class PdfPool:
    """Up to ``workers`` PDF worker processes; :meth:`to_text` is the one way in."""

    def __init__(self, workers: int = 2, doc_cpu: float = 5.0, request_cpu: float = 20.0) -> None:
        self.workers = workers
        self.doc_cpu = doc_cpu
        self.request_cpu = request_cpu
        self._free = workers  # worker slots no request holds
        # requests waiting for a slot: ((documents read, arrival), the future handed it)
        self._waiting: list[tuple[tuple[int, int], asyncio.Future[None]]] = []
        self._arrivals = itertools.count()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._reaping: set[asyncio.Task[Any]] = set()
        self.killed = 0  # workers killed mid-job (a client gone, a job overstaying)

    async def to_text(
        self, req: Mapping[str, Any], where: Sequence[documents.Location]
    ) -> dict[str, Any]:
        """A copy of ``req`` with each PDF at ``where`` replaced by its text (as
        :func:`documents.pdfs_to_text`), read in a worker one document at a time; raises
        InvalidRequest naming the first PDF that cannot be read or runs out of CPU time."""
        documents.check_count(where)
        arrival = next(self._arrivals)
        texts: list[str] = []
        used = 0.0  # CPU seconds the request's documents took so far
        chars = documents.MAX_TEXT_CHARS
        for served, loc in enumerate(where):
            path = documents.location_path(*loc)
            job = json.dumps(
                {
                    "docs": [[path, documents.pdf_data(req, loc)]],
                    "doc_cpu": self.doc_cpu,
                    "request_cpu": self.request_cpu,
                    "used": used,
                    "chars": chars,
                }
            ).encode()
            reply = await self._run(job, path, (served, arrival))
            if "error" in reply:
                error_path, why = reply["error"]
                raise InvalidRequest(error_path, why)
            text: str = reply["texts"][0]
            texts.append(text)
            used = float(reply["cpu"])
            chars -= len(text)
        return documents.with_texts(req, where, texts)

    async def _turn(self, key: tuple[int, int]) -> None:
        """Wait for a worker slot; among waiters, the lowest ``key`` is served first."""
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        entry = (key, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        try:
            await entry[1]
        except asyncio.CancelledError:
            if entry in self._waiting:
                self._waiting.remove(entry)
            elif entry[1].done() and not entry[1].cancelled():
                self._pass_on()  # handed a slot just as the client left: the next one's
            raise

    def _pass_on(self) -> None:
        """A slot is freed: to the waiter with the lowest key, or back to the pool."""
        while self._waiting:
            entry = min(self._waiting, key=lambda e: e[0])
            self._waiting.remove(entry)
            if not entry[1].done():
                entry[1].set_result(None)
                return
        self._free += 1

    async def _run(self, job: bytes, first: str, key: tuple[int, int]) -> dict[str, Any]:
        await self._turn(key)
        try:
            return await self._call(job, first)
        finally:
            self._pass_on()

    async def _call(self, job: bytes, first: str) -> dict[str, Any]:
        worker = self._idle.pop() if self._idle else await _Worker.start()
        self._busy.add(worker)
        done = False
        try:
            async with asyncio.timeout(_wall_limit(min(self.doc_cpu, self.request_cpu))):
                reply = await worker.call(job)
            done = True
            return reply
        except TimeoutError:
            raise InvalidRequest(first, "PDF documents could not be read in time") from None
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            _log.warning("pdf_worker_failed", returncode=worker.proc.returncode)
            raise InvalidRequest(first, "PDF could not be read (corrupt or not a PDF)") from None
        finally:
            self._busy.discard(worker)
            if done:
                self._idle.append(worker)
            else:  # cancelled (the client left), overstayed or broken: stop it now
                self.killed += 1
                self._stop(worker)

    def _stop(self, worker: _Worker) -> None:
        worker.kill()
        if worker.proc.stdin is not None:
            worker.proc.stdin.close()
        task = asyncio.get_running_loop().create_task(worker.proc.wait())
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)

    async def close(self) -> None:
        """Stop every worker (the app's cleanup)."""
        idle, self._idle = self._idle, []
        for worker in (*idle, *self._busy):
            self._stop(worker)
        if self._reaping:
            await asyncio.wait(set(self._reaping), timeout=5)
