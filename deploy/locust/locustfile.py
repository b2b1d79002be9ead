"""Load test for operators: the gateway's Anthropic and OpenAI routes, streamed and buffered.

    locust -f deploy/locust/locustfile.py --host http://127.0.0.1:8080
    locust -f deploy/locust/locustfile.py --host http://127.0.0.1:8080 --tags stream

Tasks (locust row name, what it sends, tags); ``--tags`` / ``--exclude-tags`` pick among them,
all run by default:

    messages stream    POST /v1/messages, "stream": true                 stream, messages
    messages buffered  POST /v1/messages                                 buffered, messages
    chat stream        POST /v1/chat/completions, "stream": true         stream, chat
    chat buffered      POST /v1/chat/completions                         buffered, chat
    count_tokens       POST /v1/messages/count_tokens                    count_tokens, messages

One locust request per HTTP request, so a stream is one request however many events it
carries, and the failure ratio locust reports is the share of requests that failed: the
same ratio as the gateway's ``llm_gateway_requests_total`` by code and, for streams,
``llm_gateway_stream_terminations_total{reason!="completed"}`` over all terminations.

A request fails on a status other than 200; a stream also fails when it carries an error
event (Anthropic ``event: error``, OpenAI a ``data:`` chunk holding ``error``), or ends
without its terminal event (``message_stop``; ``data: [DONE]``). Failures are grouped by
status or error type, never by message text.

Response time: a buffered request's until its body is read; a stream's until its terminal
event (or its failure), or with ``LOCUST_RESPONSE_TIME=ttft`` until its first content delta.
Each stream's request event also carries ``ttft_ms`` and ``output_tokens`` in its context,
for event listeners.

Environment (all optional):

    GATEWAY_PREFIX        route prefix of the gateway (default /llm; "" for none)
    LOCUST_API_KEY        sent as x-api-key (Anthropic) and Authorization: Bearer (OpenAI)
    LOCUST_MODEL          model of the Anthropic tasks (default "demo", as `llm-gateway --demo`)
    LOCUST_OPENAI_MODEL   model of the OpenAI tasks (default: LOCUST_MODEL)
    LOCUST_MAX_TOKENS     max_tokens per request (default 256)
    LOCUST_PROMPT         the user message
    LOCUST_RESPONSE_TIME  "total" (default) or "ttft": what a stream's response time is

Streams are read with requests' ``iter_lines`` (HttpUser): it yields each line as its chunk
arrives, where FastHttpUser's public ``iter_content`` waits for a whole read size first.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import requests
from locust import HttpUser, between, tag, task

PREFIX = os.environ.get("GATEWAY_PREFIX", "/llm").rstrip("/")
API_KEY = os.environ.get("LOCUST_API_KEY", "")
MODEL = os.environ.get("LOCUST_MODEL", "demo")
OPENAI_MODEL = os.environ.get("LOCUST_OPENAI_MODEL", MODEL)
MAX_TOKENS = int(os.environ.get("LOCUST_MAX_TOKENS", "256"))
PROMPT = os.environ.get("LOCUST_PROMPT", "Write a short paragraph about load testing.")
RESPONSE_TIME = os.environ.get("LOCUST_RESPONSE_TIME", "total")
if RESPONSE_TIME not in ("total", "ttft"):
    raise ValueError(f"LOCUST_RESPONSE_TIME: 'total' or 'ttft', got {RESPONSE_TIME!r}")


class _Stream:
    """One stream's outcome and timings, read from its SSE lines."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first = 0.0
        self.bytes = 0
        self.output_tokens = 0
        self.terminal = False
        self.failure = ""  # why the stream failed, if it did (the first reason seen)

    def fail(self, why: str) -> None:
        self.failure = self.failure or why

    def delta(self) -> None:
        if not self.first:
            self.first = time.perf_counter()

    def report(self, resp: Any, terminal_name: str) -> None:
        """Set the request's figures and outcome; locust fires it when the block exits."""
        end = time.perf_counter()
        ttft = (self.first - self.start) * 1000 if self.first else None
        meta = resp.request_meta
        meta["response_time"] = ttft if RESPONSE_TIME == "ttft" and ttft is not None \
            else (end - self.start) * 1000
        meta["response_length"] = self.bytes
        meta["context"] = {**(meta.get("context") or {}), "ttft_ms": ttft,
                           "output_tokens": self.output_tokens}
        if self.failure:
            resp.failure(self.failure)
        elif not self.terminal:
            resp.failure(f"stream ended without {terminal_name}")
        else:
            resp.success()


