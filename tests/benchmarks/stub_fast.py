"""A fast OpenAI-compatible upstream for benchmarks (run as its own process).

    python -m tests.benchmarks.stub_fast PORT

Its own cost must vanish next to what it serves, so it is a raw ``asyncio.Protocol``
HTTP/1.1 server (keep-alive, no framework) answering from precomputed bytes:

* ``POST /v1/chat/completions`` with ``"stream": false``: one buffered completion
  (``reasoning_content`` + ``content``, usage), ``Content-Length`` framed.
* ``"stream": true``: chunked transfer, shaped like vLLM with a reasoning parser: a
  role chunk, N/2 ``reasoning_content`` deltas, N/2 ``content`` deltas, a finish
  chunk, a usage chunk (``choices: []``), ``data: [DONE]``.
* The request's ``model`` picks the scenario: ``bench:N:MS`` = N delta chunks, MS
  milliseconds apart (0: the whole body in one write, "bulk"); plain ``bench`` is
  ``bench:16:0``. Replies echo the model, as vLLM does.
* ``tools:CALLS:KIB``: a reply of CALLS tool calls, each with KIB KiB of broken arguments (a
  file's content, JSON-escaped code, cut off: what a model writes when ``max_tokens`` ends it),
  streamed as 16 KiB argument pieces, all in one write; buffered, one completion.
* ``POST /apply-template`` and ``POST /tokenize``: llama.cpp's tokenizer routes (what
  ``count_tokens`` calls on a ``kind = "llamacpp"`` upstream): the prompt a template makes of
  the messages (compact ``{"prompt":...}``), and one token per 4 characters of ``content``
  (ids of four digits, as a real vocabulary's: ``{"tokens":[1234,...]}``).
* ``GET /_stats``: streams open now, started, completed, aborted by the client.
* ``GET /health``: 200.
* ``--echo``: every reply's head carries the request's ``X-Request-Id``, as vLLM's does with
  ``--enable-request-id-headers`` (so the gateway's ``keepalive = "auto"`` turns keep-alive on).
* ``--slots N [--prefill-ms P]``: capacity like a real inference server's. At most N
  completions (streamed or buffered) are served at once, the rest wait for a slot; each
  holds its slot for P ms (prefill, before the first chunk) plus its N chunks' pacing (a
  buffered one answers after as long). ``GET /_slots``: slots, busy now, served.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys

CREATED = 1700000000
_MODEL = re.compile(rb'"model"\s*:\s*"([^"]*)"')
_STREAM = re.compile(rb'"stream"\s*:\s*true')
_REQUEST_ID = re.compile(rb"(?i)\r\nx-request-id:[ \t]*([^\r\n \t]*)")
_WORDS = [" alpha", " beta", " gamma", " delta", " epsilon", " zeta", " eta", " theta"]


def _dump(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _chunk(model: str, delta: dict, finish: str | None = None) -> bytes:
    return (
        b"data: "
        + _dump(
            {
                "id": "chatcmpl-bench",
                "object": "chat.completion.chunk",
                "created": CREATED,
                "model": model,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
        )
        + b"\n\n"
    )


def _framed(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def parse_model(model: str) -> tuple[int, float]:
    """``bench:N:MS`` -> (N chunks, delay seconds)."""
    parts = model.split(":")
    n = int(parts[1]) if len(parts) > 1 and parts[1] else 16
    ms = float(parts[2]) if len(parts) > 2 and parts[2] else 0.0
    return n, ms / 1000.0


class Scenario:
    """Every byte one model name needs, built once."""

    __slots__ = ("buffered", "delay", "stream_bulk", "stream_events", "stream_head")

    def __init__(self, model: str) -> None:
        if model.startswith("tools:"):
            self._tools(model)
            return
        n, self.delay = parse_model(model)
        half = n // 2
        events = [_chunk(model, {"role": "assistant", "content": ""})]
        events += [_chunk(model, {"reasoning_content": _WORDS[i % 8]}) for i in range(half)]
        events += [_chunk(model, {"content": _WORDS[i % 8]}) for i in range(n - half)]
        events.append(_chunk(model, {}, "stop"))
        events.append(
            b"data: "
            + _dump(
                {
                    "id": "chatcmpl-bench",
                    "object": "chat.completion.chunk",
                    "created": CREATED,
                    "model": model,
                    "choices": [],
                    "usage": {"prompt_tokens": 12, "completion_tokens": n, "total_tokens": 12 + n},
                }
            )
            + b"\n\n"
        )
        events.append(b"data: [DONE]\n\n")
        self.stream_head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        self.stream_events = [_framed(e) for e in events] + [b"0\r\n\r\n"]
        self.stream_bulk = self.stream_head + b"".join(self.stream_events)
        words = "".join(_WORDS[i % 8] for i in range(n))
        body = _dump(
            {
                "id": "chatcmpl-bench",
                "object": "chat.completion",
                "created": CREATED,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "reasoning_content": words[: len(words) // 2],
                            "content": words,
                            "tool_calls": [],
                        },
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 12, "completion_tokens": n, "total_tokens": 12 + n},
            }
        )
        self.buffered = (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )

    def _tools(self, model: str) -> None:
        _, calls, kib = model.split(":")
        line = json.dumps('def f(x):\n    return "x" * 2  # a line \\ of code\n')[1:-1]
        arguments = '{"path": "a.py", "content": "' + line * (int(kib) * 1024 // len(line))
        self.delay = 0.0
        events = [_chunk(model, {"role": "assistant", "content": None})]
        piece = 16 * 1024
        for i in range(int(calls)):
            for start in range(0, len(arguments), piece):
                call: dict = {
                    "index": i,
                    "function": {"arguments": arguments[start : start + piece]},
                }
                if start == 0:
                    call.update(id=f"call_{i}", type="function")
                    call["function"]["name"] = "write"
                events.append(_chunk(model, {"tool_calls": [call]}))
        events.append(_chunk(model, {}, "tool_calls"))
        events.append(b"data: [DONE]\n\n")
        self.stream_head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        self.stream_events = [_framed(e) for e in events] + [b"0\r\n\r\n"]
        self.stream_bulk = self.stream_head + b"".join(self.stream_events)
        body = _dump(
            {
                "id": "chatcmpl-bench",
                "object": "chat.completion",
                "created": CREATED,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": f"call_{i}",
                                    "type": "function",
                                    "function": {"name": "write", "arguments": arguments},
                                }
                                for i in range(int(calls))
                            ],
                        },
                        "logprobs": None,
                        "finish_reason": "tool_calls",
                    }
                ],
                "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
            }
        )
        self.buffered = (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )

    def echoing(self, request_id: bytes) -> Scenario:
        """The same replies, their heads carrying ``X-Request-Id: request_id``."""
        header = b"\r\nX-Request-Id: " + request_id
        sc = object.__new__(Scenario)
        sc.delay = self.delay
        sc.stream_events = self.stream_events
        sc.stream_head = self.stream_head.replace(b"\r\n", header + b"\r\n", 1)
        sc.stream_bulk = sc.stream_head + self.stream_bulk[len(self.stream_head) :]
        sc.buffered = self.buffered.replace(b"\r\n", header + b"\r\n", 1)
        return sc


class Stats:
    open = 0
    started = 0
    completed = 0
    aborted = 0


_SCENARIOS: dict[str, Scenario] = {}


def _scenario(model: str) -> Scenario:
    sc = _SCENARIOS.get(model)
    if sc is None:
        sc = _SCENARIOS[model] = Scenario(model)
    return sc


def _tokenizer(path: bytes, body: bytes) -> bytes:
    req = json.loads(body)
    if path == b"/apply-template":
        prompt = (
            "".join(
                f"<|{m['role']}|>{m['content']}<|end|>"
                for m in req["messages"]
                if isinstance(m.get("content"), str)
            )
            + "<|assistant|>"
        )
        return json.dumps({"prompt": prompt}, ensure_ascii=False, separators=(",", ":")).encode()
    n = max(1, len(req.get("content", "")) // 4)
    return b'{"tokens":[' + b"1234," * (n - 1) + b"1234]}"


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def _simple(status: str, body: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status.encode(),
        len(body),
        body,
    )


class _Server(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = bytearray()  # appended in place: a 30 MiB body arrives in many reads
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while not self.busy:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end])
            length = _content_length(head)
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4 : end + 4 + length])
            del self.buf[: end + 4 + length]
            self._handle(head, body)

    def _handle(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        line = head[: head.find(b"\r\n")] if b"\r\n" in head else head
        method, _, rest = line.partition(b" ")
        path = rest.partition(b" ")[0]
        if method == b"GET" and path == b"/_stats":
            self.transport.write(
                _simple(
                    "200 OK",
                    _dump(
                        {
                            "open": Stats.open,
                            "started": Stats.started,
                            "completed": Stats.completed,
                            "aborted": Stats.aborted,
                        }
                    ),
                )
            )
            return
        if method == b"GET" and path == b"/_slots":
            self.transport.write(
                _simple(
                    "200 OK",
                    _dump({"slots": Slots.size, "busy": Slots.busy, "served": Slots.served}),
                )
            )
            return
        if method == b"GET" and path == b"/health":
            self.transport.write(_simple("200 OK", b'{"status":"ok"}'))
            return
        if method == b"POST" and path in (b"/apply-template", b"/tokenize"):
            self.transport.write(_simple("200 OK", _tokenizer(path, body)))
            return
        if method != b"POST" or not path.endswith(b"/chat/completions"):
            self.transport.write(_simple("404 Not Found", b'{"error":"not found"}'))
            return
        m = _MODEL.search(body)
        sc = _scenario(m.group(1).decode() if m else "bench")
        if Echo.on:
            rid = _REQUEST_ID.search(head)
            if rid is not None:
                sc = sc.echoing(rid.group(1))
        if Slots.sem is not None:
            self.busy = True
            self.task = asyncio.ensure_future(self._slotted(sc, bool(_STREAM.search(body))))
            return
        if not _STREAM.search(body):
            self.transport.write(sc.buffered)
            return
        Stats.started += 1
        if sc.delay <= 0:
            self.transport.write(sc.stream_bulk)
            Stats.completed += 1
            return
        self.busy = True
        self.task = asyncio.ensure_future(self._paced(sc))

    async def _paced(self, sc: Scenario) -> None:
        transport = self.transport
        assert transport is not None
        Stats.open += 1
        try:
            transport.write(sc.stream_head)
            events = sc.stream_events
            n = len(events) - 5  # role, n deltas, then finish, usage, [DONE], end together
            loop = asyncio.get_running_loop()
            t = loop.time()
            for i, event in enumerate(events):
                if transport.is_closing():
                    raise asyncio.CancelledError
                transport.write(event)
                if 0 < i < n:
                    t += sc.delay
                    await asyncio.sleep(max(0.0, t - loop.time()))
            Stats.completed += 1
        except asyncio.CancelledError:
            Stats.aborted += 1
        finally:
            Stats.open -= 1
            self.busy = False
            self.task = None
        if self.buf and not transport.is_closing():
            self.data_received(b"")

    async def _slotted(self, sc: Scenario, stream: bool) -> None:
        """One completion served within a slot (``--slots``)."""
        transport = self.transport
        assert transport is not None and Slots.sem is not None
        n = len(sc.stream_events) - 5  # the deltas (role, finish, usage, [DONE], end aside)
        loop = asyncio.get_running_loop()
        try:
            async with Slots.sem:
                Slots.busy += 1
                try:
                    await asyncio.sleep(Slots.prefill)
                    if not stream:
                        await asyncio.sleep(n * sc.delay)
                        if not transport.is_closing():
                            transport.write(sc.buffered)
                    else:
                        transport.write(sc.stream_head)
                        t = loop.time()
                        for i, event in enumerate(sc.stream_events):
                            if transport.is_closing():
                                raise asyncio.CancelledError
                            transport.write(event)
                            if 0 < i <= n and sc.delay > 0:
                                t += sc.delay
                                await asyncio.sleep(max(0.0, t - loop.time()))
                finally:
                    Slots.busy -= 1
            Slots.served += 1
        except asyncio.CancelledError:
            Stats.aborted += 1
        finally:
            self.busy = False
            self.task = None
        if self.buf and not transport.is_closing():
            self.data_received(b"")


class Echo:
    """``--echo``: replies carry the request's ``X-Request-Id``."""

    on = False


class Slots:
    """``--slots``: the completions served at once (None: no limit)."""

    sem: asyncio.Semaphore | None = None
    size = 0
    prefill = 0.0
    busy = 0
    served = 0


def _slot_args(argv: list[str]) -> list[str]:
    """Takes ``--slots N`` and ``--prefill-ms P`` out of argv (the rest stays positional)."""
    rest, it = [], iter(argv)
    for arg in it:
        if arg == "--echo":
            Echo.on = True
        elif arg == "--slots":
            Slots.size = int(next(it))
        elif arg == "--prefill-ms":
            Slots.prefill = float(next(it)) / 1000.0
        else:
            rest.append(arg)
    return rest


async def serve(port: int, host: str = "127.0.0.1") -> None:
    if Slots.size:
        Slots.sem = asyncio.Semaphore(Slots.size)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Server, host, port, backlog=4096, reuse_address=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    argv = _slot_args(argv)
    port = int(argv[1]) if len(argv) > 1 else 8000
    try:
        asyncio.run(serve(port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
