"""A PDF worker process (``python -m gateway.messages.documents.pdf_worker``), run by
:mod:`.pdf_pool`.

Reads jobs from stdin and writes replies to stdout, each a frame of a 4-byte big-endian
length and a JSON object (stdlib ``json``: it round-trips any string a PDF's text may hold)::

    job:   {"docs": [[path, base64 data], ...], "doc_cpu": s, "request_cpu": s,
            "used": s, "chars": n}
    reply: {"texts": [text, ...], "cpu": s}  or  {"error": [path, why]}

A job is some of one request's PDFs (the pool sends one at a time, so requests take turns
at the workers), read in order with :func:`gateway.messages.documents.pdf_text.pdf_text` under two
CPU-time budgets: ``doc_cpu`` seconds a document and ``request_cpu`` for all of the
request's, of which its earlier jobs ``used`` some; ``chars``: the text the request may
still take. ``cpu`` in the reply: the request's CPU time with this job's. ``ITIMER_PROF``
counts this process's CPU time (user and system) and raises :class:`_OutOfCpu` in the
middle of pypdf's work: a ``BaseException``, so no ``except Exception`` on the way
swallows it. Wall-clock time is
the parent's business (it kills a worker that overstays, or whose client left).

The worker dies with its gateway (:mod:`gateway.ops.lifeline`: the gateway's pid is its
argument), even in the middle of a job: on Linux by ``PR_SET_PDEATHSIG``, elsewhere when
stdin reaches end of file, which a reader thread notices at once (jobs pass to the main
thread, where the CPU-time signal is handled). It writes nothing else to
stdout: stray output goes to stderr, and pypdf's warnings about hostile input are muted.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import struct
import sys
import threading
import time
from types import FrameType
from typing import Any, BinaryIO

import pypdf  # noqa: F401  imported at start: the first job's CPU budget is not spent on it

from gateway.errors import InvalidRequest
from gateway.messages.documents.pdf_text import MAX_TEXT_CHARS, pdf_text
from gateway.ops import lifeline

_HEAD = struct.Struct(">I")


class _OutOfCpu(BaseException):
    pass


def _on_timer(signum: int, frame: FrameType | None) -> None:
    raise _OutOfCpu


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """One request's PDFs as text, or the first failure (path, why)."""
    doc_cpu = float(job["doc_cpu"])
    request_cpu = float(job["request_cpu"])
    chars = int(job.get("chars", MAX_TEXT_CHARS))
    used = float(job.get("used", 0.0))
    texts: list[str] = []
    for path, data in job["docs"]:
        left = request_cpu - used
        cap = min(doc_cpu, left)
        if cap <= 0:
            return {"error": [path, _cpu_why(doc_cpu, request_cpu, per_request=True)]}
        t0 = time.process_time()
        signal.setitimer(signal.ITIMER_PROF, cap)
        try:
            text = pdf_text(data, f"{path}.source.data", chars)
        except _OutOfCpu:
            return {"error": [path, _cpu_why(doc_cpu, request_cpu, per_request=cap < doc_cpu)]}
        except InvalidRequest as err:
            return {"error": [err.path, err.why]}
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
            used += time.process_time() - t0
        chars -= len(text)
        texts.append(text)
    return {"texts": texts, "cpu": used}


def _cpu_why(doc_cpu: float, request_cpu: float, *, per_request: bool) -> str:
    if per_request:
        return (
            f"PDF documents in this request took more than {request_cpu:g} CPU seconds to "
            "read; send fewer or simpler PDFs"
        )
    return (
        f"PDF took more than {doc_cpu:g} CPU seconds to read (too many drawing "
        "operators, or too complex); send its text instead"
    )


def _read(stream: BinaryIO, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _reader(stdin: BinaryIO, jobs: queue.Queue[bytes]) -> None:
    """Jobs from stdin to the main thread; at end of file (the gateway is gone, even mid
    job) the process exits."""
    while (head := _read(stdin, _HEAD.size)) is not None:
        body = _read(stdin, _HEAD.unpack(head)[0])
        if body is None:
            break
        jobs.put(body)
    os._exit(0)


def main() -> None:
    if len(sys.argv) > 1:
        lifeline.die_with_parent(int(sys.argv[1]))
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print goes to stderr, never into a frame
    logging.getLogger("pypdf").setLevel(logging.CRITICAL)
    signal.signal(signal.SIGPROF, _on_timer)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us (stdin closes, or a kill)
    jobs: queue.Queue[bytes] = queue.Queue(maxsize=1)  # the pool sends one job at a time
    threading.Thread(target=_reader, args=(sys.stdin.buffer, jobs), daemon=True).start()
    while True:
        reply = json.dumps(run_job(json.loads(jobs.get()))).encode()
        out.write(_HEAD.pack(len(reply)) + reply)
        out.flush()


if __name__ == "__main__":
    main()
