"""The weighted fair order in which requests waiting for a saturated model get its slots.

Start-time fair queueing (Goyal, Vin and Cheng, 1996) with one request as the unit of work:
a waiting request of client ``c`` (weight ``w``) is tagged, when it joins, with a start
``S = max(V, F_c)`` and a finish ``F_c = S + 1/w`` (``F_c``: the finish of ``c``'s
previous request still counted), and the next slot goes to the smallest start (ties: the
earlier arrival). ``V``, the virtual time, is the start of the request admitted last.

What follows from it:

- a client with nothing waiting joins at ``V``: ahead of every request of a client with
  thirty waiting (their starts are ``V``, ``V+1``, ... ``V+29``), behind at most the one
  request whose start is ``V`` too;
- two clients that both keep requests waiting get slots in the ratio of their weights
  (weight 2: starts 0, 0.5, 1, ...; weight 1: 0, 1, 2, ...);
- one client alone (or every client with the same weight and one request at a time) is
  served in arrival order: FIFO.

A request that leaves before its turn (its deadline passed, its client went) is marked and
skipped when it reaches the head (a heap cannot remove from its middle cheaply); the heap
is rebuilt from the live entries once the dead ones outnumber them, so it stays within
twice the live count. A client whose last waiting request leaves is forgotten: its next
request starts at ``V``, as a newcomer's would.

Costs: ``join`` and ``next`` O(log n) (one heap push or pop each, plus the skipped dead
entries, each popped once), ``leave`` O(1) amortised. At most ``cap`` requests wait; past
it ``join`` refuses (the caller answers 529 at once).

Pure: no I/O, no clock, no asyncio (gateway/http/admission.py wires it to futures).
"""

from __future__ import annotations

import heapq
import math
from typing import Generic, TypeVar

__all__ = ["DEFAULT_CAP", "FairQueue", "Waiter", "engine_priority"]

T = TypeVar("T")

DEFAULT_CAP = 10_000  # waiting requests per model, at most
_MIN_GARBAGE = 64  # dead heap entries tolerated before a rebuild, whatever the live count


class Waiter(Generic[T]):
    """One waiting request: its client, its start tag and what the caller attached."""

    __slots__ = ("client", "gone", "item", "seq", "start")

    def __init__(self, client: str, start: float, seq: int, item: T) -> None:
        self.client = client
        self.start = start
        self.seq = seq
        self.item = item
        self.gone = False  # left the queue (timed out, client gone, or admitted)

    def __lt__(self, other: Waiter[T]) -> bool:
        if self.start != other.start:
            return self.start < other.start
        return self.seq < other.seq

    def __repr__(self) -> str:
        return f"Waiter({self.client!r}, start={self.start:g}, seq={self.seq})"


class FairQueue(Generic[T]):
    """The requests waiting for one model's slots (see the module docstring)."""

    __slots__ = ("_finish", "_heap", "_live", "_seq", "_waiting", "cap", "vtime")

    def __init__(self, cap: int = DEFAULT_CAP) -> None:
        self.cap = cap
        self.vtime = 0.0  # V: the start tag of the request admitted last
        self._heap: list[Waiter[T]] = []
        self._seq = 0
        self._live = 0
        self._finish: dict[str, float] = {}  # client -> finish tag of its last request
        self._waiting: dict[str, int] = {}  # client -> its requests waiting now

    def __len__(self) -> int:
        return self._live

    def waiting(self, client: str) -> int:
        return self._waiting.get(client, 0)

    def join(self, client: str, weight: float, item: T) -> Waiter[T] | None:
        """Queue a request of ``client`` (``weight`` > 0); None: ``cap`` requests wait."""
        if self._live >= self.cap:
            return None
        start = max(self.vtime, self._finish.get(client, self.vtime))
        self._finish[client] = start + 1.0 / weight
        self._waiting[client] = self._waiting.get(client, 0) + 1
        self._seq += 1
        waiter = Waiter(client, start, self._seq, item)
        heapq.heappush(self._heap, waiter)
        self._live += 1
        return waiter

    def next(self) -> Waiter[T] | None:
        """Take the request whose turn it is (it leaves the queue); None: nobody waits."""
        heap = self._heap
        while heap:
            waiter = heapq.heappop(heap)
            if waiter.gone:
                continue
            waiter.gone = True
            self.vtime = waiter.start
            self._left(waiter.client, forget=False)
            return waiter
        return None

    def leave(self, waiter: Waiter[T]) -> None:
        """``waiter`` leaves before its turn (no-op if it already left or was taken)."""
        if waiter.gone:
            return
        waiter.gone = True
        self._left(waiter.client, forget=True)
        garbage = len(self._heap) - self._live
        if garbage > _MIN_GARBAGE and garbage > self._live:
            self._heap = [w for w in self._heap if not w.gone]
            heapq.heapify(self._heap)

    def _left(self, client: str, *, forget: bool) -> None:
        self._live -= 1
        left = self._waiting[client] - 1
        if left:
            self._waiting[client] = left
            return
        del self._waiting[client]
        # Nothing of the client waits any more. Taken: its finish tag stays (at most 1/w
        # past V, its fair share of the slot it just got) unless V is already past it.
        # Gone: it is forgotten, so a client whose requests timed out is not held back.
        if forget or self._finish.get(client, 0.0) <= self.vtime:
            self._finish.pop(client, None)


# The engine's priority of a client's requests (upstreams.NAME.send_priority): a higher
# weight -> an earlier turn in the engine's own queue. 10 per doubling of the weight,
# weight 1 -> 0 (the engines' default, so requests of default-weight clients are unchanged).
_PRIORITY_STEP = 10


def engine_priority(weight: float, kind: str) -> int:
    """The ``priority`` field for an engine that schedules by it, from a client's weight.

    vLLM (``--scheduling-policy priority``) runs lower values first: ``-10·log2(weight)``
    (weight 2 -> -10, 0.5 -> 10, 1000 -> -100). SGLang (``--enable-priority-scheduling``)
    runs higher values first unless started with ``--schedule-low-priority-values-first``:
    ``+10·log2(weight)``.
    """
    level = round(_PRIORITY_STEP * math.log2(weight))
    return level if kind == "sglang" else -level
