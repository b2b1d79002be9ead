"""The tests' own shape, checked on their import graph.

A test module (``test_*.py``) holds tests; what several of them share lives in a helper module
with public names (``tests/*.py``, listed in tests/__init__.py: processes in ``procs.py``,
the log in ``logs.py``, waiting in ``waits.py``, ...). So no module under tests/
imports from a test module (importing one runs its module-level code, a module-level skip
included, and a helper that moves with its test file breaks its importers), and none imports
another module's private (``_``) name. Imports inside a function count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, root: Path) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, names imported from it) of every import in ``path``."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [alias.name for alias in node.names]
            out.append((node.lineno, base, names))
            # ``from tests.e2e import test_x`` imports the module test_x itself
            out += [(node.lineno, f"{base}.{n}", []) for n in names if n.startswith("test_")]
    return out


def _violations(path: Path, root: Path = TESTS) -> list[str]:
    found = []
    where = path.relative_to(root.parent)
    for line, module, names in _imports(path, root):
        if not module.startswith("tests"):
            continue
        if module.rsplit(".", 1)[-1].startswith("test_"):
            found.append(f"{where}:{line} imports test module {module}")
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        if private:
            found.append(f"{where}:{line} imports private {', '.join(private)} from {module}")
    return found


def test_no_module_imports_a_test_module_or_a_private_name() -> None:
    found = [
        v
        for path in sorted(TESTS.rglob("*.py"))
        if "node_modules" not in path.parts
        for v in _violations(path)
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ("from tests.e2e.test_batches import create\n", True),
        ("def f():\n    from tests.unit.test_stream import run_case\n", True),
        ("import tests.deploy.test_deploy\n", True),
        ("from tests.e2e import test_ts_sdk\n", True),
        ("from .test_deploy import need\n", True),
        ("from tests.upstream_wire import _settle\n", True),
        ("from tests.batch_client import create, wait_ended\n", False),
        ("from tests.deploy import kustomize\n", False),
        ("from aiohttp.test_utils import TestClient\n", False),
        ("from tests.hostile_gateway import hostile as hostile\n", False),
    ],
)
def test_the_check_sees_each_form_of_import(tmp_path: Path, source: str, bad: bool) -> None:
    """The walk above catches every spelling of such an import, and passes the allowed ones."""
    folder = tmp_path / "tests" / "deploy"
    folder.mkdir(parents=True)
    module = folder / "test_probe.py"
    module.write_text(source)
    assert bool(_violations(module, tmp_path / "tests")) is bad


# what starts a process; unit tests run in the test process only (processes: tests/integration,
# tests/e2e, tests/observability, tests/deploy)
_PROCESS_MODULES = {
    "subprocess",
    "multiprocessing",
    "gateway.messages.documents.pdf_pool",
    "tests.procs.start_gateway",
}


def test_unit_tests_start_no_process() -> None:
    unit = TESTS / "unit"
    found = [
        f"{path.relative_to(TESTS)}:{line} imports {module}"
        for path in sorted(unit.rglob("*.py"))
        for line, module, names in _imports(path, TESTS)
        if module in _PROCESS_MODULES
        or any(f"{module}.{n}" in _PROCESS_MODULES for n in names)
        or (module == "asyncio" and "create_subprocess_exec" in names)
    ]
    assert found == []


def test_tests_mirror_the_package() -> None:
    """A unit test lives under the package it tests: tests/unit/<package>/test_*.py."""
    packages = {p.name for p in (TESTS.parent / "gateway").iterdir() if p.is_dir()}
    misplaced = [
        str(path.relative_to(TESTS))
        for path in (TESTS / "unit").rglob("test_*.py")
        if path.parent.name not in packages and path.parent != TESTS / "unit"
    ]
    assert misplaced == []
