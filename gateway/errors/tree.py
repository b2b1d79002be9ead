"""The exception tree: every failure the gateway can meet, with its status and a
client-safe message.

Tree::

    GatewayError                 status + message; error.type comes from STATUS_TYPES
     ├── InvalidRequest          400 invalid_request_error (names the field path)
     ├── AuthenticationFailed    401 authentication_error
     ├── PermissionDenied        403 permission_error (a model outside a client's list)
     ├── NotFound                404 not_found_error
     ├── RequestTooLarge         413 request_too_large
     ├── RateLimited             429 rate_limit_error, with retry-after and the limits' headers
     ├── BudgetSpent             429 billing_error, x-should-retry: false (a spent budget)
     ├── NotSupported            501 not_supported
     ├── Overloaded              529 overloaded_error, with retry-after
     └── UpstreamError           whatever the upstream said, mapped and scrubbed
          ├── UpstreamUnavailable  529: refused / reset before response headers
          ├── UpstreamTimeout      504: no headers, or no chunk, within the timeout
          └── StreamProcessingError 500: the upstream reply could not be understood

Raise them anywhere; :mod:`.render` turns them into bytes.

A message is made encodable when the error is made (a lone surrogate becomes the text
``\\ud800``) and capped at :data:`MAX_RENDERED` characters. Client input quoted in a
message goes through :func:`echo` (shortened, escaped).

Protocol facts relied on:

* Anthropic's ``error.type`` follows the HTTP status (:data:`STATUS_TYPES`). The SDKs and
  Claude Code retry 408, 409, 429 and every 5xx, and honour ``retry-after`` and
  ``x-should-retry``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
INTERNAL = "Internal server error"  # what a client reads of any server-side failure
MAX_RENDERED = 2000  # a message's longest rendering, whatever built it
_ECHO = 64  # characters of client input quoted in a message


def error_type_for(status: int) -> str:
    known = STATUS_TYPES.get(status)
    if known is not None:
        return known
    return "api_error" if status >= 500 else "invalid_request_error"


def echo(value: object, limit: int = _ECHO) -> str:
    """Client input as a message quotes it: at most ``limit`` characters, encodable."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = text[:limit] + "..."
    return renderable(text)


def renderable(text: str) -> str:
    """``text``, encodable as UTF-8 (a lone surrogate becomes ``\\udXXX``) and capped."""
    if len(text) > MAX_RENDERED:
        text = text[: MAX_RENDERED - 3] + "..."
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class GatewayError(Exception):
    """A failure with an HTTP status and a client-safe message."""

    status: int = 500
    default_message: str = INTERNAL
    should_retry: bool | None = None
    # ``error.details`` of the envelope: a machine-readable ``error_code`` that SDKs branch on
    details: Mapping[str, Any] | None = None
    # the status the upstream answered, when this error is its reply (from_upstream); None
    # for the gateway's own failures (a connect error, a timeout, a malformed reply)
    upstream_status: int | None = None
    # the capability an upstream refused (gateway.text.refusals.CAPABILITIES), when this error
    # is such a refusal; the Messages call may then retry with that content as text
    refused: str | None = None
    # headers the answer carries besides retry-after (a limited client's
    # anthropic-ratelimit-*, gateway/tenancy/limits.py); None: none
    extra_headers: Mapping[str, str] | None = None

    def __init__(
        self,
        message: str | None = None,
        *,
        status: int | None = None,
        error_type: str | None = None,
        retry_after: int | None = None,
        should_retry: bool | None = None,
    ) -> None:
        if status is not None:
            self.status = status
        self.message = renderable(message) if message is not None else self.default_message
        self.error_type = error_type or error_type_for(self.status)
        if retry_after is None and self.status in _RETRY_AFTER_STATUSES:
            retry_after = 1
        self.retry_after = retry_after
        if should_retry is not None:
            self.should_retry = should_retry
        super().__init__(self.message)

    @property
    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self.retry_after is not None:
            headers["retry-after"] = str(self.retry_after)
        if self.should_retry is not None:
            # Overrides the SDKs' status-based retry rule (a 5xx is retried otherwise).
            headers["x-should-retry"] = "true" if self.should_retry else "false"
        if self.extra_headers:
            headers.update(self.extra_headers)
        return headers

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.error_type}, {self.message!r})"


class InvalidRequest(GatewayError):
    status = 400

    def __init__(self, path: str, why: str, *, details: Mapping[str, Any] | None = None) -> None:
        self.path = path
        self.why = why
        if details is not None:
            self.details = details
        super().__init__(f"{path}: {why}" if path else why)


class AuthenticationFailed(GatewayError):
    status = 401
    default_message = "invalid x-api-key"


class PermissionDenied(GatewayError):
    status = 403
    default_message = "Permission denied"


class NotFound(GatewayError):
    status = 404
    default_message = "Not found"


class RequestTooLarge(GatewayError):
    status = 413
    default_message = "Request exceeds the maximum allowed number of bytes."


class RateLimited(GatewayError):
    """A client's limit refuses the request (gateway/tenancy/limits.py)."""

    status = 429
    default_message = "Rate limited"

    def __init__(self, message: str, *, retry_after: int, headers: Mapping[str, str]) -> None:
        super().__init__(message, retry_after=retry_after)
        self.extra_headers = headers


class BudgetSpent(GatewayError):
    """A client's daily token budget is spent (gateway/tenancy/limits.py): 429
    ``billing_error``, as the Claude Code gateway protocol answers a reached per-user cap,
    with ``x-should-retry: false`` so that no SDK retries into it."""

    status = 429
    default_message = "Budget spent"
    should_retry = False

    def __init__(self, message: str, *, retry_after: int, headers: Mapping[str, str]) -> None:
        super().__init__(message, retry_after=retry_after, error_type="billing_error")
        self.extra_headers = headers


class NotSupported(GatewayError):
    status = 501
    default_message = "Not supported by this upstream"
    should_retry = False


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
