"""A misbehaving OpenAI-compatible upstream for the upstream-client tests (issue 15).

    python tests/hostile_upstream.py PORT

A raw asyncio TCP server, not aiohttp: it must be able to send bytes no HTTP library
would (a reply twice, a body past its ``Content-Length``, control characters in a
head). It reads just enough HTTP/1.1 (a request head and a ``Content-Length`` body,
keep-alive) and answers with the scenario named by the request's JSON ``model``, as
tests/stub_upstream.py does. Bodies and streams are vLLM-shaped.

Every normal reply's text is ``reply for <token>``, where the token is the text of the
request's last user message (``prompt`` or ``input`` on the other OpenAI endpoints), so
a test can check that each client got *its* reply. Every reply echoes the request's
``X-Request-Id`` as vLLM does, unless the model ends in ``@noecho``.

    ok[:MS]              the reply (buffered or streamed), after MS ms (default 0)
    double               the reply twice, in one write
    double-late:MS       the reply, and the same reply again MS ms later
    unsolicited:MS       the reply, and MS ms later a reply to nobody (``reply for stray-N``,
                         no X-Request-Id) on the same connection
    overrun:MS           a body longer than its Content-Length: the extra bytes (the start of
                         another reply carrying this token) at once, the rest MS ms later
    cl-te                Content-Length together with Transfer-Encoding: chunked
    http10-chunked       HTTP/1.0, chunked, Connection: keep-alive
    bad-status:NNN       status NNN (000, 099); 101 is followed by a normal 200 reply
    bad-header:KIND      space-name (``Content-Length : N``), ctl-name, ctl-value (a vertical
                         tab after the length), ws-value (``Content-Length: 1 2``), te-ctl
                         (``chunked`` + vertical tab), leak (a control character in a header
                         that quotes the key and an internal host)
    cl30                 a 30-digit Content-Length
    bare-lf              a head whose lines end in LF alone
    flood-1xx:BYTES      BYTES of ``HTTP/1.1 100 Continue\\r\\n\\r\\n``, then the reply
    drip-head:MS         the head one byte every MS ms
    drip-1xx:MS          a ``100 Continue`` head every MS ms, never a final head
    drip-body:MS         the head at once, then the body one byte every MS ms
    drip-stream:MS       a stream's head and first two events (the role, a first word), then a
                         comment or a blank line every MS ms, never another event
    drip-trailer:MS      a whole chunked body, then trailer bytes one every MS ms
    gzip-bomb            ``Content-Encoding: gzip``, about 1 MiB inflating to 1 GiB (JSON
                         whitespace, then a completion), built once, streaming, with zlib
    size-bomb:MIB        a chunked body of MIB MiB, streamed (buffered: JSON whitespace then a
                         completion; streamed: one ``data:`` line that never ends)
    leak:STATUS          HTTP STATUS whose error message (and Server/X-Backend headers) quote
                         the Authorization header received, the bare key, its URL-encoded form
                         and internal hosts (``gpu-node-7.internal.example:8000``, ``fd00::17``)
    leak-disguised:HOW   a 200 whose in-band error hides from a grep for ``"error"``:
                         escaped, event, type, text (see _disguised_leak)
    leak-inband:STATUS   a 200 carrying the same text as an in-band error: an error event
                         after the first chunk of a stream, or an error body when buffered
    nan-inband           a 200 whose in-band error holds numbers JSON cannot (``"code": NaN``,
                         ``Infinity``, ``1e400``; ujson reads them): after the first chunk of a
                         stream, or as the body when buffered
    wrong-id             the reply, echoing an X-Request-Id that is not the request's
    reset                the connection reset (RST) before any byte of the reply
    malformed-head       a head with a line that is not a header
    cut-body             Content-Length 1000, 100 bytes, then the connection closed

``GET /health`` answers 200. ``GET /_requests`` lists the last 10,000 POSTs (``conn``:
the connection's number, ``seq``: its place on that connection, ``model``, ``token``,
``request_id``, ``auth``); ``GET /_stats`` counts connections accepted and open now and
requests. Drips stop after 60 s and bombs at their size, so nothing runs on by itself.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import socket
import struct
import sys
import time
import urllib.parse
import zlib
from typing import Any

CREATED = 1700000000
INTERNAL_HOSTS = ("gpu-node-7.internal.example:8000", "fd00::17")
_DRIP_LIMIT = 60.0  # seconds a drip runs at most
_MIB = 1 << 20


class Request:
    __slots__ = ("body", "conn", "headers", "method", "path", "seq")

    def __init__(
        self, method: str, path: str, headers: dict[str, str], body: bytes, conn: int, seq: int
    ) -> None:
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
        self.conn = conn
        self.seq = seq


class Stats:
    def __init__(self) -> None:
        self.conn_ids = itertools.count(1)
        self.accepted = 0
        self.open = 0
        self.requests = 0
        self.log: collections.deque[dict[str, Any]] = collections.deque(maxlen=10_000)


STATS = Stats()
_BOMB: bytes | None = None


# --- reading requests ----------------------------------------------------------------


async def _read_request(reader: asyncio.StreamReader, conn: int, seq: int) -> Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _version = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            parts.append(await reader.readexactly(size + 2))
        body = b"".join(p[:-2] for p in parts)
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Request(method, path, headers, body, conn, seq)


def _token(body: dict[str, Any]) -> str:
    """The text of the last user message (or the prompt / input)."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content).strip()
    for key in ("prompt", "input"):
        value = body.get(key)
        if isinstance(value, list):
            value = value[-1] if value else ""
        if isinstance(value, dict):
            value = value.get("content", "")
        if isinstance(value, str):
            return value.strip()
    return ""


