"""The child process that decodes large JSON bodies (:mod:`gateway.text.json_child`).

One worker process per gateway process, started on the first body past
``server.decode_offload_bytes`` (spawn: a fresh interpreter, no copy of the gateway's
threads or sockets) and shut down with the app. It dies with the gateway, even of a
SIGKILL (:mod:`gateway.ops.lifeline`). Not forkserver: a forkserver's child holds the write
end of the pipe the forkserver watches for its parent's death (it passes it on to every
child), and the child's call queue holds both ends of its own pipe, so after a SIGKILL of
the gateway neither ever saw end of file and both, with the resource tracker, lived on with
the last body. Starting it is done in a thread: a spawn imports the gateway in the child and
waits for it (measured: the loop stopped 1.06 s when this ran on it, under four 30 MiB
bodies). Bodies queue for it in arrival order; the event loop only sends the bytes and loads
the ``marshal`` reply. ``decode_offload_bytes = 0`` decodes every body on the loop, as before.

Three kinds of work go there: a client's request body (:meth:`Decoder.decode`, strict) and a
buffered upstream reply (:meth:`Decoder.loads_upstream`, as
:func:`gateway.text.jsonutil.loads_upstream` decodes it: 20 tool calls of 250 KiB
arguments, 5.9 MB, held the loop about 60 ms), and ``count_tokens``' large JSON
(:meth:`Decoder.run`: gateway/text/tokenizer_json.py).
"""

from __future__ import annotations

import asyncio
import marshal
import multiprocessing
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from aiohttp import web

from gateway.ops import lifeline
from gateway.text import json_child

T = TypeVar("T")


def _start() -> ProcessPoolExecutor:
    """A pool whose one child is up (run in a thread: the spawn blocks until it is)."""
    pool = ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=lifeline.die_with_parent,
    )
    try:
        pool.submit(int).result()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    return pool


class Decoder:
    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._starting = asyncio.Lock()
        self._closed = False

    async def decode(self, raw: bytes | bytearray, max_values: int) -> json_child.Outcome:
        """The strict decode of a request body (:func:`json_child.decode`)."""
        return await self._run(json_child.decode, raw, max_values)

    async def loads_upstream(self, raw: bytes | bytearray) -> Any:
        """An upstream's JSON body decoded as ``jsonutil.loads_upstream`` does; ValueError
        when it is not JSON."""
        match await self._run(json_child.decode_upstream, raw):
            case ("ok", bytes() as packed):
                return marshal.loads(packed)
        raise ValueError("the upstream body is not JSON")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the child: a pure module's function (the child imports it),
        picklable arguments and result (count_tokens' JSON, gateway/messages/tokens.py)."""
        return await self._run(fn, *args)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        pool = self._pool
        if pool is None:
            async with self._starting:
                if self._pool is None:
                    started = await asyncio.to_thread(_start)
                    if self._closed:
                        started.shutdown(wait=False, cancel_futures=True)
                        raise BrokenProcessPool("the decoder is shut down")
                    self._pool = started
                pool = self._pool
        try:
            result: T = await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
            return result
        except BrokenProcessPool:  # the child died (OOM-killed): a fresh one next time
            if self._pool is pool:
                self._pool = None
            raise

    def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


DECODER = web.AppKey("decoder", Decoder)


async def decoder_ctx(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: the decoder lives as long as the app."""
    yield
    app[DECODER].close()
