"""``POST {prefix}/v1/messages`` (buffered and streamed) and ``/v1/messages/count_tokens``.

The HTTP side of the Messages call: read (bounded and strict, :mod:`gateway.http.body`) ->
validate -> route -> lease -> prepare -> admitted -> the reply (:mod:`gateway.messages.reply`,
which runs it, times it and writes its figures) -> a JSON reply, or its stream to the
writer. Before the first byte reaches the client a failure is a JSON error response with its
real status (raised, rendered by the middleware); after it,
:class:`~gateway.http.streaming.RelayedStream` writes the source's failure envelope (the
stream's lifecycle, shared with the OpenAI pass-through).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from aiohttp import web

from gateway import errors
from gateway.http import charges, routing, streaming
from gateway.http.admission import admitted
from gateway.http.body import read_json
from gateway.http.keys import EXCHANGE, Exchange
from gateway.http.tenancy import reply_ended
from gateway.http.writer import StreamWriter
from gateway.messages.call import Call, count_input_tokens, prepare
from gateway.messages.deps import MessagesDeps
from gateway.messages.fetch_blocks import web_fetch_tool
from gateway.messages.ready import pdfs_as_text, restore
from gateway.messages.reply import Reply, Rounds
from gateway.messages.request.validate import validate_messages
from gateway.messages.search_blocks import web_search_tool
from gateway.messages.session_key import SESSION_HEADER, session_key
from gateway.ops.budget import Lease
from gateway.ops.config import ModelRoute
from gateway.tenancy import limits
from gateway.text import jsonutil
from gateway.tools.rounds import ServerTool
from gateway.tools.rounds.loop import ServerToolsReply
from gateway.tools.web_fetch.fetches import Fetches
from gateway.tools.web_search.citations import Quotes
from gateway.tools.web_search.searches import Searches

_SSE = "text/event-stream; charset=utf-8"


async def create_message(request: web.Request) -> web.StreamResponse:
    t0 = time.perf_counter()
    exchange = request[EXCHANGE]
    app = exchange.app
    keep: list[bytes] | None = [] if exchange.client.metered else None  # the body, measured
    req = validate_messages(
        await read_json(request, exchange, keep=keep),
        web_search=app.web_search is not None,
        web_fetch=app.web_fetch is not None,
    )
    route = routing.resolve(exchange, req["model"])
    if keep is not None:  # a client with limits: charged before the upstream is called
        charge = await charges.admit(exchange, len(keep.pop()), req["max_tokens"])
        if charge is not None:
            return await charges.charged(charge, _create(request, exchange, req, route, t0, charge))
    return await _create(request, exchange, req, route, t0, None)


async def _create(
    request: web.Request,
    exchange: Exchange,
    req: dict[str, Any],
    route: ModelRoute,
    t0: float,
    charge: limits.Charge | None,
) -> web.StreamResponse:
    # what the request restores from signatures counts until its reply has ended
    deps = exchange.app.messages
    assert deps is not None  # the API application's
    with deps.memory.lease() as lease:
        reply = await _prepare(exchange, deps, req, route, t0, lease)
        reply.figures.on_end = reply_ended(request, exchange, req)
        exchange.stream = reply.stream
        fail = _failure(reply) if reply.stream else None
        async with admitted(request, exchange, route, fail) as slot:
            try:
                await reply.send(partial(session_key, request.headers.get(SESSION_HEADER), req))
            except errors.GatewayError as err:
                await slot.failed(err)  # a stream opened while waiting for the slot ends
                raise
            async with reply:
                if reply.stream:
                    return await _stream(request, exchange, reply, charge, slot.writer)
                body = jsonutil.dumpb(await reply.buffered())
    return web.Response(
        body=body, content_type="application/json", headers={"request-id": exchange.request_id}
    )


async def _prepare(
    exchange: Exchange,
    deps: MessagesDeps,
    req: dict[str, Any],
    route: ModelRoute,
    t0: float,
    lease: Lease,
) -> Reply:
    """The reply to make: with server tools (gateway/tools/rounds/loop.py: rounds of the
    Messages call, streamed upstream, one message to the client, buffered or streamed) when
    the request offers web search or web fetch and the model may call them, else a plain
    one."""
    app = exchange.app
    search = web_search_tool(req.get("tools")) if app.web_search is not None else None
    fetch = web_fetch_tool(req.get("tools")) if app.web_fetch is not None else None
    choice = req.get("tool_choice")
    weight = exchange.client.weight  # the engine's priority, where send_priority is on
    if (search is None and fetch is None) or (choice is not None and choice["type"] == "none"):
        return Reply(
            await prepare(deps, req, route, lease, weight=weight),
            t0=t0,
            request_id=exchange.request_id,
        )
    call = await prepare(deps, {**req, "stream": True}, route, lease, weight=weight)
    return Reply(
        call,
        stream=req.get("stream") is True,
        t0=t0,
        request_id=exchange.request_id,
        rounds=_server_tools(exchange, deps, req, search, fetch),
    )


def _server_tools(
    exchange: Exchange,
    deps: MessagesDeps,
    req: Mapping[str, Any],
    search: Mapping[str, Any] | None,
    fetch: Mapping[str, Any] | None,
) -> Callable[[Call, str | None], Rounds]:
    """The rounds of a reply with the request's server tools: one loop runs both."""
    request_id = exchange.request_id
    backend = exchange.app.web_search
    service = exchange.app.web_fetch

    def rounds(call: Call, session: str | None) -> Rounds:
        quotes = Quotes(deps.signing_key)  # the reply's citations, of either tool
        tools: list[ServerTool] = []
        if search is not None and backend is not None:
            tools.append(
                Searches(backend, search, deps.signing_key, request_id=request_id, quotes=quotes)
            )
        if fetch is not None and service is not None:
            tools.append(
                Fetches(
                    service,
                    fetch,
                    req,
                    quotes,
                    model=call.route.upstream_model,
                    pdfs=deps.pdfs,
                    request_id=request_id,
                )
            )
        return ServerToolsReply(deps, call, tools, quotes, request_id=request_id, session=session)

    return rounds


