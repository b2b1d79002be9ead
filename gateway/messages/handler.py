"""``POST {prefix}/v1/messages`` (buffered and streamed) and ``/v1/messages/count_tokens``.

The I/O shell around the pure modules: read (bounded and strict, :mod:`gateway.body`)
-> validate -> route -> to_chat -> upstream -> from_chat (buffered) or SSE decoder ->
StreamTranslator -> writer (streamed). Before the first byte reaches the client a failure is a
JSON error response with its real status (raised, rendered by the
middleware); after it, the translator ends the stream itself with the
failure envelope (the stream's lifecycle, shared with the OpenAI pass-through, is
:mod:`gateway.streaming`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from gateway import errors, ids, jsonutil, routing, streaming
from gateway.admission import admitted
from gateway.appkeys import CONFIG, METRICS, REQUEST_ID, SECRETS, STREAM, UPSTREAMS
from gateway.body import read_json
from gateway.config import ModelRoute
from gateway.messages import documents, tokens
from gateway.messages.aggregate import aggregate
from gateway.messages.from_chat import from_chat
from gateway.messages.signatures import restore_reasoning
from gateway.messages.stream import StreamTranslator
from gateway.messages.tables import LOCAL_STOP_KINDS, hides_thinking
from gateway.messages.to_chat import to_chat
from gateway.messages.validate import validate_messages
from gateway.sse import SSEDecoder
from gateway.upstream import UpstreamResponse

_log = structlog.get_logger("gateway.messages")


async def _pdfs_as_text(req: dict[str, Any]) -> dict[str, Any]:
    """The request with its PDFs as text; the extraction (CPU work) runs off the event loop."""
    where = documents.find_pdfs(req["messages"])  # a walk of user blocks, no copies
    if not where:
        return req
    return await asyncio.to_thread(documents.pdfs_to_text, req, where)


class Call:
    """One Messages request made ready for its upstream: what both an interactive request
    and a batch request (gateway/batches/) send, and how the reply is read back."""

    __slots__ = ("client", "match_stops", "payload", "req", "route", "stops", "stream",
                 "upstream_stream")

    def __init__(self, app: web.Application, req: dict[str, Any], route: ModelRoute) -> None:
        server = app[CONFIG].server
        self.req = req
        self.route = route
        self.stream = req.get("stream") is True
        self.stops = _stops(req)
        # An upstream that cannot say which stop string matched is streamed even for a
        # buffered reply: the gateway matches the stop sequences itself and cuts it there.
        self.match_stops = bool(self.stops) and route.upstream.kind in LOCAL_STOP_KINDS
        self.upstream_stream = self.stream or self.match_stops
        chat_req = to_chat(req if self.upstream_stream == self.stream
                           else {**req, "stream": True}, route,
                           keep_billing_header=server.keep_billing_header,
                           on_drop=app[METRICS].drop_field)
        self.payload = jsonutil.dumpb(chat_req)
        self.client = app[UPSTREAMS][route.upstream.name]

    def translator(self, app: web.Application) -> StreamTranslator:
        return StreamTranslator(
            model=self.req["model"], message_id=ids.new_message_id(),
            signing_key=app[CONFIG].server.signing_key, stop_sequences=self.stops,
            match_stops=self.match_stops,
            input_tokens=tokens.estimate_from_bytes(len(self.payload)),
            hosts=self.client.hosts, secrets=app[SECRETS],
            hide_thinking=hides_thinking(self.req))

    async def reply(self, app: web.Application, up: UpstreamResponse,
                    overhead: float | None = None) -> dict[str, Any]:
        """The buffered reply (a ``message`` object) from the upstream's answer; a failure
        raises its GatewayError. ``overhead``: the time spent before the upstream call, to
        observe with this translation's as the request's own CPU-bound time."""
        metrics = app[METRICS]
        route = self.route
        if self.upstream_stream:
            events = await _collect(up, self.translator(app), metrics, route)
            t1 = time.perf_counter()
            message = aggregate(events)
        else:
            raw = await up.read()
            t1 = time.perf_counter()
            message = self._from_chat(app, raw)
        if overhead is not None:
            metrics.overhead.labels("messages").observe(overhead + time.perf_counter() - t1)
        return message

    def _from_chat(self, app: web.Application, raw: bytes) -> dict[str, Any]:
        metrics = app[METRICS]
        route = self.route
        try:
            completion = jsonutil.loads_upstream(raw)
        except ValueError:
            raise errors.StreamProcessingError() from None
        return from_chat(
            completion, model=self.req["model"], stop_sequences=self.stops,
            signing_key=app[CONFIG].server.signing_key,
            on_bad_tool_args=lambda: _bad_tool_args(metrics, route.name, 1),
            hide_thinking=hides_thinking(self.req),
            hosts=self.client.hosts, secrets=app[SECRETS],
        )


async def prepare(app: web.Application, req: dict[str, Any], route: ModelRoute) -> Call:
    """A validated request's replayed reasoning restored and its PDFs made text, ready."""
    restore_reasoning(req, app[CONFIG].server.signing_key)
    return Call(app, await _pdfs_as_text(req), route)


async def create_message(request: web.Request) -> web.StreamResponse:
    t0 = time.perf_counter()
    app = request.app
    req = validate_messages(await read_json(request))
    restore_reasoning(req, app[CONFIG].server.signing_key)
    route = routing.resolve(request, req["model"])
    call = Call(app, await _pdfs_as_text(req), route)
    request[STREAM] = call.stream
    overhead = time.perf_counter() - t0
    with admitted(request, route):
        up = await routing.send(request, route, call.client, "/chat/completions", call.payload,
                                stream=call.upstream_stream, max_tokens=req.get("max_tokens"))
        async with up:
            if call.stream:
                return await _stream(request, route, up, call.translator(app), t0, overhead)
            message = await call.reply(app, up, overhead)
        body = jsonutil.dumpb(message)
    _count_reply(request, route, message["stop_reason"],
                 (message["usage"]["input_tokens"], message["usage"]["output_tokens"]))
    return web.Response(body=body, content_type="application/json",
                        headers={"request-id": request[REQUEST_ID]})


