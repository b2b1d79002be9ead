"""docs/fleets.md's "Fleets" section: every TOML example in it loads with the real config loader
(gateway.ops.config), so the documented fallback, router and Service setups cannot drift from
the schema."""

from __future__ import annotations

import re
import tomllib

from gateway.ops import config
from tests.procs import REPO

HEADING = "\n## Fleets: fallbacks, and a router or a Service as the upstream\n"


def _blocks(lang: str) -> list[str]:
    text = (REPO / "docs" / "fleets.md").read_text()
    start = text.index(HEADING)
    end = text.find("\n##", start + len(HEADING))
    section = text[start : end if end != -1 else None]
    return re.findall(rf"^```{lang}\n(.*?)^```$", section, flags=re.M | re.S)


def _load(text: str) -> config.Config:
    return config.parse(tomllib.loads(text), "docs/fleets.md", {})


def test_the_section_shows_a_fallback_a_router_and_a_service() -> None:
    assert len(_blocks("toml")) == 3
    [launch] = _blocks("bash")
    assert "python -m sglang_router.launch_router" in launch
    assert "--worker-urls" in launch and "--policy cache_aware" in launch


def test_the_fallback_example_loads() -> None:
    cfg = _load(_blocks("toml")[0])
    coder = cfg.models["coder"]
    assert [r.name for r in coder.fallback_routes] == ["coder-small"]
    assert coder.fallback_routes[0].upstream.kind == "llamacpp"
    assert len(coder.upstream.replica_urls) == 2


def test_the_router_and_service_examples_load() -> None:
    _, router, service = _blocks("toml")
    cfg = _load(router)
    fleet = cfg.upstreams["sglang-fleet"]
    assert fleet.kind == "sglang" and fleet.replica_urls == (
        "http://sglang-router.inference.svc:30000/v1",
    )
    # the Service example falls back to the router's model: they load as one file
    both = _load(router + service)
    assert both.upstreams["embedder"].base_urls == ()
    assert len(both.upstreams["chat-pods"].replica_urls) == 2
    assert [r.name for r in both.models["chat"].fallback_routes] == ["qwen3"]
