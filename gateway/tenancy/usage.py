"""Usage per client and model, added up in memory by the minute until it is written.

A reply's usage (``Figures.on_end``, the pass-through's reply) is added to one row keyed
(minute, client, model): a dict lookup and five integer additions, nothing else on the
request's path. Every few seconds the HTTP shell takes the rows (:meth:`UsageAggregate.take`)
and writes them in one transaction off the event loop, as additions to the database's
rows (so processes and replicas sharing one database add up). A write that fails gives its
rows back (:meth:`UsageAggregate.give_back`) to be written with the next.

Bounded: the keys are (minute, client, model), clients and models come from the config; a
database down for long would still grow one key per client and model a minute, so past
``max_keys`` a new key's usage is dropped and counted (``dropped``) instead of kept.

Counts, in the Admin API's terms (``GET /v1/organizations/usage_report/messages``):
``uncached_input_tokens`` is a Message's ``usage.input_tokens`` (which never includes
cache reads), ``cache_read_input_tokens`` its cache reads, ``output_tokens``, and
``server_tool_use.web_search_requests``; ``requests`` counts the replies. No upstream says
what it wrote to its cache, so cache creation is always zero and not kept.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["COUNTS", "MAX_KEYS", "Row", "UsageAggregate"]

# the order of a row's counts, here and in the usage table
COUNTS = (
    "requests",
    "uncached_input_tokens",
    "cache_read_input_tokens",
    "output_tokens",
    "web_search_requests",
)
# (minute start in epoch seconds, client name, model alias) -> counts in COUNTS' order
Row = tuple[int, str, str, tuple[int, int, int, int, int]]
MAX_KEYS = 50_000  # about 10 MB of rows: 8 hours of 10 clients x 10 models unwritten


class UsageAggregate:
    """Rows of usage not yet written (see the module docstring)."""

    __slots__ = ("_rows", "dropped", "max_keys")

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self._rows: dict[tuple[int, str, str], list[int]] = {}
        self.max_keys = max_keys
        self.dropped = 0  # replies whose usage had no room (counted, logged by the writer)

    def __len__(self) -> int:
        return len(self._rows)

    def add(
        self,
        now: float,
        client: str,
        model: str,
        uncached: int,
        cache_read: int,
        output: int,
        web_searches: int,
    ) -> None:
        """One reply's usage, at ``now`` (epoch seconds)."""
        key = (int(now // 60) * 60, client, model)
        row = self._rows.get(key)
        if row is None:
            if len(self._rows) >= self.max_keys:
                self.dropped += 1
                return
            self._rows[key] = [1, uncached, cache_read, output, web_searches]
            return
        row[0] += 1
        row[1] += uncached
        row[2] += cache_read
        row[3] += output
        row[4] += web_searches

    def take(self) -> list[Row]:
        """Every row, oldest minute first; the aggregate starts empty again."""
        rows, self._rows = self._rows, {}
        return [(k[0], k[1], k[2], (v[0], v[1], v[2], v[3], v[4])) for k, v in sorted(rows.items())]

    def give_back(self, rows: Iterable[Row]) -> None:
        """Rows a write did not store, added back (within ``max_keys``: the rest dropped,
        their requests counted in ``dropped``)."""
        for minute, client, model, counts in rows:
            key = (minute, client, model)
            row = self._rows.get(key)
            if row is None:
                if len(self._rows) >= self.max_keys:
                    self.dropped += counts[0]
                    continue
                self._rows[key] = list(counts)
            else:
                for i, n in enumerate(counts):
                    row[i] += n
