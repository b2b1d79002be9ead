"""The OpenAI pass-through: ``POST {prefix}/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings`` and ``/v1/responses``, one handler built per row of :mod:`.apis`.

The client's body (read bounded and strict by :mod:`gateway.body`: a lone surrogate, a
NaN or nesting past 128 levels is a 400 naming the path) must be a JSON object with a
string ``model`` (an alias); it goes upstream with ``model`` replaced by the route's
``upstream_model`` and nothing else changed (``stream`` and ``stream_options``
included); nothing else of the client's request (headers included) is forwarded.
Replies come back byte for byte except ``model`` (see :mod:`.relay`). Streams are
relayed as they come, each write awaited; a failure after the first byte ends the
stream with the dialect's error event. An error the upstream reports in-band (a 200
error body, an error event) reaches the client scrubbed as every upstream error does
(see :mod:`.inband`), with the upstream's host names and every configured upstream's
secrets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway import errors, jsonutil, routing
from gateway.appkeys import CONFIG, METRICS, REQUEST_ID, SECRETS, STREAM
from gateway.body import read_json
from gateway.config import ModelRoute
from gateway.metrics import Metrics
from gateway.openai.apis import OpenAIApi
from gateway.openai.inband import InbandErrors
from gateway.openai.relay import ModelRewriter, Relay
from gateway.upstream import UpstreamResponse
from gateway.writer import ClientGone, StreamWriter

_EVENT = b"data:"  # relayed bytes holding an event's data (a comment or blank line does not)
_PING = b": ping\n\n"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def handler(api: OpenAIApi) -> Handler:
    """The aiohttp handler of one pass-through route."""

    async def pass_through(request: web.Request) -> web.StreamResponse:
        return await _pass_through(request, api)

    return pass_through


async def _pass_through(request: web.Request, api: OpenAIApi) -> web.StreamResponse:
    t0 = time.perf_counter()
    body = await read_json(request)
    if not isinstance(body, dict):
        raise errors.InvalidRequest("", "request body must be a JSON object")
    if not isinstance(body.get("model"), str):
        raise errors.InvalidRequest("model", "required, a string")
    route = routing.resolve(request, body["model"], openai=True)
    stream = api.streams and body.get("stream") is True
    request[STREAM] = stream
    body["model"] = route.upstream_model
    payload = jsonutil.dumpb(body)
    del body  # a large body is held once, as the payload, while the upstream answers
    metrics = request.app[METRICS]
    metrics.overhead.labels(api.name).observe(time.perf_counter() - t0)
    client = routing.client_for(request, route)
    rewrite = ModelRewriter(route.upstream_model, route.name)
    with routing.admitted(request, route):
        up = await routing.send(request, route, client, api.path, payload, stream=stream)
        async with up:
            if not stream:
                data = await up.read()
                inband = InbandErrors(responses=api.dialect.responses, hosts=client.hosts,
                                      secrets=request.app[SECRETS])
                reply = inband.body(rewrite(data))  # an error body raises, scrubbed
                _count_tokens(metrics, route, api.dialect.usage(data))
                return web.Response(body=reply, status=200,
                                    content_type="application/json",
                                    headers={"request-id": request[REQUEST_ID]})
            return await _relay(request, api, route, up,
                                Relay(rewrite, api.dialect, hosts=client.hosts,
                                      secrets=request.app[SECRETS]), t0)


def _count_tokens(metrics: Metrics, route: ModelRoute, usage: tuple[int, int] | None) -> None:
    if usage is not None:
        metrics.tokens.labels(route.name, "input").inc(usage[0])
        metrics.tokens.labels(route.name, "output").inc(usage[1])


async def _relay(request: web.Request, api: OpenAIApi, route: ModelRoute, up: UpstreamResponse,
                 relay: Relay, t0: float) -> web.StreamResponse:
    server = request.app[CONFIG].server
    metrics = request.app[METRICS]
    writer = await StreamWriter.open(request, content_type="text/event-stream",
                                     write_timeout=server.write_timeout,
                                     ping_interval=server.ping_interval, ping_frame=_PING)
    reason = "client_disconnect"
    timed = False  # time to first token observed
    gauge = metrics.in_flight.labels(api.name, route.name)
    gauge.inc()
    try:
        with routing.drainable(request) as handle:
            try:
                progress = up.progress
                async for chunk in up.chunks():
                    out = relay.feed(chunk)
                    if out and _EVENT in out:
                        progress()  # events, not blank lines or comments, keep it alive
                    if not timed and relay.first_token:
                        timed = True
                        metrics.ttft.labels(api.name, route.name).observe(
                            time.perf_counter() - t0)
                    if out:
                        await writer.write(out)
                    if relay.done:  # the last event: what follows is the pool's, not the client's
                        up.release_if_complete(ended=True)
                        break
                out = relay.end()
                if out:
                    await writer.write(out)
                reason = "completed" if relay.done else "upstream_truncated"
            except (ValueError, errors.GatewayError, asyncio.CancelledError) as exc:
                failure = routing.stream_failure(exc, handle)
                if failure is None:
                    raise
                err, reason = failure
                await _inband_error(writer, api.dialect.inband_error(err))
    finally:
        writer.stop_pinging()
        gauge.dec()
        metrics.terminations.labels(api.name, route.name, reason).inc()
        _count_tokens(metrics, route, relay.usage)
    await writer.close()
    return writer.response


async def _inband_error(writer: StreamWriter, frame: bytes) -> None:
    try:
        await writer.write(frame)
    except ClientGone:
        pass
