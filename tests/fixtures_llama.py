"""Pytest fixtures for a real llama.cpp upstream (xllamacpp) serving the generated tiny model.

Import them into a conftest (``from tests.fixtures_llama import *``). Everything skips with a
reason when the optional packages are missing, so the rest of the suite still runs.

* ``tiny_model`` (session): ``(path, expect)``, the model built into a temporary folder.
* ``llama_upstream`` (session): the started :class:`LlamaServer` (pid, root_url, base_url).
* ``llama_server`` (session): its OpenAI base URL, ``http://127.0.0.1:PORT/v1``.
* ``llama_unified`` (session, started only when asked for): a second server whose two slots
  share one small KV cache (``kv_unified``), the setting in which concurrent generations overflow
  the context mid-stream.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.demo.llama import LlamaServer
from gateway.demo.tinymodel import ensure_model

__all__ = ["llama_server", "llama_unified", "llama_upstream", "tiny_model"]

# the small-context server used to provoke a mid-stream overflow; per request it needs
# max_tokens * 2 > UNIFIED_CTX_SIZE with both generations running at once
UNIFIED_CTX_SIZE = 256


def _require(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        reason = (
            f"real llama.cpp upstream unavailable: {', '.join(missing)} not installed "
            "(pip install '.[demo]')"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    _require("gguf", "numpy")
    return ensure_model(str(tmp_path_factory.mktemp("tiny-model")))


def _serve(model_path: str, **kwargs: Any) -> Iterator[LlamaServer]:
    _require("xllamacpp")
    server = LlamaServer(model_path, threads=1, alias="demo", **kwargs)
    server.start(timeout=60)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def llama_upstream(tiny_model: tuple[str, dict[str, Any]]) -> Iterator[LlamaServer]:
    yield from _serve(tiny_model[0], ctx_size=2048, parallel=2)


@pytest.fixture(scope="session")
def llama_server(llama_upstream: LlamaServer) -> str:
    assert llama_upstream.base_url is not None
    return llama_upstream.base_url


@pytest.fixture(scope="session")
def llama_unified(tiny_model: tuple[str, dict[str, Any]]) -> Iterator[LlamaServer]:
    yield from _serve(
        tiny_model[0], ctx_size=UNIFIED_CTX_SIZE, parallel=2, extra_args=("kv_unified=true",)
    )
