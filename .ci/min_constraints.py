"""Print pip constraints that pin every runtime dependency to the floor pyproject.toml declares.

``name>=X`` becomes ``name==X`` (its environment marker kept), so ``.ci/min-versions`` installs
exactly the oldest versions the project claims to support. A runtime dependency without a
``>=`` floor is an error: every floor is tested. The extras in ``RUNTIME_EXTRAS`` are runtime
dependencies too (what a deployment adds: the PostgreSQL driver), so their floors are pinned
alike.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

RUNTIME_EXTRAS = ("postgresql", "otel")
_FLOOR = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*>=\s*([^,;\s]+)")


def constraints(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    deps = list(project["dependencies"])
    for extra in RUNTIME_EXTRAS:
        deps += project["optional-dependencies"][extra]
    out = []
    for dep in deps:
        spec, _, marker = dep.partition(";")
        found = _FLOOR.match(spec)
        if found is None:
            raise SystemExit(f"{pyproject}: {dep!r} declares no '>=' floor")
        out.append(f"{found[1]}=={found[2]}" + (f"; {marker.strip()}" if marker else ""))
    return out


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("pyproject.toml")
    print("\n".join(constraints(path)))
