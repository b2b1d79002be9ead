"""The fleet: DNS discovery's diff, replica URLs, probe outcomes on replica state, and the
client following a (scripted) resolver and probing (scripted) health routes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway import errors
from gateway.ops.config import ConfigError, UpstreamConfig, parse
from gateway.ops.metrics import Metrics
from gateway.upstream import fleet
from gateway.upstream.client import UpstreamClient
from gateway.upstream.discovery import Change, diff, replica_url, resolve
from gateway.upstream.exceptions import BrokenResponse
from gateway.upstream.replicas import Replicas, rendezvous

# ---------------------------------------------------------------- discovery, pure


@pytest.mark.parametrize(
    ("current", "answer", "cap", "want"),
    [
        ([], ["10.0.0.2", "10.0.0.1"], 16, Change(join=("10.0.0.1", "10.0.0.2"))),
        (["a", "b"], ["b", "a"], 16, Change()),  # order of the answer does not matter
        (["a", "b"], ["a", "c"], 16, Change(join=("c",), leave=("b",))),
        (["a", "b"], [], 16, Change()),  # nothing answered: the last set stays
        (["a"], ["a", "d", "c", "b"], 2, Change(join=("b",), over=2)),  # cap: newcomers in order
        (["x", "y"], ["a", "b", "x", "y"], 2, Change(over=2)),  # the ones in stay in
        (["x", "y"], ["a", "b", "y"], 2, Change(join=("a",), leave=("x",), over=1)),
        (["a"], ["a", "a", "b"], 16, Change(join=("b",))),  # an address listed twice
    ],
)
def test_diff(current: list[str], answer: list[str], cap: int, want: Change) -> None:
    assert diff(current, answer, cap) == want


@pytest.mark.parametrize(
    ("base_url", "address", "want"),
    [
        ("http://vllm:8000/v1", "10.1.2.3", "http://10.1.2.3:8000/v1"),
        ("https://vllm.ns.svc/v1", "10.1.2.3", "https://10.1.2.3:443/v1"),
        ("http://vllm/v1", "10.1.2.3", "http://10.1.2.3:80/v1"),
        ("http://user:pw@vllm:8000/v1", "10.1.2.3", "http://10.1.2.3:8000/v1"),
        ("http://vllm:8000/v1", "fd00::5", "http://[fd00::5]:8000/v1"),
        ("http://vllm:8000/serve/v1", "10.1.2.3", "http://10.1.2.3:8000/serve/v1"),
    ],
)
def test_replica_url(base_url: str, address: str, want: str) -> None:
    assert replica_url(base_url, address) == want


async def test_the_system_resolver_finds_localhost() -> None:
    addresses = await resolve("localhost", 80)
    assert addresses and set(addresses) <= {"127.0.0.1", "::1"}
    assert len(addresses) == len(set(addresses))


# ---------------------------------------------------------------- probe outcomes, pure


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


URLS = ["http://a:8000/v1", "http://b:8000/v1", "http://c:8000/v1"]
HOLD = 7.0


def _state(reps: Replicas, now: float) -> str:
    r = reps.all[0]
    state = r.state(now)
    if state == "ejected" and r.ejected_until <= now:  # not reached: state says trial then
        return "?"
    return state


# (how the replica stands, the probe's outcome) -> (its state now, in 5 s, failures)
@pytest.mark.parametrize(
    ("before", "ok", "now_state", "later_state", "failures"),
    [
        ("healthy", True, "healthy", "healthy", 0),
        ("healthy", False, "ejected", "ejected", 1),  # held out past its 1 s back-off
        ("probe_ejected", True, "healthy", "healthy", 0),  # back at once
        ("probe_ejected", False, "ejected", "ejected", 2),
        ("connect_ejected", True, "healthy", "healthy", 0),  # refused, now up: back at once
        ("request_ejected", True, "ejected", "trial", 3),  # its back-off runs, then its trial
        ("request_ejected", False, "ejected", "ejected", 4),
    ],
)
def test_probe_outcome_table(
    before: str, ok: bool, now_state: str, later_state: str, failures: int
) -> None:
    clock = Clock()
    reps = Replicas(URLS, clock=clock)
    r = reps.all[0]
    if before == "probe_ejected":
        reps.probed(r, False, HOLD)
    elif before.endswith("_ejected"):
        for _ in range(3):
            reps.failed(r, before.removesuffix("_ejected"))  # out for 4 s
    reps.probed(r, ok, HOLD)
    assert r.failures == failures
    assert _state(reps, clock.now) == now_state
    assert _state(reps, clock.now + 5) == later_state
    if now_state == "ejected":
        assert r not in reps.order(b"k")[:2]  # no request meets it while the others are in


def test_a_lone_replica_is_not_ejected_by_its_probe() -> None:
    reps = Replicas(URLS[:1])
    reps.probed(reps.all[0], False, HOLD)
    assert reps.all[0].state(0.0) == "healthy" and reps.all[0].probe_failed


def test_health_changes_are_reported_once_each_way() -> None:
    seen: list[bool] = []
    reps = Replicas(URLS, on_health=lambda r, healthy: seen.append(healthy))
    for ok in (False, False, False, True, True, False):
        reps.probed(reps.all[1], ok, HOLD)
    assert seen == [False, True, False]


def test_membership_changes_move_only_the_sessions_they_must() -> None:
    keys = [f"s{i}".encode() for i in range(400)]
    reps = Replicas(URLS)
    before = {k: reps.order(k)[0].base_url for k in keys}
    new = reps.add("http://d:8000/v1")
    assert new.index == 3 and reps.attempts == 3
    grown = {k: reps.order(k)[0].base_url for k in keys}
    assert all(grown[k] in (before[k], new.base_url) for k in keys)
    assert 0.1 < sum(grown[k] == new.base_url for k in keys) / len(keys) < 0.4
    gone = reps.all[0]
    reps.remove(gone)
    shrunk = {k: reps.order(k)[0].base_url for k in keys}
    assert all(shrunk[k] == grown[k] for k in keys if grown[k] != gone.base_url)
    assert gone not in {r for k in keys for r in reps.order(k)}
    assert reps.add("http://e:8000/v1").index == 4  # indices are never reused
    assert rendezvous(keys[0], [r.base_url for r in reps.all])  # _urls follows `all`


# ---------------------------------------------------------------- config


def _upstream(**keys: Any) -> UpstreamConfig:
    data = {
        "upstreams": {"u": {"base_url": "http://vllm:8000/v1", **keys}},
        "models": [{"name": "m", "upstream": "u", "upstream_model": "x"}],
    }
    return parse(data, "t.toml", {}).upstreams["u"]


@pytest.mark.parametrize(
    ("keys", "want"),
    [
        ({}, ("none", "/health")),
        ({"kind": "ollama"}, ("none", "/api/version")),
        ({"discover": "dns", "health_path": "/ping"}, ("dns", "/ping")),
        ({"discover": "sometimes"}, "upstreams.u.discover: must be one of none, dns"),
        ({"health_path": "health"}, "upstreams.u.health_path: must start with '/'"),
        ({"health_path": "/a b"}, "upstreams.u.health_path: must start with '/'"),
        ({"max_replicas": 1000}, "upstreams.u.max_replicas: must be at most 256"),
        ({"health_interval": -1}, "upstreams.u.health_interval: must be >= 0"),
        ({"resolve_interval": 0}, "upstreams.u.resolve_interval: must be > 0"),
    ],
)
def test_fleet_config(keys: dict[str, Any], want: Any) -> None:
    if isinstance(want, tuple):
        cfg = _upstream(**keys)
        assert (cfg.discover, cfg.health_path) == want
        return
    with pytest.raises(ConfigError, match=want.replace("(", r"\(")):
        _upstream(**keys)


def test_dns_takes_one_base_url() -> None:
    data = {
        "upstreams": {"u": {"base_urls": ["http://a/v1", "http://b/v1"], "discover": "dns"}},
        "models": [{"name": "m", "upstream": "u", "upstream_model": "x"}],
    }
    with pytest.raises(ConfigError, match=r"upstreams\.u\.discover"):
        parse(data, "t.toml", {})


# ---------------------------------------------------------------- the client


class Resolver:
    """Answers from ``answer``: a list of addresses, or an exception to raise."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return list(self.answer)


