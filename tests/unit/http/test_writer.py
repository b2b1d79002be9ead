"""The client stream writer (gateway/http/writer.py): a client that stops reading is dropped.

Protocol facts relied on:

* an asyncio transport pauses its protocol when its write buffer goes *above* the
  high-water mark, and resumes it at or below the low-water mark;
* aiohttp's ``StreamResponse.write`` frames each write as an HTTP/1.1 chunk
  (``<hex len>\\r\\n`` + data + ``\\r\\n``), so the transport receives more bytes than
  the caller passed; it awaits ``drain()`` (which waits while the protocol is paused)
  once the bytes written since the last drain pass 64 KiB.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from gateway.http.keys import EXCHANGE, AppView, Exchange
from gateway.http.writer import ClientGone, StreamWriter, send_buffered

_WRITE_TIMEOUT = 0.2
# How late a timer may fire on a loaded machine: "hung" means no timeout at all
_LATE = 2.0


async def _serve_a_client_that_never_reads(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]], outcome: asyncio.Future[str]
) -> str:
    """Serve ``handler`` to one client that sends a request and never reads the reply (a
    4 KiB receive buffer); the handler's ``outcome``, within 10 s."""
    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(client, ("127.0.0.1", port))
        await asyncio.get_running_loop().sock_sendall(client, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        return await asyncio.wait_for(outcome, 10.0)
    finally:
        client.close()
        await runner.cleanup()


async def test_fast_path_write_that_pauses_the_transport_still_times_out() -> None:
    """A client that stopped reading must be dropped after write_timeout, whatever the size.

    The fast path in ``StreamWriter.write`` skips the timer when ``size <= low`` and
    ``size + len(data) < high``; but the transport also receives the chunk framing
    (and, on a response's first write, the buffered headers), so a write of just under
    ``high - size`` bytes pushes the buffer above ``high``, pauses the protocol, and
    aiohttp's drain then waits for a client that never reads: no timeout at all.
    """
    outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def handler(request: web.Request) -> web.StreamResponse:
        request[EXCHANGE] = Exchange(AppView(), "req_test", "", False)
        transport = request.transport
        assert transport is not None
        transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        writer = await StreamWriter.open(
            request,
            content_type="text/event-stream",
            write_timeout=_WRITE_TIMEOUT,
            ping_interval=None,
        )
        try:
            await writer.write(b"a" * 2000)  # headers + a first event, into the socket
            # the client is not reading: fill the kernel's buffers until the transport
            # holds bytes itself, staying far below its low-water mark
            for _ in range(20000):
                if transport.get_write_buffer_size() > 0:
                    break
                transport.write(b"\0" * 256)
            size = transport.get_write_buffer_size()
            low, high = transport.get_write_buffer_limits()  # type: ignore[attr-defined]
            assert 0 < size <= low
            data = b"b" * (high - size - 1)  # size + len(data) < high: the fast path
            try:
                async with asyncio.timeout(_WRITE_TIMEOUT + _LATE):
                    await writer.write(data)
                outcome.set_result("returned")
            except ClientGone:
                outcome.set_result("client_gone")  # write_timeout applied
            except TimeoutError:
                outcome.set_result("hung")  # still waiting long after write_timeout
        finally:
            writer.stop_pinging()
            transport.abort()
        return writer.response

    result = await _serve_a_client_that_never_reads(handler, outcome)
    # Expected: the write either returns at once or gives up after write_timeout.
    assert result in ("returned", "client_gone"), result


async def test_closing_a_stream_to_a_client_that_stopped_reading_is_bounded() -> None:
    """``write_eof`` (the chunked terminator) awaits ``drain()`` whatever was written before,
    where ``write`` drains only past 64 KiB written since the last drain: a last batch that
    took the transport above its high-water mark returns at once, and ending the stream then
    waited for a client that never reads, with no timeout, holding the handler (its upstream
    connection and its model's concurrency slot). It gives up after write_timeout."""
    outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def handler(request: web.Request) -> web.StreamResponse:
        request[EXCHANGE] = Exchange(AppView(), "req_test", "", False)
        transport = request.transport
        assert transport is not None
        transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        writer = await StreamWriter.open(
            request,
            content_type="text/event-stream",
            write_timeout=_WRITE_TIMEOUT,
            ping_interval=None,
        )
        try:
            await writer.write(b"a" * 2000)
            for _ in range(20000):  # the client is not reading: fill the kernel's buffers
                if transport.get_write_buffer_size() > 0:
                    break
                transport.write(b"\0" * 256)
            low, high = transport.get_write_buffer_limits()  # type: ignore[attr-defined]
            transport.write(b"\0" * (low + 1024))  # earlier events still in the buffer
            await writer.write(b"b" * (high - low))  # the last batch: returns, paused
            assert transport.get_write_buffer_size() > high
            try:
                async with asyncio.timeout(_WRITE_TIMEOUT + _LATE):
                    await writer.close()
                outcome.set_result("closed")
            except TimeoutError:
                outcome.set_result("hung")
        finally:
            transport.abort()
        return writer.response

    result = await _serve_a_client_that_never_reads(handler, outcome)
    assert result == "closed", result


@pytest.mark.parametrize(
    ("size", "timers"),
    [
        (1000, 0),  # a reply of a few KB to a reading client: no timer
        (30 * 1024, 0),  # well under the transport's 64 KiB high-water mark
        (200 * 1024, 1),  # past it: the write may wait on the client, so it is timed
    ],
    ids=["1k", "30k", "200k"],
)
async def test_send_buffered_times_only_a_reply_that_may_wait(
    size: int, timers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A buffered reply whose head and body fit the transport's room cannot wait on the
    client (aiohttp's drain returns at once): it is sent without a timer; one that may
    fill the buffer is sent under write_timeout. Either way the client gets it whole."""
    made = []
    real = asyncio.timeout

    def counted(delay: float | None) -> asyncio.Timeout:
        made.append(delay)
        return real(delay)

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.Response(body=b"x" * size, content_type="application/json")
        monkeypatch.setattr(asyncio, "timeout", counted)
        try:
            assert await send_buffered(request, resp, 5.0)
        finally:
            monkeypatch.setattr(asyncio, "timeout", real)
        return resp

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/") as got,
        ):
            assert got.status == 200
            assert len(await got.read()) == size
    finally:
        await runner.cleanup()
    assert made.count(5.0) == timers, made
