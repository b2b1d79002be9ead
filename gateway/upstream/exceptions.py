"""The upstream client's exceptions, each naming its ``cause`` for the failure log.

Tree::

    HTTPClientError
     ├── ConnectFailed      no connection: refused, reset, timeout, tls, dns, connect
     ├── PoolTimeout        no pool slot within the head timeout
     ├── Disconnected       closed or reset before any byte of the reply (retried once)
     └── BrokenResponse     a reply cut (cut, reset)
          ├── ProtocolError   a framing anomaly of a fixed kind
          └── TooLarge        a buffered reply past max_response_bytes

Only gateway/upstream/client.py turns them into the gateway's own errors.
"""

from __future__ import annotations


class HTTPClientError(Exception):
    """Base of the upstream client's errors; ``cause`` names the failure for logs."""

    cause = "protocol_error"

    def __init__(self, message: str = "", *, cause: str | None = None) -> None:
        super().__init__(message)
        if cause is not None:
            self.cause = cause


class ConnectFailed(HTTPClientError):
    """No connection: ``cause`` is refused, reset, timeout, tls, dns or connect."""


class PoolTimeout(HTTPClientError):
    """No pool slot came free within the head timeout."""

    cause = "pool_timeout"


class Disconnected(HTTPClientError):
    """The connection ended before any byte of the reply arrived (safe to retry once)."""

    cause = "closed"


class BrokenResponse(HTTPClientError):
    """The reply was malformed, or cut before its framing said it ended."""

    cause = "cut"


class ProtocolError(BrokenResponse):
    """A framing anomaly; ``kind`` is one of gateway/ops/metrics.py ``PROTOCOL_ERRORS``."""

    cause = "protocol_error"

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class TooLarge(BrokenResponse):
    """A buffered reply larger than the upstream's ``max_response_bytes``."""

    cause = "too_large"