def _dns_cfg(port: int = 8000, **keys: Any) -> UpstreamConfig:
    return replace(
        UpstreamConfig(name="fleet", base_url=f"http://vllm.test:{port}/v1"), discover="dns", **keys
    )


def _value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def _labels(metrics: Metrics) -> set[str]:
    return {
        s.labels["replica"]
        for f in metrics.registry.collect()
        if f.name == "llm_gateway_upstream_replica_healthy"
        for s in f.samples
    }


async def test_the_client_follows_the_name() -> None:
    metrics = Metrics(CollectorRegistry())
    resolver = Resolver(["10.0.0.2", "10.0.0.1"])
    client = UpstreamClient(_dns_cfg(max_replicas=3), metrics=metrics, resolve=resolver)
    await client.start()
    try:
        assert resolver.asked == [("vllm.test", 8000)]
        assert [r.base_url for r in client.replicas.all] == [
            "http://10.0.0.1:8000/v1",
            "http://10.0.0.2:8000/v1",
        ]
        assert _labels(metrics) == {"vllm.test:8000#0", "vllm.test:8000#1"}
        assert _value(metrics, "llm_gateway_upstream_replicas", upstream="fleet") == 2
        # the pools connect to the address and name the host
        pool = client.members.pools[client.replicas.all[0].index]
        assert (pool._address, pool._host) == ("10.0.0.1", "vllm.test")
        assert b"Host: vllm.test:8000\r\n" in pool._fixed
        assert "10.0.0.1" in client.hosts  # scrubbed from upstream error text

        # a failure, an empty answer, a timeout: the set stays, each counted
        for answer in (socket.gaierror(-2, "Name or service not known"), []):
            resolver.answer = answer
            await client.members.resolve_now()
        assert len(client.replicas.all) == 2
        assert (
            _value(
                metrics,
                "llm_gateway_upstream_resolutions_total",
                upstream="fleet",
                outcome="failed",
            )
            == 1
        )
        assert (
            _value(
                metrics, "llm_gateway_upstream_resolutions_total", upstream="fleet", outcome="empty"
            )
            == 1
        )

        # one leaves while a request holds it, two join (the cap is 3: one left out)
        leaving = client.replicas.all[0]
        client.members.started(leaving)
        resolver.answer = ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"]
        await client.members.resolve_now()
        assert [r.base_url for r in client.replicas.all] == [
            "http://10.0.0.2:8000/v1",
            "http://10.0.0.3:8000/v1",
            "http://10.0.0.4:8000/v1",
        ]
        assert leaving.index in client.members.pools  # its request runs on
        assert _labels(metrics) == {f"vllm.test:8000#{n}" for n in range(4)}
        client.members.finished(leaving)
        assert leaving.index not in client.members.pools  # closed after its last request
        assert _labels(metrics) == {f"vllm.test:8000#{n}" for n in (1, 2, 3)}
        client.replicas.failed(leaving)  # a late outcome writes no series for its old slot
        assert _labels(metrics) == {f"vllm.test:8000#{n}" for n in (1, 2, 3)}
        assert _value(metrics, "llm_gateway_upstream_replicas", upstream="fleet") == 3
    finally:
        await client.close()


