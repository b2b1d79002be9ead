"""An HTTP/1.1 proxy on 127.0.0.1 in front of one engine that cuts streamed chat completions.

It forwards every request to the engine and, for the next ``cuts`` streamed chat completions
(:meth:`CuttingProxy.arm`), ends the reply after ``after`` SSE events: by resetting the
connection (the chunked body never ends) or by ending the body there, with no finish. That
is what the gateway sees when an engine dies mid-answer. It records every chat request body
(``chats``) and counts the streams it cut (``cut``).

Used by tests/e2e/test_continuation_llama.py and tests/e2e/test_router_upstream.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from typing import Any


class CuttingProxy:
    """An HTTP/1.1 proxy on 127.0.0.1 to one engine (see the module docstring)."""

    def __init__(self, target_root: str) -> None:
        self.target = target_root
        self.port = 0
        self.chats: list[dict[str, Any]] = []  # every chat request body, oldest first
        self.cut = 0  # streams cut so far
        self._cuts_left = 0
        self._after = 0
        self._how = "reset"
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def arm(self, cuts: int, after: int, how: str = "reset") -> None:
        """Cut the next ``cuts`` streamed chat completions after ``after`` SSE events:
        ``reset`` (the chunked body never ends) or ``eof`` (it ends there, no finish)."""
        with self._lock:
            self._cuts_left, self._after, self._how = cuts, after, how
            self.chats.clear()
            self.cut = 0

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the cutting proxy did not start")

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            # stop accepting and let the last accepted connections start before the close
            # (tests/otlp_collector.py says why), then end the streams still being forwarded:
            # each handler closes its writer
            for sock in server.sockets:
                self._loop.remove_reader(sock.fileno())
            self._loop.run_until_complete(asyncio.sleep(0.05))
            server.close()
            handlers = asyncio.all_tasks(self._loop)
            for task in handlers:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*handlers, return_exceptions=True))
            self._loop.run_until_complete(server.wait_closed())
            self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        method, path, _ = head[0].split(" ", 2)
        headers = dict(line.split(":", 1) for line in head[1:] if ":" in line)
        headers = {k.strip().lower(): v.strip() for k, v in headers.items()}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        cut_after = None
        if method == "POST" and path.endswith("/chat/completions"):
            payload = json.loads(body)
            with self._lock:
                self.chats.append(payload)
                if payload.get("stream") and self._cuts_left > 0:
                    self._cuts_left -= 1
                    cut_after = self._after
        response = await asyncio.to_thread(
            self._forward, method, path, body, headers.get("content-type")
        )
        with response:
            writer.write(
                f"HTTP/1.1 {response.status} {response.reason}\r\n"
                f"Content-Type: {response.headers.get('Content-Type', '')}\r\n"
                "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode()
            )
            events, pending = 0, b""
            while True:
                data = await asyncio.to_thread(response.read1, 65536)
                if not data:
                    break
                if cut_after is None:
                    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                    await writer.drain()
                    continue
                pending += data
                while b"\n\n" in pending and events < cut_after:
                    event, pending = pending.split(b"\n\n", 1)
                    event += b"\n\n"
                    writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                    events += 1
                await writer.drain()
                if events >= cut_after:
                    with self._lock:
                        self.cut += 1
                    if self._how == "reset":
                        writer.transport.abort()  # the chunked body never ends
                        return
                    break  # the body ends, with no finish
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    def _forward(self, method: str, path: str, body: bytes, ctype: str | None) -> Any:
        req = urllib.request.Request(
            self.target + path,
            data=body or None,
            method=method,
            headers={"Content-Type": ctype or "application/json"},
        )
        try:
            return urllib.request.urlopen(req, timeout=60)
        except urllib.error.HTTPError as err:
            return err
