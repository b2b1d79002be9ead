"""The only code that writes a stream to the client.

SSE headers (no caching, no proxy buffering, never compressed), one
``await resp.write()`` per batch of events (that await *is* the backpressure:
aiohttp drains past its high-water mark and waits while the transport is
paused), a write timeout for a client that stopped reading, and a ping while
the upstream is silent. A failed write means the client is gone:
:class:`ClientGone` is raised and the caller closes the upstream response.

A buffered reply (a ``web.Response`` a handler returns) is sent by :func:`send_buffered`
under the same ``write_timeout``: aiohttp would otherwise wait on a client that stopped
reading for as long as the connection lives (a whole body is one write).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from aiohttp import web

from gateway.http import compat
from gateway.http.keys import EXCHANGE

PING = b'event: ping\ndata: {"type":"ping"}\n\n'
_FRAMING = compat.WRITE_FRAMING


class ClientGone(Exception):
    """The client disconnected or stopped reading."""


class StreamWriter:
    __slots__ = (
        "_last_write",
        "_loop",
        "_ping_frame",
        "_ping_interval",
        "_pinger",
        "_resp",
        "_transport",
        "_water",
        "_write_timeout",
    )

    def __init__(
        self,
        resp: web.StreamResponse,
        *,
        write_timeout: float,
        ping_interval: float | None,
        ping_frame: bytes = PING,
    ) -> None:
        self._resp = resp
        self._write_timeout = write_timeout
        self._ping_interval = ping_interval
        self._ping_frame = ping_frame
        self._loop = asyncio.get_running_loop()
        self._last_write = self._loop.time()
        self._pinger: asyncio.Task[None] | None = None
        self._transport: asyncio.Transport | None = None
        self._water = (0, 0)  # the transport's (low, high) write-buffer marks

    @classmethod
    async def open(
        cls,
        request: web.Request,
        *,
        content_type: str,
        write_timeout: float,
        ping_interval: float | None,
        ping_frame: bytes = PING,
        headers: Mapping[str, str] | None = None,
    ) -> StreamWriter:
        exchange = request[EXCHANGE]
        resp = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": content_type,
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                "request-id": exchange.request_id,
            },
        )
        if headers:
            resp.headers.update(headers)
        exchange.stream_response = resp  # the middleware must not render errors after this
        try:
            await resp.prepare(request)
        except (ConnectionError, RuntimeError) as exc:
            raise ClientGone() from exc
        self = cls(
            resp, write_timeout=write_timeout, ping_interval=ping_interval, ping_frame=ping_frame
        )
        transport = request.transport
        if transport is not None:  # None: the client is already gone
            self._transport = transport  # type: ignore[assignment]
            self._water = transport.get_write_buffer_limits()  # type: ignore[attr-defined]
        if ping_interval:
            self._pinger = asyncio.create_task(self._ping_loop())
        return self

    @property
    def response(self) -> web.StreamResponse:
        return self._resp

    async def write(self, data: bytes) -> None:
        self._last_write = self._loop.time()
        try:
            transport = self._transport
            if transport is not None and not transport.is_closing():
                size = transport.get_write_buffer_size()
                low, high = self._water
                if size <= low and size + len(data) + _FRAMING < high:
                    # The transport is not paused (its buffer is at or below the low-water
                    # mark) and will not pause on this write, so aiohttp's drain returns at
                    # once: no timer needed. The usual case: a reading client's buffer is 0.
                    await self._resp.write(data)
                    return
            # This write may wait for the client to read: a client that stopped reading
            # is dropped after write_timeout.
            async with asyncio.timeout(self._write_timeout):
                await self._resp.write(data)
        except (ConnectionError, RuntimeError, TimeoutError) as exc:
            raise ClientGone() from exc

    async def _ping_loop(self) -> None:
        interval = self._ping_interval
        assert interval
        try:
            while True:
                delay = self._last_write + interval - self._loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                    continue
                await self.write(self._ping_frame)
        except ClientGone:
            return

    def stop_pinging(self) -> None:
        """Cancel the ping timer; every path out of a stream calls this (also on errors)."""
        if self._pinger is not None:
            self._pinger.cancel()
            self._pinger = None

    async def close(self) -> None:
        """Stop pinging and end the response (best effort if the client is gone)."""
        self.stop_pinging()
        try:
            # write_eof drains whatever is buffered, unlike a write: bounded as a write is
            async with asyncio.timeout(self._write_timeout):
                await self._resp.write_eof()
        except TimeoutError:  # the client stopped reading: drop it, as a write would
            if self._transport is not None:
                self._transport.abort()
        except (ConnectionError, RuntimeError):
            pass


# room past this is not compared with the head's size: a buffered reply's headers are the
# gateway's own (ids, content types, the limits' numbers), about 1 KB at most
_SMALL_HEAD = 16384


def _head(resp: web.StreamResponse) -> int:
    """The response head's size, about (aiohttp adds the status line and a few headers:
    ``_FRAMING`` allows for them)."""
    return sum(len(k) + len(v) + 4 for k, v in resp.headers.items())


async def send_buffered(
    request: web.Request, resp: web.StreamResponse, write_timeout: float
) -> bool:
    """Send a handler's whole reply, headers and body, within ``write_timeout``; False when
    the client is gone or stopped reading (its connection is then aborted). aiohttp's own
    prepare and write_eof that follow the middleware find the reply sent and do nothing.

    A reply that fits the transport's room (nothing waiting in its buffer, and head and body
    under its high-water mark) cannot wait on the client: aiohttp's drain returns at once,
    so it is sent without a timer (the usual case: a reading client, a reply of a few KB)."""
    transport = request.transport
    body = resp.body if isinstance(resp, web.Response) else None
    if (
        transport is not None
        and isinstance(body, bytes)
        and not resp.compression
        and not transport.is_closing()
    ):
        size = transport.get_write_buffer_size()
        low, high = transport.get_write_buffer_limits()  # type: ignore[attr-defined]
        room = high - size - len(body) - _FRAMING
        if size <= low and room > 0 and (room > _SMALL_HEAD or _head(resp) < room):
            try:
                await resp.prepare(request)
                await resp.write_eof()
            except (ConnectionError, RuntimeError):
                return False
            return True
    try:
        async with asyncio.timeout(write_timeout):
            await resp.prepare(request)
            await resp.write_eof()
        return True
    except TimeoutError:
        transport = request.transport
        if transport is not None:
            transport.abort()
        return False
    except (ConnectionError, RuntimeError):
        return False
