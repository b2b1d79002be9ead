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
from gateway.sse import MAX_EVENT_BYTES, SSEDecoder
from gateway.upstream import UpstreamResponse
from gateway.writer import ClientGone, StreamWriter

_PING = b": ping\n\n"


class _ModelRewriter:
    __slots__ = ("_alias", "_compact", "_needle")

    def __init__(self, upstream_model: str, alias: str) -> None:
        self._alias = alias
        self._needle = b'"model":' + jsonutil.dumpb(upstream_model)
        self._compact = b'"model":' + jsonutil.dumpb(alias)

    def block(self, data: bytes) -> bytes | None:
        """Whole SSE events at once; None when one needs :meth:`__call__` (another name
        or spelling of ``model``). Each event's top level has one ``model``, and the
        compact pair cannot occur inside a JSON string, so every match is one."""
        if self._needle in data:
            return data.replace(self._needle, self._compact)
        if b'"model"' not in data:
            return data
        return None

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


_TOKEN_KEYS = (b'"content":"', b'"reasoning_content":"', b'"reasoning":"')


def _has_token(payload: bytes) -> bool:
    """Do these events carry generated output (for time to first token)? No JSON parse.

    A non-empty ``content`` or reasoning string, or a tool call. The compact key pairs
    cannot occur unescaped inside a JSON string, so every match is a field.
    """
    for key in _TOKEN_KEYS:
        i = payload.find(key)
        while i >= 0:
            i += len(key)
            if payload[i:i + 1] != b'"':
                return True
            i = payload.find(key, i)
    return b'"tool_calls":[' in payload


_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def _usage(payload: bytes) -> tuple[int, int] | None:
    """(prompt, completion) tokens of the last usage in a body or a block of events.

    No JSON parse: an unescaped ``"prompt_tokens"`` cannot occur inside a JSON string,
    so a match is the field. The last one counts (a block may hold several events,
    and a later ``"usage":null`` must not hide an earlier count).
    """
    prompt = _last(_PROMPT, payload, b'"prompt_tokens"')
    completion = _last(_COMPLETION, payload, b'"completion_tokens"')
    if prompt is None and completion is None:
        return None
    return (prompt or 0, completion or 0)


def _last(pattern: re.Pattern[bytes], payload: bytes, key: bytes) -> int | None:
    at = payload.rfind(key)
    while at >= 0:
        match = pattern.match(payload, at)
        if match is not None:
            return int(match[1])
        at = payload.rfind(key, 0, at)
    return None


def _has_done_line(block: bytes) -> bool:
    """A whole ``data: [DONE]`` (or ``data:[DONE]``) line in these events?

    Found from ``[DONE]`` backwards: a regex scan of a whole block costs a millisecond
    on a bulk stream. A model writing that text puts it inside a JSON string, where it
    never starts a line (JSON strings hold no raw newline).
    """
    i = block.find(b"[DONE]")
    while i >= 0:
        for prefix in (b"data: ", b"data:"):
            start = i - len(prefix)
            if start >= 0 and block[start:i] == prefix and (
                    start == 0 or block[start - 1:start] == b"\n") and (
                    block[i + 6:i + 7] in (b"", b"\n")):
                return True
        i = block.find(b"[DONE]", i + 6)
    return False


class _Relay:
    """The byte work of relaying one stream (pure): what to write for each read.

    Fast path: the bytes up to the last blank line of a read are whole events, relayed as
    one block with ``model`` replaced in place; the rest waits for the next read. A stream
    framed with CR, or whose ``model`` is spelt another way, goes event by event through
    the SSE decoder from then on (each event re-framed as ``data: ...``). Either way the
    relay notes the ``[DONE]`` line, the first generated token and the usage.
    """

    __slots__ = ("_decoder", "_framed_cr", "_rewrite", "_tail", "done", "first_token",
                 "usage")

    def __init__(self, rewrite: _ModelRewriter) -> None:
        self._rewrite = rewrite
        self._decoder: SSEDecoder | None = None
        self._framed_cr = False  # CR line ends seen: event by event to the end
        self._tail = b""  # an event begun in a read, not yet ended
        self.done = False
        self.first_token = False
        self.usage: tuple[int, int] | None = None

    def feed(self, chunk: bytes) -> bytes:
        """One upstream read -> the bytes to write (b"" while an event is incomplete)."""
        if self._decoder is None:
            data = self._tail + chunk if self._tail else chunk
            if b"\r" not in chunk:
                end = data.rfind(b"\n\n") + 2
                if end == 1:  # no whole event yet
                    if len(data) > MAX_EVENT_BYTES:
                        raise ValueError("SSE event exceeds the size limit")
                    self._tail = data
                    return b""
                block = data if end == len(data) else data[:end]
                out = self._rewrite.block(block)
                if out is not None:
                    self._tail = data[end:]
                    self._observe(block)
                    return out
            self._tail = b""
            self._framed_cr = b"\r" in chunk
            self._decoder = SSEDecoder()
            chunk = data
        out = self._events(self._decoder.feed(chunk))
        if not self._framed_cr and self._decoder.idle:
            # between events, and model's name now learned (llama.cpp reports its own):
            # whole blocks again
            self._decoder = None
        return out

    def end(self) -> bytes:
        """The body ended: what is left (an event without its blank line still counts)."""
        decoder = self._decoder or SSEDecoder()
        rest = decoder.feed(self._tail) + decoder.flush()
        self._tail = b""
        return self._events(rest)

    def _observe(self, block: bytes) -> None:
        if not self.first_token and _has_token(block):
            self.first_token = True
        if b'"prompt_tokens"' in block:
            self.usage = _usage(block) or self.usage
        if not self.done and _has_done_line(block):
            self.done = True

    def _events(self, payloads: list[bytes]) -> bytes:
        """Decoded events re-framed as ``data: ...``, then observed like a block."""
        block = b"".join([b"data: " + self._rewrite(p) + b"\n\n" for p in payloads])
        self._observe(block)
        return block


async def _relay(request: web.Request, route: ModelRoute, up: UpstreamResponse,
                 rewrite: _ModelRewriter, t0: float) -> web.StreamResponse:
    server = request.app[CONFIG].server
    metrics = request.app[METRICS]
    writer = await StreamWriter.open(request, content_type="text/event-stream",
                                     write_timeout=server.write_timeout,
                                     ping_interval=server.ping_interval, ping_frame=_PING)
    relay = _Relay(rewrite)
    reason = "client_disconnect"
    timed = False  # time to first token observed
    gauge = metrics.in_flight.labels("chat", route.name)
    gauge.inc()
    try:
        with routing.drainable(request) as handle:
            try:
                async for chunk in up.chunks():
                    out = relay.feed(chunk)
                    if not timed and relay.first_token:
                        timed = True
                        metrics.ttft.labels("chat", route.name).observe(
                            time.perf_counter() - t0)
                    if out:
                        await writer.write(out)
                out = relay.end()
                if out:
                    await writer.write(out)
                reason = "completed" if relay.done else "upstream_truncated"
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
        if relay.usage is not None:
            metrics.tokens.labels(route.name, "input").inc(relay.usage[0])
            metrics.tokens.labels(route.name, "output").inc(relay.usage[1])
    await writer.close()
    return writer.response


async def _inband_error(writer: StreamWriter, err: errors.GatewayError) -> None:
    try:
        await writer.write(b"data: " + errors.openai_body(err) + b"\n\n")
    except ClientGone:
        pass
