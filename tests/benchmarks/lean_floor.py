"""A lean Anthropic -> OpenAI translator: the floor the gateway is compared with.

    python -m tests.benchmarks.lean_floor PORT UPSTREAM_BASE_URL

What a minimal translator has to do and nothing else: no auth, metrics, logging or
validation; text and reasoning only (no tools, images or stop sequences).

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

import secrets
import sys
from typing import Any

import aiohttp
import ujson
from aiohttp import web

_SESSION = web.AppKey("session", aiohttp.ClientSession)
_UPSTREAM = web.AppKey("upstream", str)
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_HEADERS = {"Content-Type": "application/json"}


def _dumpb(obj: Any) -> bytes:
    return ujson.dumps(obj, ensure_ascii=False, escape_forward_slashes=False).encode()


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if b.get("type") == "text")


def _to_chat(req: dict[str, Any]) -> dict[str, Any]:
    messages = []
    if req.get("system"):
        messages.append({"role": "system", "content": _text(req["system"])})
    for m in req["messages"]:
        messages.append({"role": m["role"], "content": _text(m["content"])})
    out = {"model": req["model"], "messages": messages, "max_tokens": req["max_tokens"],
           "stream": bool(req.get("stream"))}
    if out["stream"]:
        out["stream_options"] = {"include_usage": True}
    for key in ("temperature", "top_p"):
        if key in req:
            out[key] = req[key]
    return out


def _message_id() -> str:
    return "msg_" + secrets.token_hex(12)


def _from_chat(model: str, completion: dict[str, Any]) -> dict[str, Any]:
    choice = completion["choices"][0]
    msg = choice["message"]
    content: list[dict[str, Any]] = []
    if msg.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": msg["reasoning_content"],
                        "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    usage = completion.get("usage") or {}
    return {"id": _message_id(), "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": _STOP.get(choice.get("finish_reason"), "end_turn"),
            "stop_sequence": None,
            "usage": {"input_tokens": usage.get("prompt_tokens", 0),
                      "output_tokens": usage.get("completion_tokens", 0)}}


def _event(name: bytes, body: bytes) -> bytes:
    return b"event: " + name + b"\ndata: " + body + b"\n\n"


class _Translator:
    """Upstream ``data:`` payloads in, Anthropic SSE bytes out."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.kind: str | None = None
        self.index = -1
        self.finish: str | None = None
        self.output_tokens = 0
        self.input_tokens = 0

    def start(self) -> bytes:
        return _event(b"message_start", _dumpb({"type": "message_start", "message": {
            "id": _message_id(), "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0}}}))

    def _switch(self, kind: str, out: list[bytes]) -> None:
        if self.kind == kind:
            return
        self._close(out)
        self.index += 1
        self.kind = kind
        block = {"type": kind, kind: ""}
        out.append(_event(b"content_block_start", _dumpb(
            {"type": "content_block_start", "index": self.index, "content_block": block})))

    def _close(self, out: list[bytes]) -> None:
        if self.kind is not None:
            out.append(_event(b"content_block_stop",
                              b'{"type":"content_block_stop","index":%d}' % self.index))
            self.kind = None

    def feed(self, payload: bytes) -> bytes:
        if payload == b"[DONE]":
            return b""
        chunk = ujson.loads(payload)
        out: list[bytes] = []
        usage = chunk.get("usage")
        if usage:
            self.input_tokens = usage.get("prompt_tokens", 0)
            self.output_tokens = usage.get("completion_tokens", 0)
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                self._switch("thinking", out)
                out.append(_event(b"content_block_delta", _dumpb({
                    "type": "content_block_delta", "index": self.index,
                    "delta": {"type": "thinking_delta", "thinking": reasoning}})))
            if delta.get("content"):
                self._switch("text", out)
                out.append(_event(b"content_block_delta", _dumpb({
                    "type": "content_block_delta", "index": self.index,
                    "delta": {"type": "text_delta", "text": delta["content"]}})))
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return b"".join(out)

    def end(self) -> bytes:
        out: list[bytes] = []
        self._close(out)
        out.append(_event(b"message_delta", _dumpb({
            "type": "message_delta",
            "delta": {"stop_reason": _STOP.get(self.finish or "stop", "end_turn"),
                      "stop_sequence": None},
            "usage": {"output_tokens": self.output_tokens}})))
        out.append(_event(b"message_stop", b'{"type":"message_stop"}'))
        return b"".join(out)


async def _messages(request: web.Request) -> web.StreamResponse:
    req = ujson.loads(await request.read())
    session = request.app[_SESSION]
    url = request.app[_UPSTREAM] + "/chat/completions"
    async with session.post(url, data=_dumpb(_to_chat(req)), headers=_HEADERS) as up:
        if not req.get("stream"):
            completion = ujson.loads(await up.read())
            return web.Response(body=_dumpb(_from_chat(req["model"], completion)),
                                content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        tr = _Translator(req["model"])
        await resp.write(tr.start())
        pending = b""
        async for data in up.content.iter_any():
            events = (pending + data).split(b"\n\n")
            pending = events.pop()
            out = [tr.feed(e[6:]) for e in events if e.startswith(b"data: ")]
            if out:
                await resp.write(b"".join(out))
        await resp.write(tr.end())
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
    app[_UPSTREAM] = argv[2].rstrip("/")
    app.cleanup_ctx.append(_session)
    app.router.add_post("/v1/messages", _messages)
    app.router.add_get("/health", _health)
    web.run_app(app, host="127.0.0.1", port=int(argv[1]), access_log=None, print=None,
                backlog=4096)


if __name__ == "__main__":
    main(sys.argv)
