"""Writes held to the end of the loop's pass (gateway/ops/coalesce.py), through a recording
transport: when a write goes, in what order, joined how, and what close and abort do to
what is held."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest

from gateway.ops import coalesce
from gateway.ops.coalesce import HOLD_LIMIT, Coalescer, HeldTransport


class Recorder(asyncio.Transport):
    """What reaches the socket, in order, across every recorder of a test."""

    def __init__(self, name: str, log: list[tuple[str, Any]]) -> None:
        super().__init__()
        self.name = name
        self.log = log
        self.closing = False
        self.buffered = 0

    def write(self, data: Any) -> None:
        if self.closing:
            raise RuntimeError("closed")
        self.log.append((self.name, bytes(data)))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def close(self) -> None:
        self.closing = True
        self.log.append((self.name, "close"))

    def abort(self) -> None:
        self.closing = True
        self.log.append((self.name, "abort"))

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


async def a_pass() -> None:
    """Let the current pass end: the coalescer's flush was queued before this wake-up."""
    await asyncio.sleep(0)


async def settle() -> None:
    """Two passes: the coalescer forgets that the last pass was busy."""
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_passes_first_write_goes_now_and_the_rest_at_its_end_in_order() -> None:
    log: list[tuple[str, Any]] = []
    out = Coalescer()
    a, b = Recorder("a", log), Recorder("b", log)
    out.write(a, b"1")
    assert log == [("a", b"1")]  # the first write of a quiet loop: no pass of delay
    out.write(b, b"2")
    out.write(a, (b"3", b"4"))
    assert log == [("a", b"1")]
    await a_pass()
    assert log == [("a", b"1"), ("b", b"2"), ("a", b"34")]


async def test_after_a_pass_of_several_writes_every_write_waits_until_a_quiet_pass() -> None:
    log: list[tuple[str, Any]] = []
    out = Coalescer()
    t = Recorder("t", log)
    out.write(t, b"1")
    out.write(t, b"2")
    await a_pass()
    assert log == [("t", b"1"), ("t", b"2")]
    out.write(t, b"3")  # the loop is busy: its runs of writes leave together
    assert log == [("t", b"1"), ("t", b"2")]
    await a_pass()
    assert log[-1] == ("t", b"3")
    out.write(t, b"4")  # the pass before wrote once: the loop is quiet again
    assert log[-1] == ("t", b"4")


async def test_one_write_a_pass_is_never_delayed() -> None:
    log: list[tuple[str, Any]] = []
    out = Coalescer()
    t = Recorder("t", log)
    for i in range(5):
        out.write(t, b"%d" % i)
        assert log[-1] == ("t", b"%d" % i)
        await a_pass()


async def test_a_held_write_to_a_transport_closed_meanwhile_is_dropped_and_the_rest_go() -> None:
    log: list[tuple[str, Any]] = []
    out = Coalescer()
    a, b, c = (Recorder(n, log) for n in "abc")
    out.write(a, b"first")
    out.write(b, b"lost")
    out.write(c, b"kept")
    b.closing = True  # the upstream went away before the pass ended
    await a_pass()
    assert log == [("a", b"first"), ("c", b"kept")]


async def test_a_write_that_raises_does_not_keep_the_others_back() -> None:
    log: list[tuple[str, Any]] = []
    out = Coalescer()
    a, b, c = (Recorder(n, log) for n in "abc")

    def broken(data: Any) -> None:
        raise OSError("gone")

    b.write = broken  # type: ignore[method-assign]
    out.write(a, b"1")
    out.write(b, b"2")
    out.write(c, b"3")
    await a_pass()
    assert log == [("a", b"1"), ("c", b"3")]


async def test_a_held_transport_joins_a_passes_writes_into_one_and_counts_them_buffered() -> None:
    log: list[tuple[str, Any]] = []
    out = Coalescer()
    raw = Recorder("client", log)
    raw.buffered = 7
    held = HeldTransport(raw, out)
    held.write(b"head ")  # first write of the pass: now
    held.write(b"body ")
    held.writelines([b"more", b"!"])
    assert log == [("client", b"head ")]
    assert held.get_write_buffer_size() == 7 + len(b"body more!")
    await a_pass()
    assert log == [("client", b"head "), ("client", b"body more!")]
    assert held.get_write_buffer_size() == 7
    assert held.get_extra_info("peername") == ("127.0.0.1", 1)


async def test_a_close_asked_for_while_writes_are_held_happens_after_them() -> None:
    log: list[tuple[str, Any]] = []
    out = Coalescer()
    other = Recorder("other", log)
    raw = Recorder("client", log)
    held = HeldTransport(raw, out)
    out.write(other, b"x")  # someone else wrote first this pass
    held.write(b"answer")
    held.close()
    assert held.is_closing()
    assert ("client", "close") not in log
    held.write(b"late")  # after close: nothing more goes
    await a_pass()
    assert log == [("other", b"x"), ("client", b"answer"), ("client", "close")]


async def test_close_with_nothing_held_closes_now_and_abort_drops_what_is_held() -> None:
    log: list[tuple[str, Any]] = []
    out = Coalescer()
    one = HeldTransport(Recorder("one", log), out)
    one.close()
    assert log == [("one", "close")]
    out.write(Recorder("first", log), b"x")
    two = HeldTransport(Recorder("two", log), out)
    two.write(b"never")
    two.abort()
    await a_pass()
    assert log == [("one", "close"), ("first", b"x"), ("two", "abort")]


async def test_past_the_hold_limit_what_is_held_goes_at_once() -> None:
    log: list[tuple[str, Any]] = []
    out = Coalescer()
    out.write(Recorder("first", log), b"x")
    held = HeldTransport(Recorder("client", log), out)
    chunk = b"e" * (HOLD_LIMIT // 2)
    held.write(chunk)
    held.write(chunk)
    assert log == [("first", b"x")]  # at the limit, not past it
    held.write(b"!")
    assert log == [("first", b"x"), ("client", chunk + chunk + b"!")]
    assert held.get_write_buffer_size() == 0
    held.write(b"tail")
    await a_pass()
    assert log[-1] == ("client", b"tail")


async def test_each_loop_has_its_own_coalescer_and_a_closed_loop_is_not_kept() -> None:
    mine = coalesce.for_loop(asyncio.get_running_loop())
    assert coalesce.for_loop(asyncio.get_running_loop()) is mine
    loop = asyncio.new_event_loop()
    theirs = coalesce.for_loop(loop)
    assert theirs is not mine
    gone = weakref.ref(loop)
    loop.close()
    del loop
    gc.collect()
    assert gone() is None  # the table keeps no loop alive (its coalescer holds none)


@pytest.mark.parametrize("busy", [False, True])
async def test_writes_to_one_transport_keep_their_order_across_passes(busy: bool) -> None:
    log: list[tuple[str, Any]] = []
    out = Coalescer()
    raw = Recorder("client", log)
    held = HeldTransport(raw, out)
    sent = []
    for i in range(6):
        for j in range(3 if busy else 1):
            data = b"%d.%d;" % (i, j)
            sent.append(data)
            held.write(data)
        await a_pass()
    await settle()
    assert b"".join(d for _, d in log) == b"".join(sent)
