"""Integration tests: each starts a database server, a child process or builds a model, so
they take seconds where a unit test takes milliseconds. Every test here is marked
``integration`` (``-m "not integration"`` leaves them out)."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)
