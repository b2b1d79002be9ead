"""A proxy in front of the gateway names the developer (``claude gateway`` with
``forward_user_identity: true``), end to end with the real gateway process and the stub.

The gateway listens on 127.0.0.1 and trusts forwarders at 127.0.0.2 only; this test connects
from either source address (both are loopback on Linux). Requests are counted per client in
``llm_gateway_client_requests_total``, so the metric says whose each request was; a client's
``models`` list says what the developer may use. The stub records every header it was sent:
the identity headers never reach it.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.conftest import clear_stub, stub_config, stub_requests
from tests.procs import free_port, metric, start_gateway

pytestmark = pytest.mark.e2e

TRUSTED, UNTRUSTED = "127.0.0.2", "127.0.0.1"
KEYS = {"PROXY_KEY": "proxy-key", "BOB_KEY": "bob-key", "ALICE_KEY": "alice-key"}
CLIENTS = """
[auth]
trusted_forwarders = ["127.0.0.2/32"]

[[clients]]
name = "proxy"
key_env = "PROXY_KEY"
forwards_identity = true

[[clients]]
name = "alice"
key_env = "ALICE_KEY"
forwarded_ids = ["00u-alice"]

[[clients]]
name = "bob"
key_env = "BOB_KEY"
forwarded_emails = ["bob@example.com"]
models = ["m-ok"]
"""
ALICE = {"x-claude-gateway-user-id": "00u-alice", "x-claude-gateway-user-email": "a@example.com"}
BOB = {"x-claude-gateway-user-email": "Bob%40Example.com"}  # as claude gateway encodes it


@dataclass(frozen=True)
class Gateway:
    url: str
    ops: str  # the metrics listener (plain, no key)


@pytest.fixture(scope="module")
def gateway(stub_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    ops_port = free_port()
    proc, url = start_gateway(
        stub_config(stub_url, models=("ok", "tools"), extra_server=f"metrics_port = {ops_port}")
        + CLIENTS,
        tmp_path_factory.mktemp("fwd"),
        env=KEYS,
    )
    yield Gateway(url, f"http://127.0.0.1:{ops_port}")
    proc.stop()


def _post(
    url: str,
    source: str,
    key: str,
    headers: dict[str, str],
    model: str = "m-ok",
    path: str = "/llm/v1/messages",
) -> int:
    """One request from the ``source`` address with ``key`` and ``headers``; -> status."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10, source_address=(source, 0))
    body = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    try:
        conn.request(
            "POST",
            path,
            json.dumps(body),
            {
                "content-type": "application/json",
                "anthropic-version": "2023-06-01",
                "x-api-key": KEYS[key],
                **headers,
            },
        )
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _counts(gw: Gateway) -> dict[str, float]:
    names = ("proxy", "alice", "bob")
    counts = {n: metric(gw.ops, "llm_gateway_client_requests_total", client=n) for n in names}
    for outcome in ("named", "unnamed", "ignored"):
        counts[outcome] = metric(gw.ops, "llm_gateway_forwarded_identities_total", outcome=outcome)
    return counts


# (case id, source address, key, headers, status, whose request, what became of the headers)
CASES = [
    ("trusted proxy names alice by id", TRUSTED, "PROXY_KEY", ALICE, 200, "alice", "named"),
    ("trusted proxy names bob by email", TRUSTED, "PROXY_KEY", BOB, 200, "bob", "named"),
    (
        "a developer nobody names: the proxy's own",
        TRUSTED,
        "PROXY_KEY",
        {"x-claude-gateway-user-email": "carol@example.com"},
        200,
        "proxy",
        "unnamed",
    ),
    ("no headers: the proxy's own", TRUSTED, "PROXY_KEY", {}, 200, "proxy", None),
    # spoofs: the headers are ignored and the request is its key's
    ("proxy key from an untrusted address", UNTRUSTED, "PROXY_KEY", ALICE, 200, "proxy", "ignored"),
    ("bob's key from the trusted address", TRUSTED, "BOB_KEY", ALICE, 200, "bob", "ignored"),
    ("bob's key from elsewhere", UNTRUSTED, "BOB_KEY", ALICE, 200, "bob", "ignored"),
]


@pytest.mark.parametrize(
    "source,key,headers,status,whose,outcome", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_whose_request_it_is(
    gateway: Gateway,
    stub_url: str,
    source: str,
    key: str,
    headers: dict[str, str],
    status: int,
    whose: str,
    outcome: str | None,
) -> None:
    clear_stub(stub_url)
    before = _counts(gateway)
    assert _post(gateway.url, source, key, headers) == status
    after = _counts(gateway)
    changed = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    assert changed == ({whose: 1} | ({outcome: 1} if outcome else {}))
    # what the upstream was sent names nobody
    (sent,) = stub_requests(stub_url)
    lowered = {k.lower() for k in sent["headers"]}
    assert not lowered & {"x-claude-gateway-user-id", "x-claude-gateway-user-email"}


def test_the_named_clients_model_list_applies(gateway: Gateway) -> None:
    """bob may use m-ok only: forwarded as bob, m-tools is refused; the proxy's own key may."""
    assert _post(gateway.url, TRUSTED, "PROXY_KEY", BOB, "m-tools") == 403
    assert _post(gateway.url, UNTRUSTED, "PROXY_KEY", BOB, "m-tools") == 200  # spoofed: the proxy's


def test_the_pass_through_forwards_no_identity_header(gateway: Gateway, stub_url: str) -> None:
    clear_stub(stub_url)
    assert _post(gateway.url, TRUSTED, "PROXY_KEY", ALICE, path="/llm/v1/chat/completions") == 200
    (sent,) = stub_requests(stub_url)
    assert not {k.lower() for k in sent["headers"]} & {
        "x-claude-gateway-user-id",
        "x-claude-gateway-user-email",
    }
