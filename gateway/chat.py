"""The OpenAI chat-completions pass-through: ``POST {prefix}/v1/chat/completions``.

The client's body goes upstream with ``model`` replaced by the route's
``upstream_model``; nothing else of the client's request (headers included)
is forwarded. Replies come back byte for byte except ``model``, which is set
back to the alias. The rewrite is a byte replace of the compact
``"model":"<upstream_model>"`` pair (a JSON string cannot contain that
sequence unescaped, so text is never touched); an upstream that reports
another model name (llama.cpp reports its file path) has that name learned
from its first chunk; a reply in another spelling is re-encoded. Streams are
relayed event by event, ``[DONE]`` kept, each write awaited.
"""

from __future__ import annotations

import asyncio
import re
import time

from aiohttp import web

from gateway import errors, jsonutil, routing
from gateway.appkeys import CONFIG, METRICS, REQUEST_ID, STREAM
from gateway.config import ModelRoute
from gateway.sse import SSEDecoder
from gateway.upstream import UpstreamResponse
from gateway.writer import ClientGone, StreamWriter

_PING = b": ping\n\n"


class _ModelRewriter:
    __slots__ = ("_alias", "_compact", "_needle")

    def __init__(self, upstream_model: str, alias: str) -> None:
        self._alias = alias
        self._needle = b'"model":' + jsonutil.dumpb(upstream_model)
        self._compact = b'"model":' + jsonutil.dumpb(alias)

    def __call__(self, payload: bytes) -> bytes:
        if self._needle in payload:
            return payload.replace(self._needle, self._compact, 1)
        if b'"model"' not in payload:
            return payload
        try:
            obj = jsonutil.loads_upstream(payload)
        except ValueError:
            return payload
        if isinstance(obj, dict) and "model" in obj:
            reported = obj["model"]
            if isinstance(reported, str):
                # the upstream names its model its own way (llama.cpp: the file path);
                # learn it, so the following chunks take the byte-replace path again
                needle = b'"model":' + jsonutil.dumpb(reported)
                if needle in payload:
                    self._needle = needle
                    return payload.replace(needle, self._compact, 1)
            obj["model"] = self._alias
            return jsonutil.dumpb(obj)
        return payload


async def chat_completions(request: web.Request) -> web.StreamResponse:
    t0 = time.perf_counter()
    raw = await request.read()
    try:
        body = jsonutil.loads(raw)
    except ValueError:
        raise errors.InvalidRequest("", "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise errors.InvalidRequest("", "request body must be a JSON object")
    if not isinstance(body.get("model"), str):
        raise errors.InvalidRequest("model", "required, a string")
    route = routing.resolve(request, body["model"], openai=True)
    stream = body.get("stream") is True
    request[STREAM] = stream
    body["model"] = route.upstream_model
    payload = jsonutil.dumpb(body)
    metrics = request.app[METRICS]
    metrics.overhead.labels("chat").observe(time.perf_counter() - t0)
    client = routing.client_for(request, route)
    rewrite = _ModelRewriter(route.upstream_model, route.name)
    with routing.admitted(request, route):
        up = await routing.send(request, route, client, "/chat/completions", payload,
                                stream=stream)
        async with up:
            if not stream:
                data = await up.read()
                usage = _usage(data)
                if usage is not None:
                    metrics.tokens.labels(route.name, "input").inc(usage[0])
                    metrics.tokens.labels(route.name, "output").inc(usage[1])
                return web.Response(body=rewrite(data), status=200,
                                    content_type="application/json",
                                    headers={"request-id": request[REQUEST_ID]})
            return await _relay(request, route, up, rewrite, t0)


def _has_token(payload: bytes) -> bool:
    """Does this chunk carry generated output (for time to first token)? No JSON parse."""
    i = payload.find(b'"content":"')
    if i >= 0 and payload[i + 11:i + 12] != b'"':
        return True
    return b'"reasoning_content":"' in payload or b'"reasoning":"' in payload or (
        b'"tool_calls":[' in payload)


_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def _usage(payload: bytes) -> tuple[int, int] | None:
    """(prompt, completion) tokens when a chunk or body carries usage.

    A regex instead of a JSON parse of the whole body: an unescaped
    ``"prompt_tokens":`` cannot occur inside a JSON string, so a match is the field.
    """
    at = payload.rfind(b'"usage"')
    if at < 0:
        return None
    prompt = _PROMPT.search(payload, at)
    completion = _COMPLETION.search(payload, at)
    if prompt is None and completion is None:
        return None
    return (int(prompt[1]) if prompt else 0, int(completion[1]) if completion else 0)


async def _relay(request: web.Request, route: ModelRoute, up: UpstreamResponse,
                 rewrite: _ModelRewriter, t0: float) -> web.StreamResponse:
    server = request.app[CONFIG].server
    metrics = request.app[METRICS]
    writer = await StreamWriter.open(request, content_type="text/event-stream",
                                     write_timeout=server.write_timeout,
                                     ping_interval=server.ping_interval, ping_frame=_PING)
    decoder = SSEDecoder()
    reason = "client_disconnect"
    done = first_token = False
    usage = None
    gauge = metrics.in_flight.labels("chat", route.name)
    gauge.inc()
    try:
        with routing.drainable(request) as handle:
            try:
                async for chunk in up.chunks():
                    out = []
                    for p in decoder.feed(chunk):
                        if p == b"[DONE]":
                            done = True
                        elif not first_token and _has_token(p):
                            first_token = True
                            metrics.ttft.labels("chat", route.name).observe(
                                time.perf_counter() - t0)
                        if b'"prompt_tokens"' in p:
                            usage = _usage(p) or usage
                        out.append(b"data: " + rewrite(p) + b"\n\n")
                    if out:
                        await writer.write(b"".join(out))
                tail = decoder.flush()
                if tail:
                    done = done or tail[-1] == b"[DONE]"
                    await writer.write(b"".join(b"data: " + rewrite(p) + b"\n\n" for p in tail))
                reason = "completed" if done else "upstream_truncated"
            except (ValueError, errors.GatewayError, asyncio.CancelledError) as exc:
                failure = routing.stream_failure(exc, handle)
                if failure is None:
                    raise
                err, reason = failure
                await _inband_error(writer, err)
    finally:
        writer.stop_pinging()
        gauge.dec()
        metrics.terminations.labels("chat", route.name, reason).inc()
        if usage is not None:
            metrics.tokens.labels(route.name, "input").inc(usage[0])
            metrics.tokens.labels(route.name, "output").inc(usage[1])
    await writer.close()
    return writer.response


async def _inband_error(writer: StreamWriter, err: errors.GatewayError) -> None:
    try:
        await writer.write(b"data: " + errors.openai_body(err) + b"\n\n")
    except ClientGone:
        pass
