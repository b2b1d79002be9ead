"""Counting the counter store's failures: ``llm_gateway_limits_store_errors_total{kind}`` and a
``limits_store_error`` log line at most once a second.

A dead Redis under load fails every request; one line per failure would flood the log, so the
first failure is logged at once and later ones are folded into the next line, written once a
second has passed, with how many there were since the last line (``count``). The line names
the failure's kind and a short reason (an errno name, a Redis error code), never the URL.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gateway.ops import log

_log = log.get("gateway.tenancy")
INTERVAL = 1.0


class StoreErrors:
    """``failed(exc)`` counts one failure; ``counter``: the metric (``.labels(kind).inc()``),
    ``policy``: ``[limits] on_store_error``, named in the log line."""

    __slots__ = ("_clock", "_counter", "_last", "_policy", "_since")

    def __init__(
        self, counter: Any, policy: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._counter = counter
        self._policy = policy
        self._clock = clock
        self._last = -INTERVAL
        self._since = 0  # failures not yet in a log line

    def failed(self, exc: BaseException) -> None:
        kind = getattr(exc, "kind", "connection")
        self._counter.labels(kind).inc()
        self._since += 1
        now = self._clock()
        if now - self._last < INTERVAL:
            return
        _log.warning(
            "limits_store_error",
            kind=kind,
            reason=getattr(exc, "reason", type(exc).__name__),
            count=self._since,
            on_store_error=self._policy,
        )
        self._last = now
        self._since = 0
