"""Issue 25, first item: zero replies to the wrong client with the default config, whatever
the upstream does; keep-alive only where replies are matched to their requests.

The protocol fact: on a keep-alive HTTP/1.1 connection the next reply to arrive is taken as
the reply to the request sent last, so one stray reply (a request answered twice, a reply to
nobody on an idle connection) puts every later request on that connection one reply behind.
With ``keepalive = "auto"`` (the default) the gateway sends each request on a fresh connection
(``Connection: close``) until the upstream's replies have echoed the ``X-Request-Id`` it sends
(tests/hostile_upstream.py echoes it as vLLM does, unless the model ends in ``@noecho``); then
it keeps connections alive and refuses any reply that does not name its own request.

Every reply's text is ``reply for <token>``, the token the request's own prompt, so a client
can tell its reply from another's. Only 127.0.0.1; every request has a timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.hostile_gateway import (
    APIS,
    TOKEN_RE,
    Gateway,
    Reply,
    call,
    hostile_config,
    is_broken_upstream,
    load_plan,
    metric_samples,
    new_token,
    outcome,
    request_body,
    start_hostile_gateway,
    text_of,
    upstream_requests,
)
from tests.hostile_gateway import hostile as hostile  # the module's fixtures
from tests.hostile_gateway import own_gateway as own_gateway

pytestmark = pytest.mark.e2e

EXTRA = (
    "ok:20",
    "ok:20@noecho",
    "double-late:10",
    "double-late:10@noecho",
    "unsolicited:300",
    "unsolicited:300@noecho",
    "ok:100",
    "double-late:50",
)


def _default_config(upstream_url: str, upstream_extra: str = "") -> str:
    """The hostile test config (no keepalive key: the default) with this module's models."""
    text = hostile_config(upstream_url, upstream_extra=upstream_extra)
    for name in EXTRA:
        text += (
            f'\n[[models]]\nname = "h-{name}"\nupstream = "hostile"\nupstream_model = "{name}"\n'
        )
    return text


@pytest.fixture(scope="module")
def gateway(hostile: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = start_hostile_gateway(tmp_path_factory.mktemp("gw"), _default_config(hostile))
    try:
        yield gw
    finally:
        gw.proc.stop()


async def _load(
    gw: Gateway,
    plan: list[tuple[str, str, bool]],
    concurrency: int,
    headers: dict[str, str] | None = None,
) -> list[tuple[str, str, bool, str, str | None, bool]]:
    """Run ``plan`` (api, scenario, stream) -> (api, scenario, stream, token, the reply's text
    or None, a clean broken-upstream error). A body that is not the shape asked for (another
    request's stream given to a buffered request) reads as text ``"<unreadable>"``. Every
    request carries ``headers``."""
    sem = asyncio.Semaphore(concurrency)
    results = []

    async def one(session: aiohttp.ClientSession, api: str, scenario: str, stream: bool) -> None:
        token = new_token()
        async with (
            sem,
            session.post(
                gw.root + "/llm" + APIS[api][0],
                json=request_body(api, f"h-{scenario}", token, stream),
                headers=headers,
            ) as resp,
        ):
            data = await resp.read()
        reply = Reply(resp.status, resp.reason or "", list(resp.headers.items()), data, 0)
        try:
            got = outcome(api, stream, reply)
            text, clean = got.text, is_broken_upstream(got.error)
            if set(TOKEN_RE.findall(reply.visible)) - {token}:
                text = "<another request's token>"
        except (ValueError, KeyError, IndexError, TypeError):
            text, clean = "<unreadable>", False
        results.append((api, scenario, stream, token, text, clean))

    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await asyncio.gather(*(one(session, *p) for p in plan))
    return results


def _keepalive(gw: Gateway) -> float | None:
    samples = metric_samples(gw, "llm_gateway_upstream_keepalive")
    return next((v for k, v in samples.items() if 'upstream="hostile"' in k), None)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("late", "share"),
    [("double-late:10", 0.005), ("unsolicited:300", 0.02)],
    ids=["double-replies-10ms", "unsolicited-300ms"],
)
async def test_2000_requests_at_30_misdeliver_nothing_with_the_default_config(
    gateway: Gateway, late: str, share: float
) -> None:
    """Half the requests to an upstream that echoes X-Request-Id (keep-alive is earned, then
    every reply must name its request), half to one that echoes nothing (a connection per
    request); in each half ``share`` of the requests get a second reply ``late``. The others
    take 20 ms, so a kept-alive connection is mostly busy with its next request when the
    stray reply lands (with keep-alive by default, that request read it as its own)."""
    plan = load_plan(1000, {late: share}, "ok:20", seed=25)
    plan += load_plan(1000, {late + "@noecho": share}, "ok:20@noecho", seed=26)
    t0 = time.monotonic()
    results = await _load(gateway, plan, concurrency=30)
    took = time.monotonic() - t0
    wrong = [r for r in results if r[4] is not None and r[4] != f"reply for {r[3]}"]
    failed = [r for r in results if r[4] is None]
    strays = sum(1 for r in results if r[1].startswith(late))
    print(
        f"\n{late}: {len(results)} requests in {took:.1f} s, {strays} answered again later; "
        f"{len(wrong)} got another request's reply, {len(failed)} failed; "
        f"keepalive now {_keepalive(gateway)}"
    )
    assert len(results) == 2000
    assert not wrong, f"{len(wrong)} clients got another request's reply: {wrong[:3]}"
    assert all(r[5] for r in failed), failed[:3]  # each a clean 500 envelope


