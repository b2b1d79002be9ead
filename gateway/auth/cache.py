"""This process's view of the gateway's access tokens: digest -> (client, expiry), bounded.

A bearer check reads here first: an entry looked up in the database less than
``fresh_seconds`` ago answers without a round trip. A token revoked through this process is
dropped here at once (:meth:`TokenCache.forget_session`); one revoked through another
replica is seen here once its entry is older than ``fresh_seconds`` (the next check reads
the database again). The entries are bounded (``max_entries``, the oldest looked-up dropped
first), so unknown tokens cannot grow it: a token not in the database is not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenEntry:
    client: str
    session: str
    expires_at: float  # epoch seconds
    checked_at: float  # monotonic seconds of the database read


class TokenCache:
    __slots__ = ("_entries", "fresh_seconds", "max_entries")

    def __init__(self, fresh_seconds: float, max_entries: int = 10_000) -> None:
        self.fresh_seconds = fresh_seconds
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, TokenEntry] = OrderedDict()

    def get(self, digest: bytes, monotonic_now: float) -> TokenEntry | None:
        """The entry if it was read from the database within ``fresh_seconds``."""
        entry = self._entries.get(digest)
        if entry is None:
            return None
        if monotonic_now - entry.checked_at >= self.fresh_seconds:
            del self._entries[digest]
            return None
        return entry

    def put(self, digest: bytes, entry: TokenEntry) -> None:
        self._entries[digest] = entry
        self._entries.move_to_end(digest)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def forget_session(self, session: str) -> int:
        """Drop every token of one sign-in (revoked); -> how many were cached."""
        gone = [d for d, e in self._entries.items() if e.session == session]
        for d in gone:
            del self._entries[d]
        return len(gone)

    def __len__(self) -> int:
        return len(self._entries)
