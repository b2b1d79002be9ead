"""The Messages stream's hot loop: per upstream read, one SSE decode, one translation, one
write (:func:`pump`), and how a resumable stream was cut (:class:`Cut`, continued by
:mod:`gateway.messages.continuation`).

Cost per read: the decode (C-speed splits) and one translation step per
:data:`EVENTS_PER_STEP` events, each written as it is made; between two steps of one read
the event loop runs once (``asyncio.sleep(0)``), so a read of many events cannot hold it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from gateway import errors
from gateway.messages.stream.translator import StreamTranslator
from gateway.text import jsonutil
from gateway.text.sse import SSEDecoder

__all__ = ["EVENTS_PER_STEP", "Body", "Cut", "Timing", "pump"]


class Body(Protocol):
    """What :func:`pump` reads of a streamed reply: an upstream response
    (:class:`gateway.upstream.client.UpstreamResponse`) or a continuation's view of one
    (:class:`gateway.messages.stream.splice.Continued`)."""

    def progress(self) -> None:
        """Bytes that carried an event arrived: the stream's idle timeout restarts."""

    def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive; a failure raises its GatewayError."""
        ...

    def release_if_complete(self, *, ended: bool = False) -> None:
        """Mark the response reusable when its body has been read to the end."""


# A read holds at most this many events' translation before the event loop runs again: a
# read is up to 256 KiB (the connection's pause mark) plus one socket read, and a fast stream
# of tiny deltas packs thousands of events into it (about 10 us each: 2.5 ms a step). A
# read of fewer events is translated in one step, with no await of its own.
EVENTS_PER_STEP = 256


class Timing:
    """One upstream stream's clock (a reply's, or a web search round's)."""

    __slots__ = ("first_token", "last_chunk", "translate")

    def __init__(self, overhead: float) -> None:
        self.translate = overhead  # gateway's own CPU-bound time: setup + per-chunk work
        self.first_token = 0.0
        self.last_chunk = 0.0


class Cut:
    """How a resumable stream was cut (:func:`pump` with ``resumable``): ``error``, what
    reading the body raised; ``payload``, an in-band error chunk (not fed to the
    translator); neither: the body ended without a ``finish_reason``."""

    __slots__ = ("error", "payload")

    def __init__(
        self, error: errors.GatewayError | None = None, payload: bytes | None = None
    ) -> None:
        self.error = error
        self.payload = payload


_ERROR_KEY = b'"error"'  # in a chunk only as an error's key or value: JSON text escapes quotes


async def pump(
    up: Body,
    translator: StreamTranslator,
    write: Callable[[bytes], Awaitable[None]],
    timing: Timing,
    inter_chunk: Any,
    *,
    resumable: bool = False,
) -> Cut | None:
    """The hot path: per upstream read, one decode, one translation, one write.

    ``timing`` keeps the clock: the gateway's own time (``translate``), the first content
    block's arrival (``first_token``: the reply's TTFT and TPOT are read from it when it ends,
    gateway/messages/from_chat/figures.py) and the last chunk's.

    ``resumable``: a cut (the body failing, an in-band 5xx, the end without a
    ``finish_reason``) is returned as a :class:`Cut` with the translator left open, for
    the caller to continue (gateway/messages/continuation.py) or end; else the translator
    ends the stream with its failure envelope (a failure while reading raises).
    """
    decoder = SSEDecoder()
    clock = time.perf_counter
    feed_all = translator.feed_all
    for_chunk = decoder.feed
    progress = up.progress
    step = EVENTS_PER_STEP
    try:
        async for chunk in up.chunks():
            now = clock()
            if timing.last_chunk:
                inter_chunk.observe(now - timing.last_chunk)
            timing.last_chunk = now
            payloads = for_chunk(chunk)
            rest = 0  # where the events left for the next step of this read start
            if len(payloads) > step:
                batch, payloads, rest = payloads, payloads[:step], step
            while True:
                if resumable and payloads:  # (each payload: an event may span two reads)
                    payloads, failed = _until_failure(payloads)
                    if failed is not None:
                        if payloads:
                            progress()
                        out = feed_all(payloads) if payloads else b""
                        if out:
                            await write(out)
                        if translator.done:
                            return None
                        if translator.finish_seen:  # whole, as a read failing after it (below)
                            await write(translator.eof())
                            return None
                        return Cut(payload=failed)
                out = feed_all(payloads) if payloads else b""
                timing.translate += clock() - now
                if payloads:
                    progress()  # events, not blank lines or comments, keep a stream alive
                    if not timing.first_token and translator.output_started:
                        timing.first_token = now
                    if out:
                        await write(out)
                if translator.done:
                    up.release_if_complete(ended=translator.ended_by_done)
                    return None
                if not rest:
                    break
                # a read of many events (a fast stream of tiny deltas): the next step after
                # the event loop has run once, so no read holds it longer than one step
                await asyncio.sleep(0)
                now = clock()
                payloads = batch[rest : rest + step]
                rest = rest + step if rest + step < len(batch) else 0
    except errors.UpstreamError as err:
        if not resumable or translator.done:
            raise
        if translator.finish_seen:
            # the answer is whole (only its usage chunk or [DONE] was lost): asked again,
            # the engine would answer it again after itself. It ends as the finish said,
            # its usage the estimate (a partial last event is dropped)
            await write(translator.eof())
            return None
        return Cut(error=err)
    if resumable and not translator.finish_seen:
        return Cut()  # a partial last event is dropped: the continuation starts clean
    await write(feed_all(decoder.flush()) + translator.eof())
    return None


def _until_failure(payloads: list[bytes]) -> tuple[list[bytes], bytes | None]:
    """The payloads before the first in-band 5xx error, and that error's payload (None:
    there is none; "error" was in the chunk for another reason)."""
    for n, payload in enumerate(payloads):
        if payload.find(_ERROR_KEY) >= 0 and _server_error(payload):  # (find: see text/sse.py)
            return payloads[:n], payload
    return payloads, None


def _server_error(payload: bytes) -> bool:
    try:
        chunk = jsonutil.loads_upstream(payload)
    except ValueError:
        return False
    if type(chunk) is not dict:
        return False
    status = errors.inband_status(chunk)  # not mapped here: the translator maps it, once
    return status is not None and status >= 500
