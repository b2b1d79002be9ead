"""Waiting for a condition with a deadline: the one way tests wait.

A fixed sleep before an assertion is a race on a busy machine (too short) and a waste on an
idle one (too long); these poll instead and fail with what never happened. The deadline is
a hang guard, not a claim about speed: keep it generous (seconds). A sleep that *is* the
scenario (a stub pacing its chunks, a client that reads slowly) is not a wait and stays.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T],
    what: str = "the condition",
    *,
    timeout: float = 10.0,
    every: float = 0.02,
) -> T:
    """Call ``condition()`` until it returns something truthy, and return that (so a search
    can be the condition); fail naming ``what`` once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        got = condition()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(every)


async def eventually(
    condition: Callable[[], T],
    what: str = "the condition",
    *,
    within: float = 5.0,
    every: float = 0.01,
) -> T:
    """:func:`wait_until` on the event loop: the loop runs between the checks (a handler that
    counts a stream after the client's last read, a close a few iterations later)."""
    deadline = time.monotonic() + within
    while True:
        got = condition()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(every)
