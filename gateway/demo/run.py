"""``llm-gateway --demo``: the gateway plus an embedded llama.cpp upstream serving ``demo``.

The tiny model is generated on first run into the cache folder (see
``tinymodel.ensure_model``), llama.cpp's server is started on a free loopback
port in a child process, and a ``demo`` route (upstream kind ``llamacpp``) is
added to whatever config was loaded. The child is stopped when the gateway
exits.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

import structlog

from gateway.config import Config, ModelRoute, UpstreamConfig

DEMO_MODEL = "demo"


def with_demo_route(cfg: Config, base_url: str) -> Config:
    upstream = UpstreamConfig(name="demo-llamacpp", base_url=base_url, kind="llamacpp")
    route = ModelRoute(name=DEMO_MODEL, upstream=upstream, upstream_model=DEMO_MODEL,
                       display_name="Tiny demo model (llama.cpp)", context_window=4096)
    return replace(cfg, upstreams={**cfg.upstreams, upstream.name: upstream},
                   models={**cfg.models, DEMO_MODEL: route})


def run_demo(cfg: Config, serve: Callable[[Config], Coroutine[Any, Any, None]], *,
             explicit_config: bool) -> int:
    del explicit_config  # the demo route is added to any config
    missing = [m for m in ("xllamacpp", "gguf", "numpy") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"llm-gateway: --demo needs the demo extra ({', '.join(missing)} missing): "
              "pip install '.[demo]'", file=sys.stderr)
        return 2
    from gateway.demo.llama import LlamaServer, LlamaServerError
    from gateway.demo.tinymodel import ensure_model

    log = structlog.get_logger("gateway.demo")
    path, _ = ensure_model()
    server = LlamaServer(path, ctx_size=4096, parallel=2, alias=DEMO_MODEL)
    try:
        base_url = server.start(timeout=120)
    except LlamaServerError:
        log.error("demo_upstream_failed", detail="the embedded llama.cpp server did not start")
        return 1
    log.info("demo_upstream_started", model=DEMO_MODEL, pid=server.pid)
    try:
        asyncio.run(serve(with_demo_route(cfg, base_url)))
    finally:
        server.stop()
    return 0
