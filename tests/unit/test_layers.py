"""The package's layers, checked on its import graph: data flows http -> messages/openai/batches
-> upstream, and no import runs upward (a module may import its own layer and those below).

Layers, lowest first: shared text utilities (``text``), the error tree (``errors``),
operations (``ops``), the upstream client (``upstream``), clients and their limits
(``tenancy``), what local engines emit (``local``),
the surfaces (``messages``, ``openai``), the server tools the gateway runs (``tools``),
Message Batches (``batches``), Claude Code's sign-in (``auth``), the HTTP shell
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
    "tenancy": 3.5,  # clients, limits, fair admission, usage: on ops alone, wired by http
    "local": 4,
    "messages": 5,
    "openai": 5,
    "tools": 5.5,  # server tools the gateway runs (web search): they drive the Messages call
    "batches": 6,
    "auth": 6.5,  # Claude Code's sign-in: tokens in the batches' database, wired by http
    "http": 7,
    "app": 8,
    "stores": 8.5,  # the state stores start-up opens (gateway/stores.py)
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
            if LAYERS[layer] > mine or (
                LAYERS[layer] == mine and layer != _layer(module) and layer not in ("gateway",)
            ):
                out.append(f"{path.relative_to(GATEWAY.parent)}:{line} imports {imported}")
    return out


def test_no_import_runs_upward() -> None:
    assert _violations() == []


@pytest.mark.parametrize("package", ["messages", "upstream", "batches", "local", "openai"])
def test_the_http_shell_is_not_imported_from_below(package: str) -> None:
    """The messages core, the upstream client and batches know nothing of aiohttp's server
    side: what they need is passed in (gateway/messages/deps.py, gateway/upstream/send.py)."""
    for path in (GATEWAY / package).rglob("*.py"):
        for imported, line in _imports(path):
            assert _layer(imported) not in ("http", "app"), f"{path}:{line} {imported}"


def test_every_package_has_a_layer() -> None:
    packages = {p.name for p in GATEWAY.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in GATEWAY.glob("*.py") if p.name != "__init__.py"}
    assert packages | modules <= set(LAYERS)


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """The statements run at import: the module's own, and those under its ``if``/``try``
    (``if TYPE_CHECKING:`` too: a cycle type checkers and refactors trip on), not a
    function's or class's body."""
    out: list[ast.stmt] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody
            todo += [stmt for handler in node.handlers for stmt in handler.body]
    return out


def _graph() -> dict[str, set[str]]:
    """gateway module -> the gateway modules it imports at module level (``from package
    import module`` names the module)."""
    paths = {
        ".".join(p.relative_to(GATEWAY.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in GATEWAY.rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found: set[str] = set()
        for node in _module_level(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in paths}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                if base not in paths:
                    continue
                subs = {f"{base}.{a.name}" for a in node.names} & paths.keys()
                found |= subs or {base}
                if len(subs) < len(node.names):
                    found.add(base)
        graph[module] = found - {module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each module that is on one (depth-first search)."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_no_import_cycle_inside_the_package() -> None:
    """No gateway module imports, at module level, one that imports it back (directly or
    through others): a cycle makes the import order matter and hides a seam. A module that
    needs one importing it takes a ``typing.Protocol`` of what it uses (e.g.
    gateway/messages/continuation.py's ``Continuable``)."""
    assert [" -> ".join(cycle) for cycle in _cycles(_graph())] == []


@pytest.mark.parametrize(
    ("graph", "cyclic"),
    [
        ({"a": {"b"}, "b": {"a"}}, True),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, True),
        ({"a": {"b", "c"}, "b": {"c"}, "c": set()}, False),
    ],
)
def test_the_cycle_check_finds_cycles(graph: dict[str, set[str]], cyclic: bool) -> None:
    assert bool(_cycles(graph)) is cyclic


def _modules() -> list[Path]:
    return sorted(p for p in GATEWAY.rglob("*.py") if p.name != "__init__.py")


def test_no_two_modules_share_a_file_name() -> None:
    """A name says where a thing is: ``call.py`` twice (a Messages call, an upstream send)
    sent readers to the wrong file."""
    seen: dict[str, list[str]] = {}
    for path in _modules():
        seen.setdefault(path.name, []).append(str(path.relative_to(GATEWAY)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}


def test_no_two_classes_share_a_name() -> None:
    seen: dict[str, list[str]] = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ClassDef):
                seen.setdefault(node.name, []).append(str(path.relative_to(GATEWAY)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}
