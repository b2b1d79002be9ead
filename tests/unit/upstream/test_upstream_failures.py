"""gateway/upstream/failures.py: what a client reads when no connection could be made."""

from __future__ import annotations

import pytest

from gateway import errors
from gateway.upstream.exceptions import ConnectFailed
from gateway.upstream.failures import map_failure

# (ConnectFailed cause, status, message): never the address; a timeout stays a timeout
CASES = [
    ("refused", 529, "Upstream unreachable: connection refused"),
    ("reset", 529, "Upstream unreachable: connection reset"),
    ("tls", 529, "Upstream unreachable: TLS handshake failed"),
    ("dns", 529, "Upstream unreachable: host name not resolved"),
    ("connect", 529, "Upstream unreachable: could not connect"),
    ("timeout", 504, "Upstream request timed out"),
]


@pytest.mark.parametrize(("cause", "status", "message"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("stream", [False, True])
def test_a_failed_connect_names_its_cause(
    cause: str, status: int, message: str, stream: bool
) -> None:
    mapped = map_failure(
        ConnectFailed("connect to 10.0.0.7:8000 failed", cause=cause), "connect", stream
    )
    assert mapped is not None
    err, phase, logged = mapped
    assert (err.status, err.message, phase, logged) == (status, message, "connect", cause)
    assert err.error_type == ("overloaded_error" if status == 529 else "timeout_error")
    if status == 529:  # retried by the SDKs, as an overload is
        assert isinstance(err, errors.UpstreamUnavailable)
        assert err.headers == {"retry-after": "1"}