# --- building replies ----------------------------------------------------------------


def _head(status: str, headers: list[tuple[str, str]], *, version: str = "HTTP/1.1") -> bytes:
    lines = [f"{version} {status}", "date: Mon, 01 Jan 2024 00:00:00 GMT", "server: uvicorn"]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _completion(model: str, text: str) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-hostile",
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11},
        },
        separators=(",", ":"),
    ).encode()


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-hostile",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def _events(model: str, text: str) -> list[bytes]:
    words = text.split(" ")
    pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
    return [
        _chunk(model, {"role": "assistant", "content": ""}),
        *[_chunk(model, {"content": p}) for p in pieces],
        _chunk(model, {}, "stop"),
        b"data: [DONE]\n\n",
    ]


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _id_headers(req: Request, echo: bool, request_id: str | None = None) -> list[tuple[str, str]]:
    rid = request_id if request_id is not None else req.headers.get("x-request-id")
    return [("x-request-id", rid)] if echo and rid else []


def _reply(
    req: Request,
    model: str,
    text: str,
    stream: bool,
    echo: bool,
    *,
    request_id: str | None = None,
    version: str = "HTTP/1.1",
    extra: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """One whole, well-framed reply."""
    ids = _id_headers(req, echo, request_id)
    if stream:
        head = _head(
            "200 OK",
            [
                ("content-type", "text/event-stream; charset=utf-8"),
                ("transfer-encoding", "chunked"),
                *ids,
                *extra,
            ],
            version=version,
        )
        return head + b"".join(_chunked(e) for e in _events(model, text)) + b"0\r\n\r\n"
    body = _completion(model, text)
    head = _head(
        "200 OK",
        [("content-type", "application/json"), ("content-length", str(len(body))), *ids, *extra],
        version=version,
    )
    return head + body


def _leak_text(req: Request) -> str:
    auth = req.headers.get("authorization", "")
    key = auth.removeprefix("Bearer ")
    return (
        f"Invalid request: the key {key} was rejected (header '{auth}', "
        f"query api_key={urllib.parse.quote(key, safe='')}); backend "
        f"{INTERNAL_HOSTS[0]} via [{INTERNAL_HOSTS[1]}]:8000 and {INTERNAL_HOSTS[1]} "
        "refused it"
    )


def _disguised_leak(
    req: Request, model: str, text: str, how: str, stream: bool, echo: bool
) -> bytes:
    """An error that a grep for the bytes ``"error"`` misses: its key spelt with an escape
    (``escaped``), non-JSON data in an ``event: error`` (``event``), ``{"type": "error"}``
    without an ``error`` key (``type``), or the key in a non-JSON data line (``text``)."""
    msg = _leak_text(req)
    if how == "escaped":
        data = (
            json.dumps({"error": {"message": msg, "code": 500}})
            .replace('"error"', '"\\u0065rror"', 1)
            .encode()
        )
    elif how == "type":
        data = json.dumps({"type": "error", "message": msg, "code": 500}).encode()
    else:
        data = msg.encode()
    if not stream:
        return (
            _head(
                "200 OK",
                [
                    ("content-type", "application/json"),
                    ("content-length", str(len(data))),
                    *_id_headers(req, echo),
                ],
            )
            + data
        )
    name = b"event: error\n" if how == "event" else b""
    return (
        _head(
            "200 OK",
            [
                ("content-type", "text/event-stream; charset=utf-8"),
                ("transfer-encoding", "chunked"),
                *_id_headers(req, echo),
            ],
        )
        + _chunked(_events(model, text)[0])
        + _chunked(name + b"data: " + data + b"\n\n")
        + b"0\r\n\r\n"
    )


def _gzip_bomb(model: str) -> bytes:
    """About 1 MiB of gzip inflating to 1 GiB: JSON whitespace, then a completion.

    After a full flush deflate keeps no history, so every flushed MiB of spaces
    compresses to the same bytes: compress one, repeat it.
    """
    global _BOMB
    if _BOMB is None:
        block = b" " * _MIB
        tail = _completion(model, "reply for the bomb")
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        first = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
        again = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
        end = c.compress(tail) + c.flush()
        crc = 0
        for _ in range(1024):
            crc = zlib.crc32(block, crc)
        crc = zlib.crc32(tail, crc)
        size = (1024 * _MIB + len(tail)) & 0xFFFFFFFF
        _BOMB = (
            b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
            + first
            + again * 1023
            + end
            + struct.pack("<II", crc, size)
        )
    return _BOMB


# --- serving -----------------------------------------------------------------------


async def _drip(writer: asyncio.StreamWriter, data: bytes, every: float, chunk: int = 1) -> None:
    """``data`` ``chunk`` bytes at a time, one every ``every`` seconds, for at most a minute."""
    deadline = time.monotonic() + _DRIP_LIMIT
    for i in range(0, len(data), chunk):
        if time.monotonic() > deadline:
            return
        writer.write(data[i : i + chunk])
        await writer.drain()
        await asyncio.sleep(every)


async def _drip_forever(writer: asyncio.StreamWriter, pieces: list[bytes], every: float) -> None:
    deadline = time.monotonic() + _DRIP_LIMIT
    for piece in itertools.cycle(pieces):
        if time.monotonic() > deadline:
            return
        writer.write(piece)
        await writer.drain()
        await asyncio.sleep(every)


async def _later(writer: asyncio.StreamWriter, delay: float, data: bytes) -> None:
    await asyncio.sleep(delay)
    if not writer.is_closing():
        writer.write(data)


_LATER: set[asyncio.Task[None]] = set()
_STRAYS = itertools.count(1)


def _write_later(writer: asyncio.StreamWriter, delay: float, data: bytes) -> None:
    task = asyncio.get_running_loop().create_task(_later(writer, delay, data))
    _LATER.add(task)
    task.add_done_callback(_LATER.discard)


async def _size_bomb(writer: asyncio.StreamWriter, model: str, mib: int, stream: bool) -> None:
    ctype = "text/event-stream" if stream else "application/json"
    writer.write(_head("200 OK", [("content-type", ctype), ("transfer-encoding", "chunked")]))
    block = _chunked(b"a" * 65536 if stream else b" " * 65536)
    if stream:
        writer.write(
            _chunked(b'data: {"id":"chatcmpl-hostile","choices":[{"index":0,"delta":{"content":"')
        )
    for _ in range(mib * 16):
        writer.write(block)
        await writer.drain()
    if not stream:
        writer.write(_chunked(_completion(model, "reply for the bomb")))
    writer.write(b"0\r\n\r\n")


async def _answer(req: Request, writer: asyncio.StreamWriter) -> bool:
    """Answer one POST; False: the connection is to be closed."""
    try:
        body = json.loads(req.body or b"{}")
    except ValueError:
        body = {}
    model = str(body.get("model", "ok"))
    echo = not model.endswith("@noecho")
    scenario, _, arg = model.removesuffix("@noecho").partition(":")
    token = _token(body)
    text = f"reply for {token}"
    stream = body.get("stream") is True
    STATS.log.append(
        {
            "conn": req.conn,
            "seq": req.seq,
            "model": model,
            "token": token,
            "request_id": req.headers.get("x-request-id"),
            "auth": req.headers.get("authorization"),
            "path": req.path,
        }
    )
    ms = float(arg) / 1000 if arg.replace(".", "", 1).isdigit() else 0.0
    w = writer.write

    if scenario == "ok":
        if ms:
            await asyncio.sleep(ms)
        w(_reply(req, model, text, stream, echo))
    elif scenario == "double":
        w(_reply(req, model, text, stream, echo) * 2)
    elif scenario == "double-late":
        reply = _reply(req, model, text, stream, echo)
        w(reply)
        _write_later(writer, ms, reply)
    elif scenario == "unsolicited":
        w(_reply(req, model, text, stream, echo))
        stray = f"stray-{next(_STRAYS)}"
        _write_later(writer, ms, _reply(req, model, f"reply for {stray}", stream, False))
    elif scenario == "overrun":
        # A reply whose body runs on: the smuggled bytes are a whole reply of their own.
        smuggled = _reply(req, model, text + " (smuggled)", stream=False, echo=echo)
        reply = _reply(req, model, text, stream=False, echo=echo)
        w(reply + smuggled[:40])
        _write_later(writer, ms, smuggled[40:])
    elif scenario == "cl-te":
        data = _completion(model, text)
        w(
            _head(
                "200 OK",
                [
                    ("content-type", "application/json"),
                    ("content-length", str(len(data))),
                    ("transfer-encoding", "chunked"),
                    *_id_headers(req, echo),
                ],
            )
            + _chunked(data)
            + b"0\r\n\r\n"
        )
    elif scenario == "http10-chunked":
        w(
            _reply(
                req,
                model,
                text,
                True,
                echo,
                version="HTTP/1.0",
                extra=(("connection", "keep-alive"),),
            )
            if stream
            else _head(
                "200 OK",
                [
                    ("content-type", "application/json"),
                    ("transfer-encoding", "chunked"),
                    ("connection", "keep-alive"),
                    *_id_headers(req, echo),
                ],
                version="HTTP/1.0",
            )
            + _chunked(_completion(model, text))
            + b"0\r\n\r\n"
        )
    elif scenario == "bad-status":
        if arg == "101":
            w(
                b"HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: websocket"
                b"\r\n\r\n" + _reply(req, model, text, stream, echo)
            )
        else:
            data = _completion(model, text)
            w(
                f"HTTP/1.1 {arg} OK\r\ncontent-type: application/json\r\ncontent-length: "
                f"{len(data)}\r\n\r\n".encode()
                + data
            )
    elif scenario == "bad-header":
        data = _completion(model, text)
        n = len(data)
        header = {
            "space-name": f"content-length : {n}",
            "ctl-name": f"x-fo\x01o: 1\r\ncontent-length: {n}",
            "ctl-value": f"content-length: {n}\x0b",
            "ws-value": f"content-length: {str(n)[:1]} {str(n)[1:]}",
            "te-ctl": "transfer-encoding: chunked\x0b",
            "leak": f"x-debug: {_leak_text(req)}\x01\r\ncontent-length: {n}",
        }[arg]
        framed = _chunked(data) + b"0\r\n\r\n" if arg == "te-ctl" else data
        w(
            ("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + header + "\r\n\r\n").encode(
                "latin-1"
            )
            + framed
        )
    elif scenario == "cl30":
        w(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            b"123456789012345678901234567890\r\n\r\n" + _completion(model, text)
        )
    elif scenario == "bare-lf":
        w(_reply(req, model, text, False, echo).replace(b"\r\n", b"\n"))
    elif scenario == "flood-1xx":
        flood = b"HTTP/1.1 100 Continue\r\n\r\n"
        w(flood * (int(arg or _MIB) // len(flood)))
        await writer.drain()
        w(_reply(req, model, text, stream, echo))
    elif scenario == "drip-head":
        await _drip(writer, _reply(req, model, text, stream, echo), ms)
    elif scenario == "drip-1xx":
        await _drip_forever(writer, [b"HTTP/1.1 100 Continue\r\n\r\n"], ms)
        return False
    elif scenario == "drip-body":
        reply = _reply(req, model, text, False, echo)
        cut = reply.index(b"\r\n\r\n") + 4
        w(reply[:cut])
        await _drip(writer, reply[cut:], ms)
    elif scenario == "drip-stream":
        w(
            _head(
                "200 OK",
                [
                    ("content-type", "text/event-stream; charset=utf-8"),
                    ("transfer-encoding", "chunked"),
                    *_id_headers(req, echo),
                ],
            )
            + b"".join(_chunked(e) for e in _events(model, text)[:2])
        )
        await _drip_forever(writer, [_chunked(b": keep-alive\n\n"), _chunked(b"\n")], ms)
        return False
    elif scenario == "drip-trailer":
        data = _completion(model, text)
        w(
            _head(
                "200 OK",
                [
                    ("content-type", "application/json"),
                    ("transfer-encoding", "chunked"),
                    ("trailer", "x-checksum"),
                    *_id_headers(req, echo),
                ],
            )
            + _chunked(data)
            + b"0\r\n"
        )
        await _drip(writer, b"x-checksum: " + b"a" * 200 + b"\r\n\r\n", ms)
    elif scenario == "gzip-bomb":
        bomb = _gzip_bomb(model)
        ctype = "text/event-stream" if stream else "application/json"
        w(
            _head(
                "200 OK",
                [
                    ("content-type", ctype),
                    ("content-encoding", "gzip"),
                    ("content-length", str(len(bomb))),
                    *_id_headers(req, echo),
                ],
            )
        )
        w(bomb)
    elif scenario == "size-bomb":
        await _size_bomb(writer, model, int(arg or 512), stream)
    elif scenario == "leak":
        status = int(arg or 400)
        msg = _leak_text(req)
        data = json.dumps(
            {
                "object": "error",
                "message": msg,
                "type": "BadRequestError",
                "param": None,
                "code": status,
            }
        ).encode()
        w(
            _head(
                f"{status} Error",
                [
                    ("content-type", "application/json"),
                    ("content-length", str(len(data))),
                    ("x-backend", INTERNAL_HOSTS[0]),
                    ("x-upstream-auth", req.headers.get("authorization", "")),
                    *_id_headers(req, echo),
                ],
            )
            + data
        )
    elif scenario == "leak-inband":
        error = {
            "error": {
                "message": _leak_text(req),
                "type": "BadRequestError",
                "code": int(arg or 500),
            }
        }
        data = json.dumps(error).encode()
        if stream:
            w(
                _head(
                    "200 OK",
                    [
                        ("content-type", "text/event-stream; charset=utf-8"),
                        ("transfer-encoding", "chunked"),
                        *_id_headers(req, echo),
                    ],
                )
                + _chunked(_events(model, text)[0])
                + _chunked(b"data: " + data + b"\n\n")
                + b"0\r\n\r\n"
            )
        else:
            w(
                _head(
                    "200 OK",
                    [
                        ("content-type", "application/json"),
                        ("content-length", str(len(data))),
                        *_id_headers(req, echo),
                    ],
                )
                + data
            )
    elif scenario == "nan-inband":
        data = (
            b'{"error":{"message":"sampling failed","type":"InternalServerError",'
            b'"code":NaN,"param":Infinity,"details":[1e400,-Infinity]}}'
        )
        if stream:
            w(
                _head(
                    "200 OK",
                    [
                        ("content-type", "text/event-stream; charset=utf-8"),
                        ("transfer-encoding", "chunked"),
                        *_id_headers(req, echo),
                    ],
                )
                + _chunked(_events(model, text)[0])
                + _chunked(b"data: " + data + b"\n\n")
                + b"0\r\n\r\n"
            )
        else:
            w(
                _head(
                    "200 OK",
                    [
                        ("content-type", "application/json"),
                        ("content-length", str(len(data))),
                        *_id_headers(req, echo),
                    ],
                )
                + data
            )
    elif scenario == "leak-disguised":
        w(_disguised_leak(req, model, text, arg, stream, echo))
    elif scenario == "wrong-id":
        w(_reply(req, model, text, stream, True, request_id="req_not_yours_0000000000"))
    elif scenario == "reset":
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        return False
    elif scenario == "malformed-head":
        w(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nthis is not a header\r\n\r\n")
    elif scenario == "cut-body":
        w(
            _head(
                "200 OK",
                [
                    ("content-type", "application/json"),
                    ("content-length", "1000"),
                    *_id_headers(req, echo),
                ],
            )
            + _completion(model, text)[:100]
        )
        await writer.drain()
        return False
    else:
        data = b'{"error":{"message":"unknown scenario","code":404}}'
        w(_head("404 Not Found", [("content-length", str(len(data)))]) + data)
    await writer.drain()
    return True


async def _get(req: Request, writer: asyncio.StreamWriter) -> None:
    if req.path == "/_requests":
        data = json.dumps(list(STATS.log)).encode()
    elif req.path == "/_stats":
        data = json.dumps(
            {"connections": STATS.accepted, "open": STATS.open, "requests": STATS.requests}
        ).encode()
    else:
        data = b"ok"
    writer.write(
        _head("200 OK", [("content-type", "application/json"), ("content-length", str(len(data)))])
        + data
    )
    await writer.drain()


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    conn = next(STATS.conn_ids)
    STATS.accepted += 1
    STATS.open += 1
    try:
        for seq in itertools.count():
            req = await _read_request(reader, conn, seq)
            if req is None:
                break
            STATS.requests += 1
            if req.method == "GET":
                await _get(req, writer)
            elif not await _answer(req, writer):
                break
            if req.headers.get("connection", "").lower() == "close":
                break
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
        pass
    finally:
        STATS.open -= 1
        if not writer.is_closing():
            writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
