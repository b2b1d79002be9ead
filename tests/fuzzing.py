"""How many hypothesis examples each fuzz property runs: thousands in CI, a quick pass locally.

Override with FUZZ_EXAMPLES=N.
"""

from __future__ import annotations

import os

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES") or (2000 if os.environ.get("CI") else 200))
