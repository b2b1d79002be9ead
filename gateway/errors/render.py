"""Rendering: the one place an error becomes bytes, in four dialects (Anthropic's envelope
and stream event, OpenAI's body and chat stream event, the Responses API's event and failed
Response). Nothing else builds error bodies.

Rendering cannot fail: a body that does not encode (a message changed after the error was
made, a ``details`` value) is rendered again with every string made encodable and without
``details``.

Protocol facts relied on:

* Anthropic's envelope is ``{"type":"error","error":{"type":T,"message":M}}`` with an
  optional top-level ``request_id`` and an optional ``error.details``
  (``{"error_code": ...}``, which the SDKs branch on).
* OpenAI clients know 503 for overload, not Anthropic's 529; their SDKs raise on a stream
  event with an ``error`` member.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.errors.tree import GatewayError, renderable
from gateway.text import jsonutil

__all__ = [
    "anthropic_body",
    "openai_body",
    "openai_sse_error",
    "openai_status",
    "responses_failure",
    "responses_sse_error",
    "sse_error_event",
]


def _encode(body: dict[str, Any]) -> bytes:
    """``body`` as JSON; if something in it does not encode (a message changed after the
    error was made, a ``details`` value), the same body with every string made
    encodable and ``details`` left out."""
    try:
        return jsonutil.dumpb(body)
    except (ValueError, OverflowError, TypeError):
        return jsonutil.dumpb(_fallback(body))


def _fallback(value: Any) -> Any:
    if isinstance(value, str):
        return renderable(value)
    if isinstance(value, dict):
        return {k: _fallback(v) for k, v in value.items() if k != "details"}
    if isinstance(value, (bool, int)):
        return value
    return None


def anthropic_body(err: GatewayError, request_id: str | None = None) -> bytes:
    body: dict[str, Any] = {
        "type": "error",
        "error": {"type": err.error_type, "message": err.message},
    }
    if err.details is not None:
        body["error"]["details"] = err.details
    if request_id:
        body["request_id"] = request_id
    return _encode(body)


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


def _openai_error(err: GatewayError) -> dict[str, Any]:
    status = openai_status(err)
    etype = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    if err.error_type == "billing_error":  # a spent budget: OpenAI's quota error
        etype = "insufficient_quota"
    return {"message": err.message, "type": etype, "param": None, "code": status}


def openai_body(err: GatewayError) -> bytes:
    return _encode({"error": _openai_error(err)})


def sse_error_event(err: GatewayError) -> bytes:
    return b"event: error\ndata: " + anthropic_body(err) + b"\n\n"


def openai_sse_error(err: GatewayError) -> bytes:
    """The in-band error of a chat or completions stream: one ``data:`` event holding the
    error body (the OpenAI SDKs raise on an event with an ``error`` member)."""
    return b"data: " + openai_body(err) + b"\n\n"


def responses_sse_error(err: GatewayError, sequence_number: int | None = None) -> bytes:
    """The in-band error of a Responses stream: an ``error`` event (``type``, ``code``,
    ``message``, ``param``, and the upstream event's ``sequence_number`` when it replaces
    one), with the ``error`` member the OpenAI SDKs raise on."""
    error = _openai_error(err)
    body: dict[str, Any] = {
        "type": "error",
        "code": error["type"],
        "message": err.message,
        "param": None,
        "error": error,
    }
    if sequence_number is not None:
        body["sequence_number"] = sequence_number
    return b"event: error\ndata: " + _encode(body) + b"\n\n"


def responses_failure(err: GatewayError) -> dict[str, Any]:
    """The ``error`` of a failed Response object (``code``, ``message``)."""
    return {"code": _openai_error(err)["type"], "message": err.message}
