"""The process-wide decoding budget: bytes that requests expand into, held at once.

``server.max_decoding_bytes`` bounds what every request together holds while it is being
turned into something the gateway can use:

* a request body while it is received and decoded (:mod:`gateway.http.body`);
* the reasoning restored from thinking-block signatures while a Messages request is
  prepared, until its upstream payload is built (:mod:`gateway.messages.call`): a 42 KB
  signature can hold megabytes of a looping model's reasoning, and that expansion is
  the request's, not a free side effect of it.

Each request holds a :class:`Lease`; what it takes counts until the lease is released. A
lease that holds nothing may take any size (a lone body of any size gets through, as
before); otherwise a take that would pass the limit is refused, and the caller answers
529 ``overloaded_error`` with ``retry-after``, which every SDK retries.

Takes may come from a worker thread (signatures opened off the event loop), so the count
is under a lock; a lease released while its thread still runs takes nothing more.
"""

from __future__ import annotations

import threading
from types import TracebackType

__all__ = ["Budget", "Lease"]


class Budget:
    """Bytes held at once across the process, at most ``limit`` (but see :class:`Lease`)."""

    __slots__ = ("_lock", "held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def lease(self) -> Lease:
        return Lease(self)

    def _take(self, lease: Lease, size: int) -> bool:
        with self._lock:
            if lease.closed:
                return False
            if self.held > lease.held and self.held + size > self.limit:
                return False
            self.held += size
            lease.held += size
            return True

    def _release(self, lease: Lease) -> None:
        with self._lock:
            self.held -= lease.held
            lease.held = 0
            lease.closed = True


class Lease:
    """One request's share of a :class:`Budget`; a context manager that releases it."""

    __slots__ = ("_budget", "closed", "held")

    def __init__(self, budget: Budget) -> None:
        self._budget = budget
        self.held = 0
        self.closed = False

    def take(self, size: int) -> bool:
        """Count ``size`` more bytes; False (nothing counted) when they do not fit."""
        return self._budget._take(self, size)

    def release(self) -> None:
        self._budget._release(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
