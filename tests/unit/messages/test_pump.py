"""gateway/messages/stream/pump.py: a read of many events is translated a step at a time, the event
loop let run between two steps; a read of a few events costs no await of its own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.messages.stream.pump import EVENTS_PER_STEP, Timing, pump
from gateway.messages.stream.translator import StreamTranslator
from gateway.text.sse import SSEDecoder


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return (
        b"data: "
        + json.dumps(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        ).encode()
        + b"\n\n"
    )


def _stream(deltas: int) -> bytes:
    """A fast stream of tiny deltas, whole: what one read holds when the engine outruns us."""
    return (
        _chunk({"role": "assistant", "content": ""})
        + b"".join(_chunk({"content": "a"}) for _ in range(deltas))
        + _chunk({}, "stop")
        + b"data: [DONE]\n\n"
    )


class _Upstream:
    def __init__(self, reads: list[bytes]) -> None:
        self.reads = reads

    def progress(self) -> None:
        pass

    def release_if_complete(self, *, ended: bool = False) -> None:
        pass

    async def chunks(self) -> AsyncIterator[bytes]:
        for read in self.reads:  # each at once: the bytes are there, nothing to wait for
            yield read


class _Histogram:
    def observe(self, value: float) -> None:
        pass


def _translator() -> StreamTranslator:
    return StreamTranslator(model="m", message_id="msg_1", signing_key=b"k" * 32)


# (deltas in one read, least and most turns a neighbour gets while the read is translated)
READS = [
    (10, 0, 0),  # a few events: one step, no await of its own (the hot path)
    (EVENTS_PER_STEP - 3, 0, 0),  # with role, finish and [DONE]: one step exactly
    (EVENTS_PER_STEP, 1, 1),
    (20 * EVENTS_PER_STEP, 20, 20),
]


@pytest.mark.parametrize(("deltas", "least", "most"), READS)
@pytest.mark.parametrize("resumable", [False, True])
async def test_a_read_of_many_events_lets_the_event_loop_run(
    deltas: int, least: int, most: int, resumable: bool
) -> None:
    turns = 0
    running = True

    async def neighbour() -> None:
        nonlocal turns
        while running:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(neighbour())
    await asyncio.sleep(0)  # the neighbour is running
    before = turns
    written: list[bytes] = []

    async def write(data: bytes) -> None:
        written.append(data)

    body = _stream(deltas)
    translator = _translator()
    cut = await pump(
        _Upstream([body]), translator, write, Timing(0.0), _Histogram(), resumable=resumable
    )
    during = turns - before
    running = False
    await task
    assert cut is None and translator.done
    assert least <= during <= most
    # the same bytes as one step makes, in as many writes as steps
    whole = _translator()
    assert b"".join(written) == whole.feed_all(SSEDecoder().feed(body)) + whole.eof()
    assert len(written) == during + 1


async def test_an_inband_error_after_many_events_in_one_read_cuts_after_them() -> None:
    """A resumable stream's read of many events ending in an engine's 5xx: every step before
    it is written, the cut is returned with the error's payload (for the continuation)."""
    deltas = 3 * EVENTS_PER_STEP
    error = b'{"error":{"message":"engine died","code":500}}'
    body = _stream(deltas).split(_chunk({}, "stop"))[0] + b"data: " + error + b"\n\n"
    written: list[bytes] = []

    async def write(data: bytes) -> None:
        written.append(data)

    translator = _translator()
    cut = await pump(
        _Upstream([body]), translator, write, Timing(0.0), _Histogram(), resumable=True
    )
    assert cut is not None and cut.payload == error and cut.error is None
    assert not translator.done
    assert b"".join(written).count(b'"text_delta"') == deltas
