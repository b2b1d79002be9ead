"""The OpenAI pass-through: ``POST {prefix}/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings`` and ``/v1/responses``, one handler built per row of :mod:`gateway.openai.apis`.

The client's body (read bounded and strict by :mod:`gateway.http.body`: a lone surrogate, a
NaN or nesting past 128 levels is a 400 naming the path) must be a JSON object with a
string ``model`` (an alias); it goes upstream with ``model`` replaced by the route's
``upstream_model`` and nothing else changed (``stream`` and ``stream_options``
included; ``priority`` is set from the client's weight where the upstream's
``send_priority`` says so): the client's own bytes with the new value spliced in where a
scan is certain of its place, else the decoded body encoded again
(:mod:`gateway.openai.forward`). Nothing else of the client's request (headers included)
is forwarded. A session key (the client's header, ``user``, the chat's stable prefix:
:mod:`gateway.openai.session_scan`) is made only for an upstream of several replicas
balanced by affinity, the one place it is read.
Replies come back byte for byte except ``model`` (see :mod:`gateway.openai.relay`), and, on a
chat or Responses route whose upstream has ``passthrough_text_tool_calls``, tool calls the
engine wrote as text (:mod:`gateway.openai.text_calls`). Streams are
relayed as they come, each write awaited; a failure after the first byte ends the
stream with the dialect's error event (the stream's lifecycle, shared with the Messages
API, is :mod:`gateway.http.streaming`). An error the upstream reports in-band (a 200
error body, an error event) reaches the client scrubbed as every upstream error does
(see :mod:`gateway.openai.inband`), with the upstream's host names and every configured upstream's
secrets.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

from aiohttp import web

from gateway import errors
from gateway.http import charges, routing, streaming
from gateway.http.admission import admitted
from gateway.http.body import read_json
from gateway.http.keys import EXCHANGE, Exchange
from gateway.http.tenancy import record_passthrough
from gateway.messages.session_key import SESSION_HEADER
from gateway.openai.apis import CHAT, RESPONSES, OpenAIApi
from gateway.openai.forward import model_span, splice
from gateway.openai.inband import InbandErrors
from gateway.openai.relay import Indexer, ModelRewriter, Relay
from gateway.openai.responses_index import ResponsesIndexer
from gateway.openai.session_scan import session_key
from gateway.openai.text_calls import (
    ChatTextCalls,
    ResponsesTextCalls,
    offered_names,
    offered_response_names,
)
from gateway.ops.config import ModelRoute
from gateway.tenancy import limits
from gateway.tenancy.fair import engine_priority
from gateway.text import jsonutil
from gateway.upstream.client import UpstreamClient, UpstreamResponse
from gateway.upstream.send import send

_EVENT = b"data:"  # relayed bytes holding an event's data (a comment or blank line does not)
_PING = b": ping\n\n"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def handler(api: OpenAIApi) -> Handler:
    """The aiohttp handler of one pass-through route (a partial: no frame of its own)."""
    return partial(_pass_through, api=api)


async def _pass_through(request: web.Request, api: OpenAIApi) -> web.StreamResponse:
    t0 = time.perf_counter()
    exchange = request[EXCHANGE]
    raw: list[bytes] = []
    body = await read_json(request, exchange, keep=raw)
    if not isinstance(body, dict):
        raise errors.InvalidRequest("", "request body must be a JSON object")
    if not isinstance(body.get("model"), str):
        raise errors.InvalidRequest("model", "required, a string")
    route = routing.resolve(exchange, body["model"], openai=True)
    if exchange.client.metered:  # a client with limits: charged before the upstream is called
        charge = await charges.admit(exchange, len(raw[0]), _max_tokens(body))
        if charge is not None:
            return await charges.charged(
                charge, _forward(request, exchange, api, raw, body, route, t0, charge)
            )
    return await _forward(request, exchange, api, raw, body, route, t0, None)


def _max_tokens(body: dict[str, Any]) -> int:
    """The output the request may ask for (0 when it does not say)."""
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(key)
        if type(value) is int and value > 0:
            return value
    return 0


async def _forward(
    request: web.Request,
    exchange: Exchange,
    api: OpenAIApi,
    raw: list[bytes],
    body: dict[str, Any],
    route: ModelRoute,
    t0: float,
    charge: limits.Charge | None,
) -> web.StreamResponse:
    stream = api.streams and body.get("stream") is True
    exchange.stream = stream
    app = exchange.app
    ups = app.upstream_calls
    assert ups is not None  # the API application's
    client = ups.client(route)
    session = _session(request, client, body)
    data = raw.pop()
    upstream = route.upstream
    # tool calls written as text, parsed where the route asks for it (else bytes relayed)
    names: tuple[str, ...] = ()
    if upstream.text_tool_calls and upstream.passthrough_text_tool_calls:
        if api is CHAT:
            names = offered_names(body)
        elif api is RESPONSES:
            names = offered_response_names(body)
    # the client's weight as the engine's priority (send_priority): the body encoded again
    span = (
        model_span(data, body["model"], stream=api.streams and "stream" in body)
        if not upstream.send_priority
        else None
    )
    if span is None:  # the bytes do not say for certain where model is: encoded again
        body["model"] = route.upstream_model
        if upstream.send_priority:
            body["priority"] = engine_priority(exchange.client.weight, upstream.kind)
        payload = jsonutil.dumpb(body)
        del body
    else:
        del body  # before the copy: a large body is held as bytes only
        payload = splice(data, span, route.upstream_model)
    del data  # held once, as the payload, while the upstream answers
    metrics = app.metrics
    metrics.overhead.labels(api.name).observe(time.perf_counter() - t0)
    rewrite = ModelRewriter(route.upstream_model, route.name)
    async with admitted(request, exchange, route):
        up = await send(
            ups,
            route,
            api.path,
            payload,
            stream=stream,
            request_id=exchange.request_id,
            session=session,
        )
        async with up:
            if not stream:
                data = await up.read()
                inband = InbandErrors(
                    responses=api.dialect.responses,
                    hosts=client.hosts,
                    secrets=app.secrets,
                )
                reply = inband.body(rewrite(data))  # an error body raises, scrubbed
                if names:
                    reply = _text_calls(api, names).body(reply)
                usage = api.dialect.usage(data)
                metrics.count_tokens(route.name, usage)
                record_passthrough(request, exchange, route.name, usage)
                if charge is not None:
                    charge.ended(usage)
                return web.Response(
                    body=reply,
                    status=200,
                    content_type="application/json",
                    headers={"request-id": exchange.request_id},
                )
            return await _relay(
                request,
                exchange,
                api,
                route,
                up,
                Relay(
                    rewrite,
                    api.dialect,
                    hosts=client.hosts,
                    secrets=app.secrets,
                    indexer=_stream_indexer(api, route, names),
                ),
                t0,
                charge,
            )


async def _relay(
    request: web.Request,
    exchange: Exchange,
    api: OpenAIApi,
    route: ModelRoute,
    up: UpstreamResponse,
    relay: Relay,
    t0: float,
    charge: limits.Charge | None,
) -> web.StreamResponse:
    headers = None if charge is None else charge.headers
    try:
        return await _relayed(request, exchange, api, route, up, relay, t0, headers)
    finally:  # however the stream ended: what it used, as far as the upstream said
        record_passthrough(request, exchange, route.name, relay.usage)
        if charge is not None:
            charge.ended(relay.usage)  # None (no include_usage): the estimate stands


async def _relayed(
    request: web.Request,
    exchange: Exchange,
    api: OpenAIApi,
    route: ModelRoute,
    up: UpstreamResponse,
    relay: Relay,
    t0: float,
    headers: Mapping[str, str] | None,
) -> web.StreamResponse:
    metrics = exchange.app.metrics
    async with streaming.RelayedStream(
        request,
        exchange,
        api.name,
        route,
        relay,
        content_type="text/event-stream",
        ping_frame=_PING,
        headers=headers,
    ) as stream:
        write = stream.writer.write
        progress = up.progress
        timed = False  # time to first token observed
        async for chunk in up.chunks():
            out = relay.feed(chunk)
            if out and out.find(_EVENT) >= 0:  # find(), not ``in``: see inband.suspect
                progress()  # events, not blank lines or comments, keep it alive
            if not timed and relay.first_token:
                timed = True
                metrics.ttft.labels(api.name, route.name).observe(time.perf_counter() - t0)
            if out:
                await write(out)
            if relay.done:  # the last event: what follows is the pool's, not the client's
                up.release_if_complete(ended=True)
                break
        out = relay.end()
        if out:
            await write(out)
    return stream.writer.response


def _session(request: web.Request, client: UpstreamClient, body: dict[str, Any]) -> str | None:
    """The session key, made only where it chooses the replica: an upstream of several,
    balanced by affinity (one replica, or another balance, ignores it)."""
    replicas = client.replicas
    if len(replicas.all) < 2 or replicas.balance != "affinity":
        return None
    return session_key(request.headers.get(SESSION_HEADER), body)


def _text_calls(api: OpenAIApi, names: tuple[str, ...]) -> ChatTextCalls | ResponsesTextCalls:
    return ResponsesTextCalls(names) if api is RESPONSES else ChatTextCalls(names)


def _stream_indexer(api: OpenAIApi, route: ModelRoute, names: tuple[str, ...]) -> Indexer | None:
    """What each decoded event of a stream goes through: the text calls' rewrite where the
    route asks for it, then llama.cpp's Responses indices; None: bytes relayed."""
    indexer = _indexer(api, route)
    if not names:
        return indexer
    if api is not RESPONSES:
        return ChatTextCalls(names).event
    calls = ResponsesTextCalls(names)
    if indexer is None:
        return calls.event
    fill = indexer

    def both(event: dict[str, Any]) -> list[dict[str, Any]]:
        return [fill(e) for e in calls.event(event)]

    return both


def _indexer(api: OpenAIApi, route: ModelRoute) -> ResponsesIndexer | None:
    """llama.cpp's Responses events lack the indices the OpenAI SDKs key on: filled in."""
    if api is RESPONSES and route.upstream.kind == "llamacpp":
        return ResponsesIndexer()
    return None