def _error_type(payload: Any) -> str:
    """The ``type`` of an error body or event (Anthropic or OpenAI shape), bounded."""
    err = payload.get("error") if isinstance(payload, dict) else None
    kind = err.get("type") if isinstance(err, dict) else None
    return str(kind)[:64] if kind else "error"


def _lines(resp: Any, stream: _Stream) -> Iterator[bytes]:
    """The body's lines as they arrive, counting their bytes."""
    for line in resp.iter_lines():
        stream.bytes += len(line) + 1
        yield line


class GatewayUser(HttpUser):
    wait_time = between(0.0, 0.1)

    def _post(self, path: str, name: str, body: dict[str, Any], api: str,
              read: Callable[[Any, _Stream], None] | None = None) -> None:
        headers = {"Content-Type": "application/json"}
        if api == "anthropic":
            headers["anthropic-version"] = "2023-06-01"
            if API_KEY:
                headers["x-api-key"] = API_KEY
        elif API_KEY:
            headers["Authorization"] = f"Bearer {API_KEY}"
        stream = _Stream()
        with self.client.post(f"{PREFIX}{path}", data=json.dumps(body), headers=headers,
                              name=name, stream=read is not None,
                              catch_response=True) as resp:
            if resp.status_code != 200:
                try:
                    kind = _error_type(resp.json())
                except (ValueError, requests.RequestException):
                    kind = "not json"
                resp.failure(f"HTTP {resp.status_code} {kind}")
                return
            if read is None:
                resp.success()
                return
            try:
                read(resp, stream)
            except ValueError:  # JSONDecodeError: counted, not raised out of the task
                stream.fail("malformed event")
            except (requests.RequestException, OSError) as exc:
                stream.fail(f"read failed: {type(exc).__name__}")
            stream.report(resp, "message_stop" if api == "anthropic" else "data: [DONE]")

    def _messages(self, stream: bool) -> dict[str, Any]:
        return {"model": MODEL, "max_tokens": MAX_TOKENS, "stream": stream,
                "messages": [{"role": "user", "content": PROMPT}]}

    def _chat(self, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": OPENAI_MODEL, "max_tokens": MAX_TOKENS,
                                "stream": stream,
                                "messages": [{"role": "user", "content": PROMPT}]}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    @tag("stream", "messages")
    @task(4)
    def messages_stream(self) -> None:
        self._post("/v1/messages", "messages stream", self._messages(True), "anthropic",
                   _read_messages)

    @tag("buffered", "messages")
    @task(1)
    def messages_buffered(self) -> None:
        self._post("/v1/messages", "messages buffered", self._messages(False), "anthropic")

    @tag("stream", "chat")
    @task(4)
    def chat_stream(self) -> None:
        self._post("/v1/chat/completions", "chat stream", self._chat(True), "openai",
                   _read_chat)

    @tag("buffered", "chat")
    @task(1)
    def chat_buffered(self) -> None:
        self._post("/v1/chat/completions", "chat buffered", self._chat(False), "openai")

    @tag("count_tokens", "messages")
    @task(1)
    def count_tokens(self) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]}
        self._post("/v1/messages/count_tokens", "count_tokens", body, "anthropic")


def _read_messages(resp: Any, stream: _Stream) -> None:
    """Anthropic SSE: ``event: NAME`` then ``data: JSON`` lines."""
    event = b""
    for line in _lines(resp, stream):
        if line.startswith(b"event:"):
            event = line[6:].strip()
        elif not line.startswith(b"data:"):
            continue
        elif event == b"content_block_delta":
            stream.delta()
        elif event == b"message_delta":
            usage = json.loads(line[5:]).get("usage") or {}
            stream.output_tokens = usage.get("output_tokens") or 0
        elif event == b"message_stop":
            stream.terminal = True
        elif event == b"error":
            stream.fail(f"error event: {_error_type(json.loads(line[5:]))}")


def _read_chat(resp: Any, stream: _Stream) -> None:
    """OpenAI chunks: ``data: JSON`` lines, then ``data: [DONE]``."""
    for line in _lines(resp, stream):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            stream.terminal = True
            continue
        chunk = json.loads(data)
        if chunk.get("error") is not None:
            stream.fail(f"error event: {_error_type(chunk)}")
            continue
        if usage := chunk.get("usage"):
            stream.output_tokens = usage.get("completion_tokens") or 0
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content") \
                    or delta.get("reasoning") or delta.get("tool_calls"):
                stream.delta()
