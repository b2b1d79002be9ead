"""Writes held to the end of the event loop's pass and sent there together, when the loop is busy.

Why. A write that wakes a process asleep on another, idle CPU costs the writer far more than
one to a process that is awake: on a virtual machine the wake-up is an inter-processor
interrupt, a VM exit. Measured on this project's 2-core KVM machine (a socket pair, the
reader on the other core): 13-15 µs of the writer's CPU per write when the reader's core has
gone idle, 2.3 µs when it is busy. The gateway's peers on its host (the engine's HTTP server,
a local client, a sidecar) sleep between requests. Written the moment each request reached
its write, the gateway's writes came about 100 µs apart at 16 buffered Messages requests at
once, and nearly each one found its peer asleep again: 1.95 such interrupts per request,
against 0.75 for the lean floor translator, whose writes happen to come in runs. Held to the
end of the pass and sent back to back, they wake a peer about once a run: 0.32 per request,
and the gateway's CPU per request fell from about 200 to 165-170 µs (the floor: 126 µs).
With the idle core polling instead of halting (``haltpoll.guest_halt_poll_ns``) the
interrupts, and that part of the gap, disappear (docs/performance.md).

When. The first write of a pass goes at once, unless the last pass that wrote wrote more
than once (the loop is busy: its writes come in runs); every later write of the pass waits
for the pass's end. So one request at a time is never delayed (its answer does not wait for
its access line and metrics), and a loaded loop sends each pass's writes together.

What it costs. A held write leaves at the start of the loop's next pass, after the callbacks
already queued and one poll that does not wait: under a millisecond at 16 requests at once.
One ``call_soon`` per pass that writes, and so one more poll when nothing else is queued
(about 9-12 K instructions per buffered request at one at a time: 758 K -> 767-770 K when
it came). Several writes to one client connection in a pass leave as one system call.
Nothing is held past :data:`HOLD_LIMIT` bytes a connection (then what is held goes at once),
so a transport's write buffer and its backpressure see what is written as before, one pass
late at most.

Order. Writes to one connection keep their order; a close asked for while writes are held
happens after them; an abort drops them (as it drops the transport's own buffer). A write to
a transport that has closed meanwhile is dropped, as the transport itself would.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

HOLD_LIMIT = 64 * 1024  # bytes held for one connection before they go at once


class Coalescer:
    """The writes of one event loop's pass (see the module docstring)."""

    __slots__ = ("_busy", "_held", "_loop", "_open", "_writes")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        # a weak reference to the loop: the loop is the key of the table this is kept in.
        # Without one, the running loop (CPython 3.11's get_running_loop makes a getpid
        # system call each time)
        self._loop = weakref.ref(loop) if loop is not None else None
        # (transport, bytes | (bytes, ...)) for a bare transport; (HeldTransport, None)
        self._held: list[tuple[Any, Any]] = []
        self._open = False  # this pass has written: its end is scheduled
        self._writes = 0  # writes this pass
        self._busy = False  # the last pass that wrote wrote more than once

    def now(self) -> bool:
        """Count a write in this pass: True when it should go at once. The first write of a
        pass goes at once unless the last pass that wrote had several (a loaded loop: its
        writes come in runs); every later write of the pass waits for its end."""
        if self._open:
            self._writes += 1
            return False
        self._open = True
        self._writes = 1
        loop = self._loop() if self._loop is not None else None
        (loop or asyncio.get_running_loop()).call_soon(self._flush)
        return not self._busy

    def write(self, transport: asyncio.WriteTransport, data: bytes | tuple[bytes, ...]) -> None:
        """Write ``data`` (bytes, or a tuple written as one ``writelines``), now or at the
        end of the pass (:meth:`now`)."""
        if self.now():
            _put(transport, data)
        else:
            self._held.append((transport, data))

    def hold(self, transport: HeldTransport) -> None:
        self._held.append((transport, None))

    def _flush(self) -> None:
        self._open = False
        self._busy = self._writes > 1
        held = self._held
        if not held:
            return
        self._held = []
        for transport, data in held:
            try:
                if data is None:
                    transport.send_held()
                elif not transport.is_closing():
                    _put(transport, data)
            except (RuntimeError, OSError):  # closed meanwhile: its protocol is told
                continue


def _put(transport: asyncio.WriteTransport, data: bytes | tuple[bytes, ...]) -> None:
    if isinstance(data, tuple):
        transport.writelines(data)
    else:
        transport.write(data)


_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Coalescer] = (
    weakref.WeakKeyDictionary()
)


def for_loop(loop: asyncio.AbstractEventLoop) -> Coalescer:
    """The loop's coalescer (one per event loop; looked up per connection, not per write)."""
    out = _BY_LOOP.get(loop)
    if out is None:
        out = _BY_LOOP[loop] = Coalescer(loop)
    return out


class HeldTransport(asyncio.Transport):
    """A transport whose writes wait for the pass's end; everything else is the transport's.

    Given to aiohttp's server protocol in place of the client connection's transport, so
    every byte aiohttp writes for a response goes through it.
    """

    __slots__ = ("_buf", "_closing", "_out", "_size", "_t")

    def __init__(self, transport: asyncio.Transport, out: Coalescer) -> None:
        super().__init__()
        self._t = transport
        self._out = out
        self._buf: list[bytes] = []
        self._size = 0
        self._closing = False  # close() asked for while writes were held

    # --- writing ---------------------------------------------------------------------

    def write(self, data: Any) -> None:
        if not data or self._closing:
            return  # after close(): nothing more goes (the transport drops it too)
        buf = self._buf
        if not buf:
            transport = self._t
            if transport.is_closing():
                transport.write(data)  # the transport's own answer: dropped or refused
                return
            out = self._out
            if out.now():
                transport.write(data)
                return
            out.hold(self)
        buf.append(data)
        self._size += len(data)
        if self._size > HOLD_LIMIT:
            self.send_held()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def send_held(self) -> None:
        """Write what is held now (the coalescer at the pass's end, or past the limit)."""
        buf = self._buf
        if buf:
            data = buf[0] if len(buf) == 1 else b"".join(buf)
            buf.clear()
            self._size = 0
            transport = self._t
            if not transport.is_closing():
                transport.write(data)
        if self._closing:
            self._closing = False
            self._t.close()

    def write_eof(self) -> None:
        self.send_held()
        self._t.write_eof()

    def can_write_eof(self) -> bool:
        return self._t.can_write_eof()

    def get_write_buffer_size(self) -> int:
        return self._t.get_write_buffer_size() + self._size

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._t.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._t.set_write_buffer_limits(high, low)

    # --- closing ---------------------------------------------------------------------

    def close(self) -> None:
        if self._buf:
            self._closing = True  # after the held writes, at the pass's end
        else:
            self._t.close()

    def abort(self) -> None:
        self._buf.clear()
        self._size = 0
        self._closing = False
        self._t.abort()

    def is_closing(self) -> bool:
        return self._closing or self._t.is_closing()

    # --- the rest is the transport's -------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._t.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._t.pause_reading()

    def resume_reading(self) -> None:
        self._t.resume_reading()

    def is_reading(self) -> bool:
        return self._t.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._t.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._t.get_protocol()

    def __repr__(self) -> str:
        return f"<HeldTransport {self._t!r}>"
