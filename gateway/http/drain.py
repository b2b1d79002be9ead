"""The SIGTERM drain of live streams.

On SIGTERM (gateway/__main__.py) the server stops taking requests (the middleware answers
:data:`DRAINING_MESSAGE`, a 529), waits up to ``server.shutdown_grace`` for requests to
finish, then drains each stream still open: its handler task is cancelled with the
``draining`` message, and :func:`gateway.http.streaming.stream_failure` turns that cancel into
the failure envelope (``overloaded_error``), counted as the ``draining`` termination.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from gateway.http.keys import STATE, Drainable


class DrainHandle:
    """Lets a draining server end a stream with the failure envelope (see __main__)."""

    __slots__ = ("_streams", "draining", "task")

    def __init__(self, streams: set[Drainable]) -> None:
        self.task = asyncio.current_task()
        self.draining = False
        self._streams = streams

    def drain(self) -> None:
        self.draining = True
        if self.task is not None:
            self.task.cancel("draining")

    def release(self) -> None:
        """The stream ended: the drain has nothing more to end."""
        self._streams.discard(self)


def drainable(request: web.Request) -> DrainHandle:
    """Register the current stream so a SIGTERM drain can end it after the grace period;
    the stream calls ``release()`` when it ends."""
    streams = request.app[STATE].streams
    handle = DrainHandle(streams)
    streams.add(handle)
    return handle


DRAINING_MESSAGE = "Overloaded: the gateway is shutting down"
