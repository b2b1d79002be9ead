"""The one stream lifecycle both APIs use: open, count, drain, fail, close.

A stream to a client (Anthropic Messages events from :mod:`gateway.http.anthropic`, the
OpenAI pass-through's relayed events from :mod:`gateway.http.passthrough`) goes through
:class:`RelayedStream`, an async context manager around the caller's pump::

    async with RelayedStream(request, exchange, api, route, source, content_type=...) as stream:
        ...  # the hot path: read upstream, translate or relay, await stream.writer.write()
    return stream.writer.response

Entering opens the :class:`~gateway.http.writer.StreamWriter` (SSE headers, pings), counts the
stream in ``llm_gateway_streams_in_flight`` and registers it for the SIGTERM drain
(:mod:`gateway.http.drain`). Leaving:

- a failure after the first byte (:func:`stream_failure`: an upstream error or timeout, an
  SSE event past the decoder's size guard, the drain) ends the stream with the source's
  failure envelope (``source.fail``), which the client then reads as the stream's end;
- a bug of ours ends it the same way, as ``gateway_error``, logged with its traceback;
- the client leaving (``ClientGone``, a real cancellation) propagates: the middleware logs a
  499, and the termination is ``client_disconnect`` (nothing more reached the client);
- always: pings stop, the gauge goes down, the drain registration goes, and the stream's
  figures are recorded: by the caller's ``end`` hook, given how the stream ended (a Messages
  reply writes its one record of figures, :mod:`gateway.messages.from_chat.figures`);
  without one, the termination reason and the source's tokens are counted here (the
  pass-through); the response is ended unless the client left.

The source is what turns upstream bytes into client bytes (the ``StreamTranslator``, the
pass-through's ``Relay``): it says how the stream ended (``termination``), what it used
(``usage``) and writes the failure envelope (``fail``). Nothing here runs per chunk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Protocol

import structlog
from aiohttp import web

from gateway import errors
from gateway.http.drain import DRAINING_MESSAGE, DrainHandle, drainable
from gateway.http.keys import Exchange
from gateway.http.writer import PING, ClientGone, StreamWriter
from gateway.ops.config import ModelRoute
from gateway.text.sse import SSEEventTooLarge

__all__ = ["RelayedStream", "Source", "stream_failure"]

_log = structlog.get_logger("gateway.http.streaming")


class Source(Protocol):
    """What a stream relays from: a translator of upstream events to client events."""

    termination: str | None  # how the stream ended (None: not yet, or the client left)

    @property
    def usage(self) -> tuple[int, int] | None:
        """(input, output) tokens, as far as known; None when none were reported."""

    def fail(self, err: errors.GatewayError, reason: str) -> bytes:
        """End the stream with ``err`` (client-safe): the envelope to write."""


def stream_failure(
    exc: BaseException, handle: DrainHandle
) -> tuple[errors.GatewayError, str] | None:
    """How an exception met while relaying a stream ends it, for both APIs.

    (the error its envelope carries, the termination reason), or None when the
    exception must propagate (a real cancellation: the client left).
    """
    if isinstance(exc, errors.UpstreamTimeout):
        return exc, "idle_timeout"
    if isinstance(exc, errors.GatewayError):
        return exc, "upstream_error"
    if isinstance(exc, SSEEventTooLarge):  # an SSE event past the decoder's size guard
        return errors.StreamProcessingError(), "malformed_chunk"
    if isinstance(exc, asyncio.CancelledError) and handle.draining:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()  # the drain's cancel only ends this stream, not the handler
        return errors.Overloaded(DRAINING_MESSAGE), "draining"
    return None


class RelayedStream:
    """One stream to a client, from its first byte to its end (see the module docstring)."""

    __slots__ = (
        "_api",
        "_content_type",
        "_end_hook",
        "_gauge",
        "_handle",
        "_headers",
        "_metrics",
        "_model",
        "_ping_frame",
        "_request",
        "_server",
        "_source",
        "writer",
    )

    writer: StreamWriter

    def __init__(
        self,
        request: web.Request,
        exchange: Exchange,
        api: str,
        route: ModelRoute,
        source: Source,
        *,
        content_type: str,
        ping_frame: bytes = PING,
        end: Callable[[str], None] | None = None,
        writer: StreamWriter | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """``writer``: the client's stream, already open (a request that waited for its
        slot with pings: gateway/http/admission.py); None: opened on entering."""
        if writer is not None:
            self.writer = writer
        self._request = request
        self._api = api
        self._model = route.name
        self._source = source
        self._content_type = content_type
        self._ping_frame = ping_frame
        self._end_hook = end  # records the stream's figures, given its termination reason
        self._metrics = exchange.app.metrics
        self._server = exchange.app.config.server
        self._headers = headers  # more response headers (a limited client's ratelimit ones)

    async def __aenter__(self) -> RelayedStream:
        if not hasattr(self, "writer"):
            server = self._server
            self.writer = await StreamWriter.open(
                self._request,
                content_type=self._content_type,
                write_timeout=server.write_timeout,
                ping_interval=server.ping_interval,
                ping_frame=self._ping_frame,
                headers=self._headers,
            )
        self._gauge = self._metrics.in_flight.labels(self._api, self._model)
        self._gauge.inc()
        self._handle = drainable(self._request)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        source = self._source
        try:
            if exc is not None:
                envelope = self._envelope(exc)
                if envelope is None:  # the client left: nothing more reaches it
                    source.termination = None
                    return False
                await self.writer.write(envelope)
        except (ClientGone, asyncio.CancelledError):
            source.termination = None
            raise
        finally:
            self._end()
        await self.writer.close()
        return True

    def _envelope(self, exc: BaseException) -> bytes | None:
        """The failure envelope ending the stream, or None when ``exc`` must propagate."""
        if isinstance(exc, (SSEEventTooLarge, errors.GatewayError, asyncio.CancelledError)):
            failure = stream_failure(exc, self._handle)
            return None if failure is None else self._source.fail(*failure)
        if isinstance(exc, ClientGone) or not isinstance(exc, Exception):
            return None
        # a bug of ours: still end the stream well-formed
        _log.error("stream_translation_failed", model=self._model, exc_info=exc)
        return self._source.fail(errors.GatewayError(), "gateway_error")

    def _end(self) -> None:
        self.writer.stop_pinging()
        self._gauge.dec()
        self._handle.release()
        source = self._source
        reason = source.termination or "client_disconnect"
        if self._end_hook is not None:
            self._end_hook(reason)
            return
        metrics = self._metrics
        metrics.terminations.labels(self._api, self._model, reason).inc()
        metrics.count_tokens(self._model, source.usage)
