"""The gateway with its write coalescing off: every write goes at once, as before it existed.

    python -m tests.benchmarks.uncoalesced [gateway arguments...]

Only for ``python -m tests.benchmarks.wakeups``, which measures what holding a busy loop's
writes to the end of its pass saves (gateway/ops/coalesce.py); nothing in the gateway knows
of it.
"""

from __future__ import annotations

import sys

from gateway.__main__ import main
from gateway.ops import coalesce


def _always_now(self: coalesce.Coalescer) -> bool:
    return True


if __name__ == "__main__":
    coalesce.Coalescer.now = _always_now  # type: ignore[method-assign]
    sys.exit(main())
