"""Every failure the gateway can meet, and the one place it is rendered.

Exception tree::

    GatewayError                 status + message; error.type comes from STATUS_TYPES
     ├── InvalidRequest          400 invalid_request_error (names the field path)
     ├── AuthenticationFailed    401 authentication_error
     ├── NotFound                404 not_found_error
     ├── RequestTooLarge         413 request_too_large
     ├── NotSupported            501 not_supported
     ├── Overloaded              529 overloaded_error, with retry-after
     └── UpstreamError           whatever the upstream said, mapped and scrubbed
          ├── UpstreamUnavailable  529: refused / reset before response headers
          ├── UpstreamTimeout      504: no headers, or no chunk, within the timeout
          └── StreamProcessingError 500: the upstream stream could not be understood

Raise them anywhere; :func:`render_anthropic`, :func:`render_openai` and
:func:`sse_error_event` turn them into bytes. Nothing else builds error bodies.
Upstream text reaches a client only through :func:`scrub`: a 5xx message is
replaced whole, a 4xx message loses traceback lines, file paths and anything
naming an upstream host, and is capped at 500 characters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from gateway import jsonutil

# THE status -> error.type table (Anthropic's documented types).
STATUS_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    501: "not_supported",
    504: "timeout_error",
    529: "overloaded_error",
}
_RETRY_AFTER_STATUSES = frozenset({429, 529})
_INTERNAL = "Internal server error"
_MAX_MESSAGE = 500


def error_type_for(status: int) -> str:
    known = STATUS_TYPES.get(status)
    if known is not None:
        return known
    return "api_error" if status >= 500 else "invalid_request_error"


class GatewayError(Exception):
    """A failure with an HTTP status and a client-safe message."""

    status: int = 500
    default_message: str = _INTERNAL

    def __init__(
        self,
        message: str | None = None,
        *,
        status: int | None = None,
        error_type: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        if status is not None:
            self.status = status
        self.message = message if message is not None else self.default_message
        self.error_type = error_type or error_type_for(self.status)
        if retry_after is None and self.status in _RETRY_AFTER_STATUSES:
            retry_after = 1
        self.retry_after = retry_after
        super().__init__(self.message)

    @property
    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self.retry_after is not None:
            headers["retry-after"] = str(self.retry_after)
        return headers

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.error_type}, {self.message!r})"


class InvalidRequest(GatewayError):
    status = 400

    def __init__(self, path: str, why: str) -> None:
        self.path = path
        super().__init__(f"{path}: {why}" if path else why)


class AuthenticationFailed(GatewayError):
    status = 401
    default_message = "invalid x-api-key"


class NotFound(GatewayError):
    status = 404
    default_message = "Not found"


class RequestTooLarge(GatewayError):
    status = 413
    default_message = "Request exceeds the maximum allowed number of bytes."


class NotSupported(GatewayError):
    status = 501
    default_message = "Not supported by this upstream"


class Overloaded(GatewayError):
    status = 529
    default_message = "Overloaded"


class UpstreamError(GatewayError):
    """A failure that came from (or on the way to) the upstream."""


class UpstreamUnavailable(UpstreamError):
    status = 529
    default_message = "Overloaded"


class UpstreamTimeout(UpstreamError):
    status = 504
    default_message = "Upstream request timed out"


class StreamProcessingError(UpstreamError):
    status = 500
    default_message = "Stream processing error"


# --- scrubbing ---------------------------------------------------------------------

_TRACE_LINE = re.compile(r"Traceback|^\s*File \"|^\s+at \S+ \(", re.MULTILINE)
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"'<>]+")
_PATH = re.compile(r"(?<![\w.])/(?:[\w.@+-]+/)+[\w.@+-]+")
_IP_PORT = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b|\[[0-9a-fA-F:]+\](?::\d+)?")


def scrub(status: int, message: str, hosts: Iterable[str] = ()) -> str:
    """Make upstream text safe for a client. One function for every path."""
    if status >= 500:
        return _INTERNAL
    lines = [ln for ln in message.splitlines() if not _TRACE_LINE.search(ln)]
    text = "\n".join(lines).strip()
    text = _URL.sub("[redacted]", text)
    for host in hosts:
        if host:
            text = text.replace(host, "[redacted]")
    text = _IP_PORT.sub("[redacted]", text)
    text = _PATH.sub("[redacted]", text)
    if len(text) > _MAX_MESSAGE:
        text = text[: _MAX_MESSAGE - 3] + "..."
    return text or error_type_for(status)


# --- upstream error bodies -----------------------------------------------------------

# vLLM: "This model's maximum context length is 4096 tokens. However, you requested 5000
#        tokens (4000 in the messages, 1000 in the completion)."
_VLLM_CTX = re.compile(
    r"maximum context length is (\d+) tokens.*?requested (\d+) tokens \((\d+) in the messages,"
    r" (\d+) in the completion\)",
    re.S,
)
# vLLM (newer): "... maximum context length is 4096 tokens. However, your request has 5000
#        input tokens." and "... and your request has 3500 input tokens (1000 > 4096 - 3500)"
_VLLM_CTX_INPUT = re.compile(
    r"maximum context length is (\d+) tokens.*?request has (\d+) input tokens"
    r"(?: \((\d+) > \d+ - \d+\))?",
    re.S,
)
# SGLang: "The input (5000 tokens) is longer than the model's context length (4096 tokens)."
_SGLANG_INPUT = re.compile(r"input \((\d+) tokens\) is longer than the model's context length \((\d+)")
# SGLang: "...maximum context length of 4096 tokens. You requested a total of 5000 tokens:
#          4000 tokens from the input messages and 1000 tokens for the completion."
_SGLANG_TOTAL = re.compile(
    r"maximum context length of (\d+) tokens.*?(\d+) tokens from the input messages and (\d+)"
    r" tokens for the completion",
    re.S,
)


def context_overflow_message(
    body: Mapping[str, Any] | None, text: str, max_tokens: int | None
) -> str | None:
    """Claude Code's two wordings for a context overflow, or None if this is not one.

    ``prompt is too long: P tokens > M maximum`` when the prompt alone does not fit,
    ``input length and `max_tokens` exceed context limit: P + C > M`` otherwise.
    """
    prompt = ctx = completion = None
    if m := _VLLM_CTX.search(text):
        ctx, prompt, completion = int(m[1]), int(m[3]), int(m[4])
    elif m := _VLLM_CTX_INPUT.search(text):
        ctx, prompt = int(m[1]), int(m[2])
        completion = int(m[3]) if m[3] else max_tokens
    elif m := _SGLANG_TOTAL.search(text):
        ctx, prompt, completion = int(m[1]), int(m[2]), int(m[3])
    elif m := _SGLANG_INPUT.search(text):
        prompt, ctx = int(m[1]), int(m[2])
    elif body is not None:
        # llama.cpp: {"error":{"type":"exceed_context_size_error","n_prompt_tokens":P,"n_ctx":M}}
        err = body.get("error") if isinstance(body.get("error"), Mapping) else body
        if isinstance(err, Mapping) and err.get("type") == "exceed_context_size_error":
            p, c = err.get("n_prompt_tokens"), err.get("n_ctx")
            if isinstance(p, int) and isinstance(c, int):
                prompt, ctx = p, c
                completion = max_tokens
    if prompt is None or ctx is None:
        return None
    if prompt >= ctx or completion is None:
        return f"prompt is too long: {prompt} tokens > {ctx} maximum"
    return (
        "input length and `max_tokens` exceed context limit: "
        f"{prompt} + {completion} > {ctx}, decrease input length or `max_tokens` and try again"
    )


def _message_of(body: Any) -> tuple[str, str | None]:
    """(message, anthropic error.type or None) from any upstream error body."""
    if isinstance(body, Mapping):
        err = body.get("error")
        if isinstance(err, Mapping):
            msg = err.get("message")
            etype = err.get("type") if body.get("type") == "error" else None
            return (msg if isinstance(msg, str) else ""), (
                etype if isinstance(etype, str) else None
            )
        if isinstance(err, str):
            return err, None
        for key in ("message", "detail"):
            if isinstance(body.get(key), str):
                return body[key], None
    return "", None


def from_upstream(
    status: int,
    raw: bytes,
    *,
    hosts: Iterable[str] = (),
    max_tokens: int | None = None,
) -> UpstreamError:
    """Map an upstream error reply (status + body) to the error the client sees."""
    try:
        body = jsonutil.loads(raw) if raw else None
    except ValueError:
        body = None
    if body is not None:
        text, anthropic_type = _message_of(body)
    else:
        text, anthropic_type = raw[:4096].decode("utf-8", "replace"), None
    if status in (400, 413, 422) or (status >= 500 and "context" in text):
        overflow = context_overflow_message(body if isinstance(body, Mapping) else None,
                                            text, max_tokens)
        if overflow is not None:
            return UpstreamError(overflow, status=400)
    if status in (503, 529):
        return UpstreamError("Overloaded", status=529)
    if status == 429:
        return UpstreamError(scrub(429, text, hosts) or "Rate limited", status=429)
    if status in (401, 403, 404):
        # The gateway's own credentials or upstream_model are wrong: not the client's to fix.
        return UpstreamError(status=500)
    if status >= 500:
        return UpstreamError(status=504 if status == 504 else 500)
    if status not in STATUS_TYPES:
        status = 400
    return UpstreamError(scrub(status, text, hosts), status=status,
                         error_type=anthropic_type if anthropic_type else None)


def from_inband(payload: Any, *, hosts: Iterable[str] = ()) -> UpstreamError:
    """An error object inside an upstream SSE stream; no code counts as 5xx."""
    err = payload.get("error") if isinstance(payload, Mapping) else None
    code = None
    if isinstance(err, Mapping):
        for key in ("code", "status", "status_code"):
            value = err.get(key)
            if isinstance(value, int) and 400 <= value <= 599:
                code = value
                break
            if isinstance(value, str) and value.isdigit() and 400 <= int(value) <= 599:
                code = int(value)
                break
    status = code or 500
    return from_upstream(status, jsonutil.dumpb(payload), hosts=hosts)


# --- rendering ---------------------------------------------------------------------


def anthropic_body(err: GatewayError, request_id: str | None = None) -> bytes:
    body: dict[str, Any] = {
        "type": "error",
        "error": {"type": err.error_type, "message": err.message},
    }
    if request_id:
        body["request_id"] = request_id
    return jsonutil.dumpb(body)


_OPENAI_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_exceeded",
}


def openai_status(err: GatewayError) -> int:
    """OpenAI clients know 503 for overload, not Anthropic's 529."""
    return 503 if err.status == 529 else err.status


def openai_body(err: GatewayError) -> bytes:
    status = openai_status(err)
    etype = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return jsonutil.dumpb(
        {"error": {"message": err.message, "type": etype, "param": None, "code": status}}
    )


def sse_error_event(err: GatewayError) -> bytes:
    return b"event: error\ndata: " + anthropic_body(err) + b"\n\n"
