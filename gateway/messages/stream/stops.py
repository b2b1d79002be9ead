"""Stop sequences matched by the gateway in streamed text.

For upstreams that cannot say which stop string ended a generation
(``tables.LOCAL_STOP_KINDS``) the gateway does not forward ``stop``; it scans the
text deltas itself. Text that may be the beginning of a stop sequence is held back
until the next delta settles it, so a sequence split across chunks is still
found and none of it reaches the client.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    __slots__ = ("_stops", "held")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self.held = ""  # text not sent yet: it may begin a stop sequence

    def scan(self, text: str) -> tuple[str, str | None]:
        """(text that can go out now, the stop sequence that matched or None)."""
        buf = self.held + text
        hit_at, hit = len(buf), None
        for stop in self._stops:
            at = buf.find(stop)
            if 0 <= at < hit_at:
                hit_at, hit = at, stop
        if hit is not None:
            self.held = ""
            return buf[:hit_at], hit
        keep = 0  # the longest tail of buf that begins some stop sequence
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buf)), keep, -1):
                if buf.endswith(stop[:k]):
                    keep = k
                    break
        self.held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], None

    def take_held(self) -> str:
        """The held text, when no stop sequence can follow any more (the block ends)."""
        held, self.held = self.held, ""
        return held
