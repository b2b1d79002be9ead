"""The leanest Anthropic -> OpenAI translator we can write: the gateway's floor.

    python -m tests.benchmarks.lean_floor PORT UPSTREAM_BASE_URL

Written only for speed, to make "gateway / floor" mean something: orjson, byte templates
for every event (only the variable parts are encoded), one ``ClientSession`` with an
unlimited pool, uvloop as the gateway has. No auth, metrics, logging or validation; text
and reasoning only (no tools, images or stop sequences).

Protocol facts used (Anthropic Messages API, OpenAI chat completions):
- ``system`` is a string or a list of text blocks; it becomes the first ``system`` message.
- a message's ``content`` is a string or a list of blocks; text blocks are joined.
- buffered reply: ``content`` holds a ``thinking`` block (from ``reasoning_content``) and
  a ``text`` block; ``finish_reason`` stop -> ``end_turn``, length -> ``max_tokens``.
- stream: ``message_start``, per block ``content_block_start`` / ``content_block_delta``
  (``thinking_delta`` / ``text_delta``) / ``content_block_stop``, then ``message_delta``
  (stop_reason, output_tokens) and ``message_stop``; each event is
  ``event: NAME\\ndata: JSON\\n\\n``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import aiohttp
from aiohttp import web

try:  # the bench extra installs orjson; ujson (the gateway's) otherwise, or when asked
    if os.environ.get("LEAN_FLOOR_JSON") == "ujson":
        raise ImportError("ujson asked for")
    from orjson import dumps, loads
except ImportError:  # pragma: no cover - depends on the environment
    import ujson

    def dumps(obj: Any) -> bytes:
        return ujson.dumps(obj, ensure_ascii=False, escape_forward_slashes=False).encode()

    loads = ujson.loads

_SESSION = web.AppKey("session", aiohttp.ClientSession)
_URL = web.AppKey("url", str)
_STOP = {"stop": b'"end_turn"', "length": b'"max_tokens"', "tool_calls": b'"tool_use"'}
_HEADERS = {"Content-Type": "application/json"}

_START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_%s",'
    b'"type":"message","role":"assistant","model":%s,"content":[],"stop_reason":null,'
    b'"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}}\n\n'
)
_OPEN = (
    b'event: content_block_start\ndata: {"type":"content_block_start","index":%d,'
    b'"content_block":{"type":"%s","%s":""}}\n\n'
)
_DELTA = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
    b'"delta":{"type":"%s_delta","%s":%s}}\n\n'
)
_CLOSE = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}\n\n'
_END = (
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":%s,'
    b'"stop_sequence":null},"usage":{"output_tokens":%d}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)
_MESSAGE = (
    b'{"id":"msg_%s","type":"message","role":"assistant","model":%s,"content":[%s],'
    b'"stop_reason":%s,"stop_sequence":null,'
    b'"usage":{"input_tokens":%d,"output_tokens":%d}}'
)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if b.get("type") == "text")


def _to_chat(req: dict[str, Any]) -> bytes:
    messages = [{"role": "system", "content": _text(req["system"])}] if req.get("system") else []
    messages += [{"role": m["role"], "content": _text(m["content"])} for m in req["messages"]]
    out = {"model": req["model"], "messages": messages, "max_tokens": req["max_tokens"]}
    if req.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return dumps(out)


async def _messages(request: web.Request) -> web.StreamResponse:
    req = loads(await request.read())
    model = dumps(req["model"])
    async with request.app[_SESSION].post(
        request.app[_URL], data=_to_chat(req), headers=_HEADERS
    ) as up:
        if not req.get("stream"):
            done = loads(await up.read())
            choice, usage = done["choices"][0], done.get("usage") or {}
            msg, parts = choice["message"], []
            if msg.get("reasoning_content"):
                parts.append(
                    b'{"type":"thinking","thinking":%s,"signature":""}'
                    % dumps(msg["reasoning_content"])
                )
            if msg.get("content"):
                parts.append(b'{"type":"text","text":%s}' % dumps(msg["content"]))
            body = _MESSAGE % (
                os.urandom(12).hex().encode(),
                model,
                b",".join(parts),
                _STOP.get(choice.get("finish_reason"), b'"end_turn"'),
                usage.get("prompt_tokens", 0),
                usage.get("completion_tokens", 0),
            )
            return web.Response(body=body, content_type="application/json")
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        await resp.write(_START % (os.urandom(12).hex().encode(), model))
        kind, index, finish, tokens, pending = b"", -1, b'"end_turn"', 0, b""
        async for data in up.content.iter_any():
            events = (pending + data).split(b"\n\n")
            pending = events.pop()
            out = []
            for event in events:
                if not event.startswith(b"data: {"):
                    continue
                chunk = loads(event[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"].get("completion_tokens", 0)
                for choice in chunk["choices"]:
                    delta = choice["delta"]
                    for key, name in (("reasoning_content", b"thinking"), ("content", b"text")):
                        if delta.get(key):
                            if kind != name:
                                if kind:
                                    out.append(_CLOSE % index)
                                kind, index = name, index + 1
                                out.append(_OPEN % (index, name, name))
                            out.append(_DELTA % (index, name, name, dumps(delta[key])))
                    if choice.get("finish_reason"):
                        finish = _STOP.get(choice["finish_reason"], b'"end_turn"')
            if out:
                await resp.write(b"".join(out))
        await resp.write((_CLOSE % index if kind else b"") + _END % (finish, tokens))
        await resp.write_eof()
        return resp


async def _session(app: web.Application):  # type: ignore[no-untyped-def]
    app[_SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    yield
    await app[_SESSION].close()


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def main(argv: list[str]) -> None:
    app = web.Application()
    app[_URL] = argv[2].rstrip("/") + "/chat/completions"
    app.cleanup_ctx.append(_session)
    app.router.add_post("/v1/messages", _messages)
    app.router.add_get("/health", _health)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - the gateway falls back the same way
        loop = None
    else:
        loop = uvloop.new_event_loop()
    web.run_app(
        app,
        host="127.0.0.1",
        port=int(argv[1]),
        access_log=None,
        print=None,
        backlog=4096,
        loop=loop,
    )


if __name__ == "__main__":
    main(sys.argv)