@pytest.mark.timeout(240)
@pytest.mark.parametrize("keepalive", ["auto", "always"])
async def test_2000_requests_with_one_client_request_id_misdeliver_nothing(
    hostile: str, own_gateway: list[Gateway], tmp_path: Path, keepalive: str
) -> None:
    """A proxy in front of the gateway sets one fixed ``x-request-id`` on every request: the
    id the gateway sends upstream must still name one attempt, or a stray second reply (which
    echoes the id of the request it answered) passes on a reused connection for the next
    request's reply. Every request goes to the echoing upstream and takes 100 ms; 5% are
    answered a second time 50 ms after the first. ``auto`` (the default) earns keep-alive and
    loses it at each stray that lands on an idle connection; ``always`` keeps it (the operator
    vouches for the upstream's echo). With the client's id sent upstream, 8 (auto) and 26
    (always) of the 2,000 clients got another request's reply."""
    gw = start_hostile_gateway(tmp_path, _default_config(hostile, f'keepalive = "{keepalive}"'))
    own_gateway.append(gw)
    fixed = "req_from_a_proxy_0001"
    plan = load_plan(2000, {"double-late:50": 0.05}, "ok:100", seed=31)
    t0 = time.monotonic()
    results = await _load(gw, plan, concurrency=30, headers={"x-request-id": fixed})
    took = time.monotonic() - t0
    wrong = [r for r in results if r[4] is not None and r[4] != f"reply for {r[3]}"]
    failed = [r for r in results if r[4] is None]
    print(
        f"\nkeepalive {keepalive}, one x-request-id: {len(results)} requests in {took:.1f} s; "
        f"{len(wrong)} got another request's reply, {len(failed)} failed"
    )
    assert len(results) == 2000
    assert not wrong, f"{len(wrong)} clients got another request's reply: {wrong[:3]}"
    assert all(r[5] for r in failed), failed[:3]  # each a clean 500 envelope


def _conns(hostile: str, tokens: list[str]) -> list[int]:
    log = {r["token"]: r["conn"] for r in upstream_requests(hostile)}
    return [log[t] for t in tokens]


@pytest.mark.timeout(60)
def test_an_echoing_upstream_earns_keepalive_and_a_wrong_echo_closes_it(
    hostile: str, own_gateway: list[Gateway], tmp_path: Path
) -> None:
    gw = start_hostile_gateway(tmp_path, _default_config(hostile))
    own_gateway.append(gw)
    assert _keepalive(gw) == 0  # auto starts with a connection per request
    tokens = [new_token() for _ in range(30)]
    for token in tokens:
        reply = call(gw, "messages", "ok", token=token)
        assert text_of("messages", False, reply.body) == f"reply for {token}"
    conns = _conns(hostile, tokens)
    # the first 8 replies proved the echo, each on its own connection; the rest share one
    assert len(set(conns[:8])) == 8, conns
    assert len(set(conns[8:])) == 1 and conns[8] not in conns[:8], conns
    assert _keepalive(gw) == 1

    bad = call(gw, "messages", "wrong-id")  # a reply naming another request
    assert bad.status == 500 and is_broken_upstream(outcome("messages", False, bad).error)
    assert _keepalive(gw) == 0
    after = [new_token() for _ in range(3)]
    for token in after:
        reply = call(gw, "messages", "ok", token=token)
        assert text_of("messages", False, reply.body) == f"reply for {token}"
    fresh = _conns(hostile, after)
    assert len(set(fresh)) == 3 and min(fresh) > max(conns), (fresh, conns)


@pytest.mark.timeout(60)
def test_an_upstream_that_never_echoes_never_gets_a_reused_connection(
    hostile: str, own_gateway: list[Gateway], tmp_path: Path
) -> None:
    gw = start_hostile_gateway(tmp_path, _default_config(hostile))
    own_gateway.append(gw)
    tokens = [new_token() for _ in range(20)]
    for token in tokens:
        assert call(gw, "chat", "ok@noecho", token=token).status == 200
    assert len(set(_conns(hostile, tokens))) == 20
    assert _keepalive(gw) == 0
