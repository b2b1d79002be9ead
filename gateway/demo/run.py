"""``llm-gateway --demo``: the gateway plus an embedded llama.cpp upstream serving ``demo``.

The tiny model is generated on first run into the cache folder (see
``tinymodel.ensure_model``; about a second, then cached), llama.cpp's server is
started on a free loopback port in a child process, and two routes to it
(upstream kind ``llamacpp``) are added to the config named by ``--config`` (the built-in
default's own routes are left out: nothing serves them here): ``demo``,
and the pattern ``claude-*``, so that Claude Code works with nothing but
``ANTHROPIC_BASE_URL`` and a token set (it names its own default model). The
child is stopped when the gateway exits.

Sizing: each of the two slots holds 131,072 tokens, so Claude Code's full-mode
request (about 78 KB, 23k tokens of the demo tokenizer) fits with room for a
long session. The model is one attention head of 8 dimensions, so the KV cache
of both slots is 8 MB and flash attention (llama.cpp's default, on for the CPU)
keeps the prompt's attention out of a buffer that would grow with the slot. One
thread: on a busy two-core machine llama.cpp's second thread mostly spins at
its barriers (a 23k-token prompt took 1.2 s on one thread, 2-9 s on two). The
prompt cache (``cache_prompt``, llama.cpp's default) makes a later turn of the
same conversation, which repeats the system prompt and tools, cost only its new
tokens.
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import sys
import tempfile
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

import structlog

from gateway.ops.config import Config, ModelRoute, UpstreamConfig

DEMO_MODEL = "demo"
CLAUDE_PATTERN = "claude-*"
SLOT_CONTEXT = 131_072  # tokens per slot
SLOTS = 2
# llama.cpp keeps prompts evicted from a slot in host memory (8 GiB by default); a tiny model's
# prompt is about 1 MB, so this is plenty
_PROMPT_CACHE_MIB = 256


def with_demo_route(cfg: Config, base_url: str) -> Config:
    upstream = UpstreamConfig(name="demo-llamacpp", base_url=base_url, kind="llamacpp")
    route = ModelRoute(
        name=DEMO_MODEL,
        upstream=upstream,
        upstream_model=DEMO_MODEL,
        display_name="Tiny demo model (llama.cpp)",
        context_window=SLOT_CONTEXT,
    )
    claude = replace(route, name=CLAUDE_PATTERN, display_name="Claude Code on the tiny demo model")
    return replace(
        cfg,
        upstreams={**cfg.upstreams, upstream.name: upstream},
        models={**cfg.models, DEMO_MODEL: route, CLAUDE_PATTERN: claude},
    )


def run_demo(
    cfg: Config, serve: Callable[[Config], Coroutine[Any, Any, None]], *, explicit_config: bool
) -> int:
    if not explicit_config:
        # the built-in default's routes (reasoning, qwen2.5:3b-instruct) name servers the demo
        # does not run: /v1/models lists only what the demo serves
        cfg = replace(cfg, upstreams={}, models={})
    missing = [m for m in ("xllamacpp", "gguf", "numpy") if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"llm-gateway: --demo needs the demo extra ({', '.join(missing)} missing): "
            "pip install '.[demo]'",
            file=sys.stderr,
        )
        return 2
    from gateway.demo.llama import LlamaServer, LlamaServerError
    from gateway.demo.tinymodel import ensure_model

    log = structlog.get_logger("gateway.demo")
    path, _ = ensure_model()
    server = LlamaServer(
        path,
        ctx_size=SLOT_CONTEXT * SLOTS,
        parallel=SLOTS,
        threads=1,
        alias=DEMO_MODEL,
        extra_args=(f"cache_ram_mib={_PROMPT_CACHE_MIB}",),
    )
    try:
        base_url = server.start(timeout=120)
    except LlamaServerError:
        log.error("demo_upstream_failed", detail="the embedded llama.cpp server did not start")
        return 1
    # upstream_pid: the pipeline's own pid field (the gateway's) would replace a "pid" here
    log.info("demo_upstream_started", model=DEMO_MODEL, upstream_pid=server.pid)
    scratch = None
    if not cfg.batches.database and not cfg.batches.database_env:
        # --demo keeps its batches in a temporary database unless the config names one
        scratch = tempfile.mkdtemp(prefix="llm-gateway-demo-")
        cfg = replace(
            cfg, batches=replace(cfg.batches, database_url=f"sqlite:///{scratch}/batches.sqlite3")
        )
    try:
        asyncio.run(serve(with_demo_route(cfg, base_url)))
    finally:
        server.stop()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0
