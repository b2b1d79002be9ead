"""Tries per client address per minute on the verification page (RFC 8628 §5.1: the user
code is short, so guessing it must be slow).

A fixed one-minute window per address, in this process: ``limit`` tries in a window, the
next is refused until the window ends. At most ``max_addresses`` addresses are tracked; past
that the stalest windows are dropped (an address dropped starts a fresh window, which a
flood of addresses could use to reset one: behind a reverse proxy every developer shares its
address, and the limit is then the proxy's).
"""

from __future__ import annotations

from collections import OrderedDict

WINDOW = 60.0


class Throttle:
    __slots__ = ("_windows", "limit", "max_addresses")

    def __init__(self, limit: int, max_addresses: int = 10_000) -> None:
        self.limit = limit
        self.max_addresses = max_addresses
        self._windows: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def allow(self, address: str, now: float) -> float:
        """Count one try; -> 0 when allowed, else the seconds until the window ends."""
        start, n = self._windows.get(address, (now, 0))
        if now - start >= WINDOW:
            start, n = now, 0
        if n >= self.limit:
            return max(1.0, WINDOW - (now - start))
        self._windows[address] = (start, n + 1)
        self._windows.move_to_end(address)
        while len(self._windows) > self.max_addresses:
            self._windows.popitem(last=False)
        return 0.0
