"""The package's layers, checked on its import graph: data flows http -> messages/openai/batches
-> upstream, and no import runs upward (a module may import its own layer and those below).

Layers, lowest first: shared text utilities (``text``), the error tree (``errors``),
operations (``ops``), the upstream client (``upstream``), what local engines emit (``local``),
the surfaces (``messages``, ``openai``), the server tools the gateway runs (``tools``),
Message Batches (``batches``), the HTTP shell
(``http``), and the composition root (``app``, ``__main__``). The demo sits beside ops.
Imports inside a function or under ``TYPE_CHECKING`` count too: a lazy upward import is still
a seam.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"

LAYERS = {
    "gateway": 0,  # the package root: __version__ only
    "text": 0,
    "errors": 1,
    "ops": 2,
    "demo": 3,
    "upstream": 3,
    "local": 4,
    "messages": 5,
    "openai": 5,
    "tools": 5.5,  # server tools the gateway runs (web search): they drive the Messages call
    "batches": 6,
    "http": 7,
    "app": 8,
    "__main__": 9,
}


def _layer(module: str) -> str:
    parts = module.removesuffix(".__init__").split(".")
    return parts[1] if len(parts) > 1 else "gateway"


def _imports(path: Path) -> list[tuple[str, int]]:
    """(imported gateway module, line) for every import in the file, however nested."""
    module = ".".join(path.relative_to(GATEWAY.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.startswith("gateway")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base == "gateway":  # from gateway import errors, __version__
                found += [(f"gateway.{a.name}", node.lineno) for a in node.names]
            elif base.startswith("gateway"):
                found.append((base, node.lineno))
    return found


def _violations() -> list[str]:
    out = []
    for path in sorted(GATEWAY.rglob("*.py")):
        module = ".".join(path.relative_to(GATEWAY.parent).with_suffix("").parts)
        mine = LAYERS[_layer(module)]
        for imported, line in _imports(path):
            layer = _layer(imported)
            if layer == "__version__":
                continue
            if LAYERS[layer] > mine or (LAYERS[layer] == mine and layer != _layer(module)
                                        and layer not in ("gateway",)):
                out.append(f"{path.relative_to(GATEWAY.parent)}:{line} imports {imported}")
    return out


def test_no_import_runs_upward() -> None:
    assert _violations() == []


@pytest.mark.parametrize("package", ["messages", "upstream", "batches", "local", "openai"])
def test_the_http_shell_is_not_imported_from_below(package: str) -> None:
    """The messages core, the upstream client and batches know nothing of aiohttp's server
    side: what they need is passed in (gateway/messages/call.py, gateway/upstream/call.py)."""
    for path in (GATEWAY / package).rglob("*.py"):
        for imported, line in _imports(path):
            assert _layer(imported) not in ("http", "app"), f"{path}:{line} {imported}"


def test_every_package_has_a_layer() -> None:
    packages = {p.name for p in GATEWAY.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in GATEWAY.glob("*.py") if p.name != "__init__.py"}
    assert packages | modules <= set(LAYERS)
