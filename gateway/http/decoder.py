"""The child process that decodes large request bodies (:mod:`gateway.text.json_child`).

One worker process per gateway process, started on the first body past
``server.decode_offload_bytes`` (spawn: a fresh interpreter, no copy of the gateway's
threads or sockets) and shut down with the app. It dies with the gateway, even of a
SIGKILL (:mod:`gateway.ops.lifeline`). Not forkserver: a forkserver's child holds the write
end of the pipe the forkserver watches for its parent's death (it passes it on to every
child), and the child's call queue holds both ends of its own pipe, so after a SIGKILL of
the gateway neither ever saw end of file and both, with the resource tracker, lived on with
the last body. Bodies queue for it in arrival order; the event loop only sends
the bytes and loads the ``marshal`` reply. ``decode_offload_bytes = 0`` decodes every body
on the loop, as before.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from aiohttp import web

from gateway.ops import lifeline
from gateway.text import json_child


class Decoder:
    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    async def decode(self, raw: bytes | bytearray, max_values: int) -> json_child.Outcome:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                initializer=lifeline.die_with_parent)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, json_child.decode, raw, max_values)
        except BrokenProcessPool:  # the child died (OOM-killed): a fresh one next time
            self._pool = None
            raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


DECODER = web.AppKey("decoder", Decoder)


async def decoder_ctx(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: the decoder lives as long as the app."""
    yield
    app[DECODER].close()