async def _collect(up: UpstreamResponse, translator: StreamTranslator,
                   metrics: Any, route: ModelRoute) -> bytes:
    """Translate a whole upstream stream for a buffered reply; a failure raises."""
    events: list[bytes] = []

    async def keep(data: bytes) -> None:
        events.append(data)

    try:
        await _pump(up, translator, keep, _Timing(0.0), metrics.inter_chunk.labels(route.name))
    except ValueError:  # an SSE event past the decoder's size guard
        raise errors.StreamProcessingError() from None
    if translator.error is not None:
        raise translator.error
    if translator.dropped_tool_deltas:
        _bad_tool_args(metrics, route.name, translator.dropped_tool_deltas)
    return b"".join(events)


def _bad_tool_args(metrics: Any, model: str, count: int) -> None:
    """Tool-call arguments that were not JSON, or deltas for no known call: warn and count."""
    _log.warning("tool_arguments_dropped", model=model, count=count)
    metrics.tool_arg_errors.labels(model).inc(count)


def _stops(req: dict[str, Any]) -> tuple[str, ...]:
    stops = req.get("stop_sequences")
    if isinstance(stops, str):
        return (stops,)
    return tuple(stops or ())


def _count_reply(request: web.Request, route: ModelRoute, stop_reason: str | None,
                 usage: tuple[int, int]) -> None:
    """A buffered reply's stop reason and tokens (a stream's are counted as it ends)."""
    metrics = request.app[METRICS]
    if stop_reason:
        metrics.stop_reasons.labels(route.name, stop_reason).inc()
    streaming.count_tokens(metrics, route.name, usage)


async def _stream(request: web.Request, route: ModelRoute, up: UpstreamResponse,
                  translator: StreamTranslator, t0: float, overhead: float
                  ) -> web.StreamResponse:
    """Relay one upstream stream through the translator; every path ends it well-formed."""
    metrics = request.app[METRICS]
    timing = _Timing(overhead)

    def after() -> None:  # the stream's own metrics, however it ended
        metrics.overhead.labels("messages").observe(timing.translate)
        if translator.dropped_tool_deltas:
            _bad_tool_args(metrics, route.name, translator.dropped_tool_deltas)
        if timing.first_token and translator.output_tokens > 1:
            metrics.tpot.labels(route.name).observe(
                (timing.last_chunk - timing.first_token) / (translator.output_tokens - 1))
        if translator.stop_reason:
            metrics.stop_reasons.labels(route.name, translator.stop_reason).inc()

    async with streaming.RelayedStream(request, "messages", route, translator,
                                       content_type="text/event-stream; charset=utf-8",
                                       after=after) as stream:
        await _pump(up, translator, stream.writer.write, timing,
                    metrics.inter_chunk.labels(route.name),
                    metrics.ttft.labels("messages", route.name), t0)
    return stream.writer.response


class _Timing:
    __slots__ = ("first_token", "last_chunk", "translate")

    def __init__(self, overhead: float) -> None:
        self.translate = overhead  # gateway's own CPU-bound time: setup + per-chunk work
        self.first_token = 0.0
        self.last_chunk = 0.0


async def _pump(up: UpstreamResponse, translator: StreamTranslator,
                write: Callable[[bytes], Awaitable[None]], timing: _Timing, inter_chunk: Any,
                ttft: Any = None, t0: float = 0.0) -> None:
    """The hot path: per upstream read, one decode, one translation, one write.

    ``ttft`` (a histogram child) is observed at the first content block; None skips it
    (a buffered reply has no first token on the wire).
    """
    decoder = SSEDecoder()
    clock = time.perf_counter
    feed_all = translator.feed_all
    for_chunk = decoder.feed
    progress = up.progress
    async for chunk in up.chunks():
        now = clock()
        if timing.last_chunk:
            inter_chunk.observe(now - timing.last_chunk)
        timing.last_chunk = now
        payloads = for_chunk(chunk)
        out = feed_all(payloads) if payloads else b""
        timing.translate += clock() - now
        if payloads:
            progress()  # events, not blank lines or comments, keep a stream alive
            if not timing.first_token and translator.output_started:
                timing.first_token = now
                if ttft is not None:
                    ttft.observe(now - t0)
            if out:
                await write(out)
        if translator.done:
            up.release_if_complete(ended=translator.ended_by_done)
            return
    await write(feed_all(decoder.flush()) + translator.eof())


async def count_tokens(request: web.Request) -> web.Response:
    app = request.app
    metrics = app[METRICS]
    req = validate_messages(await read_json(request), count_tokens=True)
    restore_reasoning(req, app[CONFIG].server.signing_key)
    route = routing.resolve(request, req["model"])
    req = await _pdfs_as_text(req)
    chat_req = to_chat(req, route, keep_billing_header=app[CONFIG].server.keep_billing_header,
                       count_tokens=True, on_drop=metrics.drop_field)
    client = routing.client_for(request, route)
    with admitted(request, route):
        count, exact = await tokens.count(request, route, client, chat_req)
    headers = {"request-id": request[REQUEST_ID]}
    if not exact:
        headers["x-token-count-estimated"] = "true"
    return web.Response(body=jsonutil.dumpb({"input_tokens": count}),
                        content_type="application/json", headers=headers)
