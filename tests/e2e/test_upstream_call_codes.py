"""One upstream call for every caller: a batch request's upstream outcome is counted with the
same codes and histograms as an interactive request's (gateway/upstream/send.py).

Before the upstream call was written once, the batch scheduler counted a connect failure as
``529`` and a timeout as ``504`` (codes no upstream sent) and skipped the response-headers
histogram; interactive requests counted ``connect_error`` and ``timeout``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.batch_client import batches_toml, create, request
from tests.conftest import stub_config
from tests.procs import Proc, free_port, get, post

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _samples(base_root: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    status, _, body = get(f"{base_root}/metrics")
    assert status == 200
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def _count(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _codes(samples: dict[Any, float], model: str) -> dict[str, float]:
    return {
        dict(key[1])["code"]: value
        for key, value in samples.items()
        if key[0] == "llm_gateway_upstream_requests_total"
        and dict(key[1]).get("model") == model
        and value
    }


def test_batch_and_interactive_calls_count_the_same_codes(
    stub_url: str, tmp_path: Path, gateway_factory: Callable[..., tuple[Proc, str]]
) -> None:
    dead = free_port()  # nothing listens there: every connect is refused
    config = stub_config(stub_url, models=("ok", "hang-headers")).replace(
        "header_timeout = 3", "header_timeout = 1"
    )
    config += (
        f'\n[upstreams.dead]\nbase_url = "http://127.0.0.1:{dead}/v1"\n'
        '\n[[models]]\nname = "m-dead"\nupstream = "dead"\nupstream_model = "x"\n'
    )
    config += batches_toml(tmp_path / "batches.sqlite3")
    _, root = gateway_factory(config)
    base = root + "/llm"

    # interactive: one request per outcome
    for model, want in (("m-dead", 529), ("m-hang-headers", 504), ("m-ok", 200)):
        status, _, body = post(
            f"{base}/v1/messages",
            {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert status == want, body
    before = _samples(root)
    assert _codes(before, "m-dead") == {"connect_error": 1.0}
    assert _codes(before, "m-hang-headers") == {"timeout": 1.0}
    assert _codes(before, "m-ok") == {"200": 1.0}
    heads = _count(
        before, "llm_gateway_upstream_response_headers_seconds_count", model="m-ok", upstream="stub"
    )
    assert heads == 1.0

    # the same three through a batch (the failures are retried later: their first run counts)
    status, batch = create(
        base, [request("dead", "m-dead"), request("hang", "m-hang-headers"), request("ok", "m-ok")]
    )
    assert status == 200, batch
    deadline = time.monotonic() + 60
    while True:
        after = _samples(root)
        if (
            sum(_codes(after, "m-dead").values()) >= 2
            and sum(_codes(after, "m-hang-headers").values()) >= 2
            and sum(_codes(after, "m-ok").values()) >= 2
        ):
            break
        assert time.monotonic() < deadline, json.dumps(
            {m: _codes(after, m) for m in ("m-dead", "m-hang-headers", "m-ok")}
        )
        time.sleep(0.2)
    # only the codes interactive requests use: never a made-up 529 or 504
    assert set(_codes(after, "m-dead")) == {"connect_error"}
    assert set(_codes(after, "m-hang-headers")) == {"timeout"}
    assert set(_codes(after, "m-ok")) == {"200"}
    # and the batch's answered call was timed like an interactive one
    assert (
        _count(
            after,
            "llm_gateway_upstream_response_headers_seconds_count",
            model="m-ok",
            upstream="stub",
        )
        == 2.0
    )
