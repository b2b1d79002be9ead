"""Load test for operators: Anthropic and OpenAI streaming through the gateway.

    locust -f deploy/locust/locustfile.py --host http://127.0.0.1:8080

Environment (all optional):

    GATEWAY_PREFIX       route prefix of the gateway (default /llm; "" for none)
    LOCUST_API_KEY       sent as x-api-key (Anthropic) and Authorization: Bearer (OpenAI)
    LOCUST_MODEL         model for the Anthropic task (default "reasoning")
    LOCUST_OPENAI_MODEL  model for the OpenAI task (default: LOCUST_MODEL)
    LOCUST_MAX_TOKENS    max_tokens per request (default 256)
    LOCUST_PROMPT        the user message
    LOCUST_TASKS         "anthropic,openai" (default both), e.g. "anthropic" for one only

Besides the request rows (time to response headers), every stream records custom
events, request type ``SSE``, whose "response time" column carries the figure:

    <api> ttft             ms from sending the request to the first content delta
    <api> chunk gap        ms between consecutive content deltas (one event per gap)
    <api> total            ms from sending the request to the stream's terminal event
    <api> output tokens/s  output tokens per second after the first token (response
                           length = the output token count)

A stream that ends without its terminal event (``message_stop`` for Anthropic,
``data: [DONE]`` for OpenAI), carries an ``error`` event, or answers a non-200 status
is a failure.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from locust import FastHttpUser, between, task

PREFIX = os.environ.get("GATEWAY_PREFIX", "/llm").rstrip("/")
API_KEY = os.environ.get("LOCUST_API_KEY", "")
MODEL = os.environ.get("LOCUST_MODEL", "reasoning")
OPENAI_MODEL = os.environ.get("LOCUST_OPENAI_MODEL", MODEL)
MAX_TOKENS = int(os.environ.get("LOCUST_MAX_TOKENS", "256"))
PROMPT = os.environ.get("LOCUST_PROMPT", "Write a short paragraph about load testing.")
TASKS = {t.strip() for t in os.environ.get("LOCUST_TASKS", "anthropic,openai").split(",")}


class _StreamStats:
    """Timings of one stream, reported as custom events when it ends."""

    def __init__(self, user: FastHttpUser, api: str) -> None:
        self.user = user
        self.api = api
        self.start = time.perf_counter()
        self.first = 0.0
        self.last = 0.0
        self.deltas = 0
        self.output_tokens = 0

    def delta(self) -> None:
        now = time.perf_counter()
        if not self.first:
            self.first = now
            self._fire("ttft", (now - self.start) * 1000)
        else:
            self._fire("chunk gap", (now - self.last) * 1000)
        self.last = now
        self.deltas += 1

    def finish(self) -> None:
        end = time.perf_counter()
        self._fire("total", (end - self.start) * 1000)
        tokens = self.output_tokens or self.deltas
        if self.first and end > self.first and tokens > 1:
            self._fire("output tokens/s", (tokens - 1) / (end - self.first), tokens)

    def _fire(self, what: str, value: float, length: int = 0) -> None:
        self.user.environment.events.request.fire(
            request_type="SSE", name=f"{self.api} {what}", response_time=value,
            response_length=length, exception=None, context={})


def _lines(resp: Any):  # type: ignore[no-untyped-def]
    """The body's lines as they arrive (SSE lines end with LF)."""
    raw = resp._response  # geventhttpclient's response: readline takes the separator
    while True:
        line = raw.readline(b"\n")
        if not line:
            return
        yield line.rstrip(b"\r\n")


class GatewayUser(FastHttpUser):
    wait_time = between(0.0, 0.1)

    def _headers(self, api: str) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if api == "anthropic":
            headers["anthropic-version"] = "2023-06-01"
            if API_KEY:
                headers["x-api-key"] = API_KEY
        elif API_KEY:
            headers["Authorization"] = f"Bearer {API_KEY}"
        return headers

    @task
    def anthropic_stream(self) -> None:
        if "anthropic" not in TASKS:
            return
        body = {"model": MODEL, "max_tokens": MAX_TOKENS, "stream": True,
                "messages": [{"role": "user", "content": PROMPT}]}
        stats = _StreamStats(self, "anthropic")
        with self.client.post(f"{PREFIX}/v1/messages", data=json.dumps(body),
                              headers=self._headers("anthropic"), stream=True,
                              catch_response=True, name="anthropic stream") as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}")
                return
            event = b""
            terminal = error = False
            for line in _lines(resp):
                if line.startswith(b"event:"):
                    event = line[6:].strip()
                elif line.startswith(b"data:"):
                    if event == b"content_block_delta":
                        stats.delta()
                    elif event == b"message_delta":
                        usage = json.loads(line[5:]).get("usage") or {}
                        stats.output_tokens = usage.get("output_tokens") or 0
                    elif event == b"message_stop":
                        terminal = True
                    elif event == b"error":
                        error = True
            if error:
                resp.failure("stream carried an error event")
            elif not terminal:
                resp.failure("stream ended without message_stop")
            else:
                stats.finish()
                resp.success()

    @task
    def openai_stream(self) -> None:
        if "openai" not in TASKS:
            return
        body = {"model": OPENAI_MODEL, "max_tokens": MAX_TOKENS, "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": PROMPT}]}
        stats = _StreamStats(self, "openai")
        with self.client.post(f"{PREFIX}/v1/chat/completions", data=json.dumps(body),
                              headers=self._headers("openai"), stream=True,
                              catch_response=True, name="openai stream") as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}")
                return
            terminal = error = False
            for line in _lines(resp):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    terminal = True
                    continue
                chunk = json.loads(data)
                if chunk.get("error") is not None:
                    error = True
                    continue
                usage = chunk.get("usage")
                if usage:
                    stats.output_tokens = usage.get("completion_tokens") or 0
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if delta.get("content") or delta.get("reasoning_content") \
                            or delta.get("reasoning") or delta.get("tool_calls"):
                        stats.delta()
            if error:
                resp.failure("stream carried an error chunk")
            elif not terminal:
                resp.failure("stream ended without data: [DONE]")
            else:
                stats.finish()
                resp.success()