async def test_churn_keeps_the_labels_bounded() -> None:
    metrics = Metrics(CollectorRegistry())
    resolver = Resolver([])
    client = UpstreamClient(_dns_cfg(max_replicas=2), metrics=metrics, resolve=resolver)
    await client.start()
    try:
        for n in range(0, 60, 2):  # thirty rollouts, each a new pair of addresses
            resolver.answer = [f"10.0.1.{n}", f"10.0.1.{n + 1}"]
            await client.members.resolve_now()
        assert len(client.replicas.all) == 2
        assert _labels(metrics) <= {f"vllm.test:8000#{n}" for n in range(4)}
    finally:
        await client.close()


async def test_replica_series_follow_the_replicas_through_a_leave() -> None:
    """The per-request series (in flight, requests by outcome) of the replicas that stay
    are still the exposed ones after another's series are removed; the one that left and the
    newcomer on its slot do not share a series."""
    metrics = Metrics(CollectorRegistry())
    resolver = Resolver(["10.0.0.1", "10.0.0.2"])
    client = UpstreamClient(_dns_cfg(max_replicas=2), metrics=metrics, resolve=resolver)
    members = client.members
    await client.start()

    def in_flight(label: str) -> float | None:
        return _value(
            metrics, "llm_gateway_upstream_replica_in_flight", upstream="fleet", replica=label
        )

    def ok(label: str) -> float | None:
        return _value(
            metrics,
            "llm_gateway_upstream_replica_requests_total",
            upstream="fleet",
            replica=label,
            outcome="ok",
        )

    try:
        one, two = client.replicas.all
        members.started(one)
        members.started(two)
        members.count(two, "ok")
        assert (in_flight(one.label), in_flight(two.label), ok(two.label)) == (1, 1, 1)
        members.finished(one)
        resolver.answer = ["10.0.0.2", "10.0.0.3"]
        await members.resolve_now()  # one leaves (its series go), a newcomer takes its slot
        members.count(two, "ok")
        members.finished(two)
        assert (in_flight(two.label), ok(two.label)) == (0, 2)
        members.count(one, "ok")  # a late outcome of the one that left writes nothing
        three = client.replicas.all[1]
        assert three.label == one.label  # the newcomer holds the freed slot
        assert (in_flight(three.label), ok(three.label)) == (0, 0)
        members.started(three)
        members.count(three, "status_5xx")
        assert in_flight(three.label) == 1
        assert (
            _value(
                metrics,
                "llm_gateway_upstream_replica_requests_total",
                upstream="fleet",
                replica=three.label,
                outcome="status_5xx",
            )
            == 1
        )
        members.finished(three)
    finally:
        await client.close()


