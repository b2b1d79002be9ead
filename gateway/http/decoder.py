"""The child process that decodes large request bodies (:mod:`gateway.text.json_child`).

One worker process per gateway process, started on the first body past
``server.decode_offload_bytes`` (forkserver: no copy of the gateway's threads or sockets)
and shut down with the app. Bodies queue for it in arrival order; the event loop only sends
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

from gateway.text import json_child


class Decoder:
    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    async def decode(self, raw: bytes | bytearray, max_values: int) -> json_child.Outcome:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("forkserver"))
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
