"""``POST {prefix}/v1/messages`` (buffered and streamed) and ``/v1/messages/count_tokens``.

The HTTP side of the Messages call (:mod:`gateway.messages.call`): read (bounded and strict,
:mod:`gateway.http.body`) -> validate -> route -> the call -> a JSON reply, or the upstream's
stream through the ``StreamTranslator`` to the writer. Before the first byte reaches the
client a failure is a JSON error response with its real status (raised, rendered by the
middleware); after it, :class:`~gateway.http.streaming.RelayedStream` writes the
translator's failure envelope (the stream's lifecycle, shared with the OpenAI pass-through).
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from gateway import errors
from gateway.http import routing, streaming
from gateway.http.admission import admitted
from gateway.http.body import read_json
from gateway.http.keys import MESSAGES, REQUEST_ID, STREAM, WEB_SEARCH
from gateway.messages.aggregate import aggregate
from gateway.messages.call import (
    Call,
    Timing,
    bad_tool_args,
    count_input_tokens,
    count_reply,
    count_stream_fixes,
    pdfs_as_text,
    prepare,
    reasoning_hidden,
    restore,
)
from gateway.messages.continuation import relay
from gateway.messages.session import SESSION_HEADER, session_key
from gateway.messages.validate import validate_messages
from gateway.messages.web_search import web_search_tool
from gateway.ops.budget import Lease
from gateway.ops.config import ModelRoute
from gateway.text import jsonutil
from gateway.text.sse import SSEEventTooLarge
from gateway.tools.searches import Searches
from gateway.tools.searxng import Searxng
from gateway.tools.web_search import WebSearchReply
from gateway.upstream.client import UpstreamResponse

_SSE = "text/event-stream; charset=utf-8"


async def create_message(request: web.Request) -> web.StreamResponse:
    t0 = time.perf_counter()
    deps = request.app[MESSAGES]
    backend = request.app[WEB_SEARCH]
    req = validate_messages(await read_json(request), web_search=backend is not None)
    route = routing.resolve(request, req["model"])
    # what the request restores from signatures counts until its reply has ended
    with deps.memory.lease() as lease:
        if backend is not None and _searches(req):
            return await _web_search(request, backend, req, route, t0, lease)
        return await _reply(request, req, route, t0, lease)


async def _reply(request: web.Request, req: dict[str, Any], route: ModelRoute, t0: float,
                 lease: Lease) -> web.StreamResponse:
    deps = request.app[MESSAGES]
    call = await prepare(deps, req, route, lease)
    request[STREAM] = call.stream
    overhead = time.perf_counter() - t0
    with admitted(request, route):
        up = await call.send(request[REQUEST_ID],
                             session_key(request.headers.get(SESSION_HEADER), req))
        async with up:
            if call.stream:
                return await _stream(request, call, up, t0, overhead)
            message = await call.reply(up, overhead, request[REQUEST_ID])
        body = jsonutil.dumpb(message)
    count_reply(deps.metrics, call.route, message)  # a fallback's, if one answered
    return web.Response(body=body, content_type="application/json",
                        headers={"request-id": request[REQUEST_ID]})


def _searches(req: dict[str, Any]) -> bool:
    """Whether the request offers the web search tool, and the model may call it."""
    choice = req.get("tool_choice")
    return web_search_tool(req.get("tools")) is not None and (
        choice is None or choice["type"] != "none")


async def _web_search(request: web.Request, backend: Searxng, req: dict[str, Any],
                      route: ModelRoute, t0: float, lease: Lease) -> web.StreamResponse:
    """A reply with web search (gateway/tools/web_search.py): rounds of the Messages call,
    streamed upstream, one message to the client, buffered or streamed. Its metrics are a
    reply's, counted once (TTFT, TPOT, overhead, stop reason, tokens); the rounds' fixes
    per round."""
    deps = request.app[MESSAGES]
    metrics = deps.metrics
    stream = req.get("stream") is True
    tool = web_search_tool(req.get("tools"))
    assert tool is not None
    call = await prepare(deps, {**req, "stream": True}, route, lease)
    request[STREAM] = stream
    overhead = time.perf_counter() - t0
    with admitted(request, route):
        session = session_key(request.headers.get(SESSION_HEADER), req)
        up = await call.send(request[REQUEST_ID], session)
        reply = WebSearchReply(deps, call, Searches(backend, tool, deps.signing_key,
                                                      request_id=request[REQUEST_ID]),
                               tool["name"], request_id=request[REQUEST_ID], session=session)
        reply.overhead = overhead
        if stream:
            def after() -> None:
                metrics.overhead.labels("messages").observe(reply.overhead)
                tpot = reply.tpot
                if tpot is not None:
                    metrics.tpot.labels(route.name).observe(tpot)
                if reply.stop_reason:
                    metrics.stop_reasons.labels(route.name, reply.stop_reason).inc()

            try:
                async with streaming.RelayedStream(request, "messages", route, reply,
                                                   content_type=_SSE, after=after) as relayed:
                    await reply.run(up, relayed.writer.write,
                                    ttft=metrics.ttft.labels("messages", route.name), t0=t0)
            finally:
                if not reply.took_first:  # the stream never opened: drop the upstream's
                    async with up:
                        pass
            return relayed.writer.response
        events: list[bytes] = []

        async def keep(data: bytes) -> None:
            events.append(data)

        try:
            await reply.run(up, keep)
        except SSEEventTooLarge:
            raise errors.StreamProcessingError() from None
        if reply.error is not None:
            raise reply.error
        t1 = time.perf_counter()
        message = aggregate(b"".join(events))
        metrics.overhead.labels("messages").observe(reply.overhead + time.perf_counter() - t1)
    count_reply(metrics, route, message)
    return web.Response(body=jsonutil.dumpb(message), content_type="application/json",
                        headers={"request-id": request[REQUEST_ID]})


async def _stream(request: web.Request, call: Call, up: UpstreamResponse, t0: float,
                  overhead: float) -> web.StreamResponse:
    """Relay one upstream stream through the translator; every path ends it well-formed."""
    metrics = call.deps.metrics
    route = call.route
    translator = call.translator()
    timing = Timing(overhead)

    def after() -> None:  # the stream's own metrics, however it ended
        metrics.overhead.labels("messages").observe(timing.translate)
        if translator.dropped_tool_deltas:
            bad_tool_args(metrics, route.name, translator.dropped_tool_deltas)
        count_stream_fixes(call, translator)
        if translator.reasoning_hidden:
            reasoning_hidden(metrics, route.name)
        if timing.first_token and translator.output_tokens > 1:
            metrics.tpot.labels(route.name).observe(
                (timing.last_chunk - timing.first_token) / (translator.output_tokens - 1))
        if translator.stop_reason:
            metrics.stop_reasons.labels(route.name, translator.stop_reason).inc()

    async with streaming.RelayedStream(request, "messages", route, translator,
                                       content_type=_SSE,
                                       after=after) as stream:
        await relay(call, up, translator, stream.writer.write, timing,
                    metrics.inter_chunk.labels(route.name),
                    metrics.ttft.labels("messages", route.name), t0,
                    request_id=request[REQUEST_ID])
    return stream.writer.response


async def count_tokens(request: web.Request) -> web.Response:
    deps = request.app[MESSAGES]
    req = validate_messages(await read_json(request), count_tokens=True,
                            web_search=request.app[WEB_SEARCH] is not None)
    route = routing.resolve(request, req["model"])
    with deps.memory.lease() as lease:  # restored reasoning counts until it is counted
        await restore(deps, req, lease)
        req = await pdfs_as_text(deps, req)
        with admitted(request, route):
            count, exact = await count_input_tokens(deps, req, route, request[REQUEST_ID])
    headers = {"request-id": request[REQUEST_ID]}
    if not exact:
        headers["x-token-count-estimated"] = "true"
    return web.Response(body=jsonutil.dumpb({"input_tokens": count}),
                        content_type="application/json", headers=headers)
