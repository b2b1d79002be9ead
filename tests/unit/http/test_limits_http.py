"""The limits in the HTTP layer (gateway/http/charges.py), in process: a counters store that
fails is ``[limits] on_store_error``'s (open: uncounted; closed: 529), an error after the
take carries the headers and gives the tokens back, and a client without limits is not
counted at all."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.app import build_app
from gateway.http.charges import UNAVAILABLE_MESSAGE
from gateway.http.keys import COUNTERS
from gateway.ops import config
from gateway.tenancy.counters import CountersUnavailable, LocalStore, Meter, Reading

BODY = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}


class _Store(LocalStore):
    def __init__(self, down: bool) -> None:
        super().__init__()
        self.down = down
        self.takes = 0

    async def take(self, meters: Sequence[Meter], needs: Sequence[int], now: float) -> Reading:
        self.takes += 1
        if self.down:
            raise CountersUnavailable()
        return await super().take(meters, needs, now)


def _app(on_store_error: str, registry: CollectorRegistry) -> Any:
    cfg = config.parse(
        {
            "server": {},
            "upstreams": {"u": {"base_url": "http://127.0.0.1:9/v1", "connect_timeout": 1}},
            "models": [{"name": "m", "upstream": "u", "upstream_model": "m"}],
            "clients": [
                {"name": "lim", "key_env": "K_LIM", "output_tokens_per_minute": 1000},
                {"name": "free", "key_env": "K_FREE"},
            ],
            "limits": {"on_store_error": on_store_error},
        },
        "test.toml",
        {"K_LIM": "k-lim", "K_FREE": "k-free"},
    )
    return build_app(cfg, registry)


def _rejected(registry: CollectorRegistry, reason: str) -> float:
    value = registry.get_sample_value(
        "llm_gateway_rejected_total", {"api": "messages", "reason": reason}
    )
    return value or 0.0


@pytest.mark.parametrize(
    ("policy", "status", "unavailable"),
    [("closed", 529, True), ("open", 529, False)],  # open: the unreachable upstream's 529
)
async def test_a_store_error_is_the_operators_choice(
    aiohttp_client: Any, policy: str, status: int, unavailable: bool
) -> None:
    registry = CollectorRegistry()
    app = _app(policy, registry)
    store = app[COUNTERS] = _Store(down=True)
    client = await aiohttp_client(app)
    resp = await client.post("/llm/v1/messages", json=BODY, headers={"x-api-key": "k-lim"})
    assert resp.status == status
    body = await resp.json()
    assert (body["error"]["message"] == UNAVAILABLE_MESSAGE) is unavailable
    assert resp.headers["retry-after"] == "1"
    assert _rejected(registry, "limits_unavailable") == (1.0 if unavailable else 0.0)
    assert store.takes == 1


async def test_an_error_after_the_take_carries_the_headers_and_gives_back(
    aiohttp_client: Any,
) -> None:
    app = _app("open", CollectorRegistry())
    store = app[COUNTERS] = _Store(down=False)
    client = await aiohttp_client(app)
    for _ in range(2):  # max_tokens 100 of 1000 a minute: given back each time
        resp = await client.post("/llm/v1/messages", json=BODY, headers={"x-api-key": "k-lim"})
        assert resp.status == 529  # the upstream does not answer
        assert resp.headers["anthropic-ratelimit-output-tokens-limit"] == "1000"
        assert resp.headers["anthropic-ratelimit-output-tokens-remaining"] == "900"
    meter = Meter("lim:otpm", 1000, 60.0)
    level = (await store.take([meter], [0], 0.0)).remaining[0]
    assert level >= 999  # the tokens went back (a refill may round up)


async def test_a_client_without_limits_is_not_counted(aiohttp_client: Any) -> None:
    app = _app("open", CollectorRegistry())
    store = app[COUNTERS] = _Store(down=True)
    client = await aiohttp_client(app)
    resp = await client.post("/llm/v1/messages", json=BODY, headers={"x-api-key": "k-free"})
    assert not [h for h in resp.headers if h.startswith("anthropic-ratelimit")]
    assert store.takes == 0
