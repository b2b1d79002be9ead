"""The real JavaScript clients the tests drive (``tests/clients``, installed with npm ci)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CLIENTS = Path(__file__).resolve().parent / "clients"


def ts_sdk_ready() -> None:
    """Skip (fail under CI) unless node and the TypeScript SDK are installed."""
    if shutil.which("node") and (CLIENTS / "node_modules" / "@anthropic-ai" / "sdk").is_dir():
        return
    message = "TypeScript SDK not installed: (cd tests/clients && npm ci)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