async def test_no_address_at_start_is_a_529_until_one_resolves() -> None:
    resolver = Resolver(socket.gaierror(-2, "Name or service not known"))
    client = UpstreamClient(_dns_cfg(), resolve=resolver)
    await client.start()  # does not raise
    try:
        with pytest.raises(errors.UpstreamUnavailable):
            await client.request("/chat/completions", b"{}", stream=False)
        assert errors.UpstreamUnavailable().status == 529
    finally:
        await client.close()


@pytest.fixture
async def engine() -> AsyncIterator[tuple[int, list[int], list[bytes]]]:
    """A scripted engine on 127.0.0.1: GET /health answers the status in ``health[0]`` (0: no
    answer at all); every request head is kept in ``seen``."""
    health, seen = [200], []
    writers: list[asyncio.StreamWriter] = []
    done = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head)
        if health[0] == 0:
            await done.wait()
        else:
            writer.write(b"HTTP/1.1 %d X\r\nContent-Length: 0\r\n\r\n" % health[0])
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], health, seen
    finally:
        done.set()
        server.close()
        await asyncio.sleep(0.01)
        for writer in writers:
            writer.close()
        await server.wait_closed()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_probes_eject_and_bring_back(engine: tuple[int, list[int], list[bytes]]) -> None:
    port, health, seen = engine
    metrics = Metrics(CollectorRegistry())
    cfg = replace(
        UpstreamConfig(name="fleet", base_url="http://e.test:1/v1"),
        base_urls=(f"http://127.0.0.1:{port}/v1", f"http://localhost:{_closed_port()}/v1"),
        health_interval=5.0,
        health_timeout=0.3,
    )
    client = UpstreamClient(cfg, metrics=metrics)
    await client.start()  # one probe round before it returns
    try:
        up, down = client.replicas.all
        assert seen[-1].startswith(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:")
        assert up.state(0) == "healthy" and down.probe_failed
        assert down.ejected_until >= asyncio.get_running_loop().time() + 5.0
        label = down.label
        assert (
            _value(
                metrics,
                "llm_gateway_upstream_probes_total",
                upstream="fleet",
                replica=label,
                outcome="error",
            )
            == 1
        )

        steps: list[tuple[int, str, bool]] = [
            (503, "status", False),
            (0, "timeout", False),
            (200, "ok", True),
        ]
        for status, outcome, healthy in steps:
            health[0] = status
            assert await client.members.probe(up) == outcome
            assert (up.failures == 0) is healthy
            assert _value(
                metrics, "llm_gateway_upstream_replica_healthy", upstream="fleet", replica=up.label
            ) == (1 if healthy else 0)
    finally:
        await client.close()


async def test_probe_path_is_at_the_server_root() -> None:
    cfg = replace(UpstreamConfig(name="u", base_url="http://h:1/serve/v1"), health_path="/ping")
    client = UpstreamClient(cfg)
    targets: list[str] = []

    async def probe(target: str, wait: float) -> int:
        targets.append(target)
        return 200

    await client.start()
    try:
        client.members.pools[0].probe = probe  # type: ignore[method-assign]
        assert await client.members.probe(client.replicas.all[0]) == "ok"
        assert targets == ["/serve/ping"]
    finally:
        await client.close()


async def test_probes_stop_when_the_gateway_drains() -> None:
    cfg = replace(UpstreamConfig(name="u", base_url="http://h:1/v1"), health_interval=0.01)
    client = UpstreamClient(cfg)
    rounds: list[int] = []
    draining = [False]

    async def probe_all() -> None:
        rounds.append(1)
        if len(rounds) == 3:
            draining[0] = True

    client.members.probe_all = probe_all  # type: ignore[method-assign]
    async with asyncio.timeout(5):
        await fleet.maintain(client, lambda: draining[0])  # returns: nothing else to run
    assert len(rounds) == 3


class _Head:
    """A 200 head whose body is one chunk, then its end."""

    status = 200
    at_eof = False

    def __init__(self) -> None:
        self._left = [b"data: {}\n\n"]
        self.cut = False  # the connection is lost after the first chunk

    def progress(self) -> None:
        pass

    async def readany(self) -> bytes:
        if not self._left and self.cut:
            raise BrokenResponse("connection lost in the reply's body", cause="reset")
        return self._left.pop() if self._left else b""

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Pool:
    async def request(self, *args: Any, **kwargs: Any) -> _Head:
        return _Head()

    async def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("ends", "failures", "state"),
    [
        ("whole", 0, "healthy"),  # read to its end: back in
        ("cut", 2, "ejected"),  # its head came, its body was cut: out again, for twice as long
        ("abandoned", 2, "ejected"),  # a continuation went elsewhere (the same)
        ("lost_caught", 2, "ejected"),  # its connection lost, the error handled by the reader
        ("client_left", 1, "trial"),  # nothing learnt: the next request is its trial
    ],
)
async def test_a_trial_is_judged_by_its_whole_reply(ends: str, failures: int, state: str) -> None:
    """A replica that answers heads and cuts every body was back in at each head: its
    back-off never grew past the first second (one cut stream, continued, every second)."""
    cfg = UpstreamConfig(
        name="u",
        base_url="http://a.test:1/v1",
        base_urls=("http://a.test:1/v1", "http://b.test:1/v1"),
    )
    client = UpstreamClient(cfg)
    await client.start()
    clock = Clock()
    reps = client.replicas
    reps._clock = clock
    client.members.pools = {r.index: _Pool() for r in reps.all}  # type: ignore[misc]
    key = next(k for k in (f"s{n}" for n in range(100)) if reps.order(k.encode())[0].index == 0)
    a = reps.all[0]
    reps.failed(a)  # its first cut: out for a second
    clock.now += 1.0  # due for its trial
    up = await client.request("/chat/completions", b"{}", stream=True, session=key)
    assert a.trial and up._replica is a
    try:
        async with up:
            if ends == "whole":
                async for _ in up.chunks():
                    pass
            elif ends == "cut":
                raise errors.UpstreamUnavailable()
            elif ends == "abandoned":
                up.abandon()
            elif ends == "lost_caught":
                up._resp.cut = True  # type: ignore[attr-defined]
                with pytest.raises(errors.UpstreamError):
                    async for _ in up.chunks():
                        pass
            else:
                raise asyncio.CancelledError
    except (errors.UpstreamUnavailable, asyncio.CancelledError):
        pass
    assert (a.failures, a.state(clock.now), a.trial, a.in_flight) == (failures, state, False, 0)
    if state == "ejected":
        assert a.ejected_until == clock.now + 2.0
    await client.close()
