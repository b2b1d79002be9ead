"""The one upstream call: every caller (Messages, count_tokens, the OpenAI pass-through, the
batch scheduler) reaches an upstream through :func:`send`, so each call is counted once, the
same way, whoever made it.

Outcome, in ``llm_gateway_upstream_requests_total{model,upstream,code}`` (grafana/METRICS.md):
the upstream's HTTP status when it answered (``200``, ``503``, a redirect's ``302``, ...),
``connect_error`` when no connection could be made or it was lost before the reply's head,
``timeout`` when the connection, a pool slot or the head did not come in time, and
``bad_response`` for a head the gateway could not read (malformed, too large): never a
status the upstream did not send. A reply's head is also timed, per model and upstream, in
``llm_gateway_upstream_response_headers_seconds``.

A failure is raised as a :class:`~gateway.errors.GatewayError`; one that is the upstream's own
error reply carries its status in ``upstream_status``, mapped and scrubbed once by the client
(:func:`gateway.errors.from_upstream`, with the app's redactor of every secret the process
knows: one upstream's error may quote another's key behind a shared proxy).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gateway import errors
from gateway.ops.config import ModelRoute
from gateway.ops.metrics import Metrics
from gateway.text.redact import Redactor
from gateway.upstream.client import UpstreamClient, UpstreamResponse

__all__ = ["Upstreams", "send"]


@dataclass(frozen=True, slots=True)
class Upstreams:
    """What an upstream call needs, passed in: the clients by upstream name, the metrics, and
    the redactor of every secret the process knows (gateway/upstream/known.py), for the
    in-band errors the callers map."""

    clients: dict[str, UpstreamClient]
    metrics: Metrics
    secrets: Redactor

    def client(self, route: ModelRoute) -> UpstreamClient:
        return self.clients[route.upstream.name]


def _outcome_code(err: errors.GatewayError) -> str:
    """The ``code`` label of a failed call (see the module docstring)."""
    if isinstance(err, errors.UpstreamTimeout):
        return "timeout"
    if isinstance(err, errors.UpstreamUnavailable):
        return "connect_error"
    if err.upstream_status is not None:
        return str(err.upstream_status)
    return "bad_response"  # a head the gateway could not read: no status to name


async def send(
    ups: Upstreams,
    route: ModelRoute,
    path: str,
    payload: bytes,
    *,
    stream: bool,
    max_tokens: int | None = None,
    at_root: bool = False,
    request_id: str | None = None,
    session: str | None = None,
) -> UpstreamResponse:
    """Send ``payload`` to ``route``'s upstream and wait for a 2xx reply's head, counted.

    ``session`` (opaque, made by the caller) keeps one session's requests on one replica of
    the upstream (gateway/upstream/replicas.py); a failure before the head is retried on
    another replica inside the client, so every caller gets it."""
    client = ups.client(route)
    metrics = ups.metrics
    t = time.perf_counter()
    try:
        up = await client.request(
            path,
            payload,
            stream=stream,
            max_tokens=max_tokens,
            at_root=at_root,
            request_id=request_id,
            session=session,
            model=route.upstream_model,
        )
    except errors.GatewayError as err:
        metrics.upstream_requests.labels(route.name, client.name, _outcome_code(err)).inc()
        raise
    metrics.upstream_requests.labels(route.name, client.name, str(up.status)).inc()
    metrics.upstream_headers.labels(route.name, client.name).observe(time.perf_counter() - t)
    return up
