"""Every failure the gateway can meet, and the one place it is rendered: raise these anywhere.

    tree.py          the exception tree, STATUS_TYPES (status -> error.type), echo()
    upstream_map.py  from_upstream(): the one map of an upstream's error, scrubbed once
    render.py        the error as bytes: Anthropic, OpenAI, and their stream events

Every name is importable from here (``errors.InvalidRequest``, ``errors.from_upstream``).
"""

from gateway.errors.render import (
    anthropic_body,
    openai_body,
    openai_sse_error,
    openai_status,
    responses_failure,
    responses_sse_error,
    sse_error_event,
)
from gateway.errors.tree import (
    MAX_RENDERED,
    STATUS_TYPES,
    AuthenticationFailed,
    BudgetSpent,
    GatewayError,
    InvalidRequest,
    NotFound,
    NotSupported,
    Overloaded,
    PermissionDenied,
    RateLimited,
    RequestTooLarge,
    StreamProcessingError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
    echo,
    error_type_for,
)
from gateway.errors.upstream_map import (
    MAX_UPSTREAM_BODY,
    from_inband,
    from_upstream,
    inband_error,
    inband_status,
    scrub,
)

__all__ = [
    "MAX_RENDERED",
    "MAX_UPSTREAM_BODY",
    "STATUS_TYPES",
    "AuthenticationFailed",
    "BudgetSpent",
    "GatewayError",
    "InvalidRequest",
    "NotFound",
    "NotSupported",
    "Overloaded",
    "PermissionDenied",
    "RateLimited",
    "RequestTooLarge",
    "StreamProcessingError",
    "UpstreamError",
    "UpstreamTimeout",
    "UpstreamUnavailable",
    "anthropic_body",
    "echo",
    "error_type_for",
    "from_inband",
    "from_upstream",
    "inband_error",
    "inband_status",
    "openai_body",
    "openai_sse_error",
    "openai_status",
    "responses_failure",
    "responses_sse_error",
    "scrub",
    "sse_error_event",
]