def _failure(reply: Reply) -> Callable[[errors.GatewayError], bytes]:
    """How a stream opened while waiting for a slot ends when the wait or the call fails:
    the reply's own failure envelope (message_start, the error event, message_stop)."""

    def fail(err: errors.GatewayError) -> bytes:
        return reply.source.fail(err, "upstream_error")

    return fail


async def _stream(
    request: web.Request,
    exchange: Exchange,
    reply: Reply,
    charge: limits.Charge | None,
    writer: StreamWriter | None = None,
) -> web.StreamResponse:
    """The reply to the client's stream; every path ends it well-formed, and its figures
    are written as it ends (:meth:`Reply.end`). ``writer``: the stream already opened
    while the request waited for its slot."""
    async with streaming.RelayedStream(
        request,
        exchange,
        "messages",
        reply.call.route,
        reply.source,
        content_type=_SSE,
        end=reply.end,
        writer=writer,
        headers=None if charge is None else charge.headers,
    ) as stream:
        await reply.stream_to(stream.writer.write)
    return stream.writer.response


async def count_tokens(request: web.Request) -> web.Response:
    exchange = request[EXCHANGE]
    app = exchange.app
    deps = app.messages
    assert deps is not None  # the API application's
    req = validate_messages(
        await read_json(request, exchange),
        count_tokens=True,
        web_search=app.web_search is not None,
        web_fetch=app.web_fetch is not None,
    )
    route = routing.resolve(exchange, req["model"])
    with deps.memory.lease() as lease:  # restored reasoning counts until it is counted
        await restore(deps, req, lease)
        req = await pdfs_as_text(deps, req)
        async with admitted(request, exchange, route):
            count, exact = await count_input_tokens(deps, req, route, exchange.request_id)
    headers = {"request-id": exchange.request_id}
    if not exact:
        headers["x-token-count-estimated"] = "true"
    return web.Response(
        body=jsonutil.dumpb({"input_tokens": count}),
        content_type="application/json",
        headers=headers,
    )
