"""What ejects a replica and what brings it back, through the upstream client's request path
with scripted pools (no sockets) and a scripted clock.

* A passing health probe says the server is up, not that it answers: a replica that failed
  real requests comes back only through a real trial request, however often its probe
  passes (issue #31: probes kept such a replica in rotation, one failed request per round).
* A failure the request can cause (a 5xx, a timeout) is weak evidence: the same request
  failing on a second replica is the request's fault (neither stays out), and requests eject
  at most half the fleet at once (one client cannot empty it); a replica failing everyone's
  requests is still ejected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from gateway import errors
from gateway.ops.config import UpstreamConfig
from gateway.upstream.client import UpstreamClient
from gateway.upstream.replicas import Replica

URLS = ("http://a.test:1/v1", "http://b.test:1/v1", "http://c.test:1/v1")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Reply:
    """A reply head with ``status``; a 2xx's body is one event then its end."""

    at_eof = False

    def __init__(self, status: int) -> None:
        self.status = status
        self._left = [b"data: {}\n\n"]

    def progress(self) -> None:
        pass

    async def readany(self) -> bytes:
        return self._left.pop() if self._left else b""

    async def read(self, cap: int | None = None) -> bytes:
        return b'{"error": {"message": "engine error"}}'

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


# (replica index, request body) -> the status that replica answers
Script = Callable[[int, bytes], int]


class _Engine:
    """One replica's pool: its health route answers 200, requests as ``script`` says."""

    def __init__(self, index: int, script: Script) -> None:
        self.index = index
        self.script = script
        self.seen: list[bytes] = []

    async def request(self, method: str, target: str, data: bytes | None, **kwargs: Any) -> _Reply:
        self.seen.append(data or b"")
        return _Reply(self.script(self.index, data or b""))

    async def probe(self, target: str, wait: float) -> int:
        return 200

    async def close(self) -> None:
        pass


async def _client(script: Script, **keys: Any) -> tuple[UpstreamClient, Clock, list[_Engine]]:
    cfg = replace(UpstreamConfig(name="u", base_url=URLS[0]), base_urls=URLS, **keys)
    client = UpstreamClient(cfg)
    await client.start()
    clock = Clock()
    client.replicas._clock = clock
    engines = [_Engine(r.index, script) for r in client.replicas.all]
    client.members.pools = {e.index: e for e in engines}  # type: ignore[misc]
    if client.cfg.health_interval:  # start's round probed the real (closed) ports
        await client.members.probe_all()
    assert not any(r.failures for r in client.replicas.all)
    return client, clock, engines


async def _send(client: UpstreamClient, body: bytes, session: str) -> bool:
    """One request, its reply read whole; -> whether it succeeded."""
    try:
        up = await client.request("/chat/completions", body, stream=True, session=session)
    except errors.UpstreamError:
        return False
    async with up:
        async for _ in up.chunks():
            pass
    return True


def _ejected(replicas: list[Replica]) -> int:
    return sum(1 for r in replicas if r.failures)


# ---------------------------------------------------------------- probes vs. requests


async def _client_errors(probes: bool, seconds: int = 600) -> tuple[int, Replica]:
    """``seconds`` of traffic (4 new sessions a second) with replica 0 answering its health
    route but failing every request with a 500 (not retried: each is a client error), with
    or without a passing probe of every replica every 5 s; -> (client errors, replica 0)."""
    client, clock, _ = await _client(
        lambda index, body: 500 if index == 0 else 200, health_interval=5.0 if probes else 0.0
    )
    errors_seen = 0
    for step in range(seconds * 4):
        clock.now = 100.0 + step / 4
        if probes and step % 20 == 0:
            await client.members.probe_all()
        errors_seen += not await _send(client, b'{"n": %d}' % step, f"s{step}")
    await client.close()
    return errors_seen, client.replicas.all[0]


async def test_a_passing_probe_does_not_bring_back_a_replica_failing_requests() -> None:
    without, _ = await _client_errors(probes=False)
    with_probes, bad = await _client_errors(probes=True)
    # its back-off grows as it would without probes: 1, 2, 4 ... 60 s (about 16 failures
    # in 10 minutes), not one trial per probe round (120)
    assert with_probes <= without + 1, (with_probes, without)
    assert without < 25
    assert bad.failures > 5  # still out, its back-off grown


# (how it went out, the probe) -> (back in at once, failures after)
@pytest.mark.parametrize(
    ("cause", "probe_ok", "back", "failures"),
    [
        ("probe", True, True, 0),  # its probe put it out, its probe brings it back
        ("connect", True, True, 0),  # refused connections: the server is up again
        ("request", True, False, 3),  # failed real requests: only a real trial brings it back
        ("request", False, False, 4),  # a failing probe on top: out for longer
    ],
)
async def test_a_probe_overrides_only_the_evidence_of_probes_and_connections(
    cause: str, probe_ok: bool, back: bool, failures: int
) -> None:
    client, clock, _ = await _client(lambda index, body: 200, health_interval=5.0)
    r = client.replicas.all[0]
    for _ in range(3 if cause != "probe" else 1):
        if cause == "probe":
            client.replicas.probed(r, False, 7.0)
        else:
            client.replicas.failed(r, cause)
    if not probe_ok:
        client.members.pools[r.index].probe = _failing_probe  # type: ignore[method-assign]
    await client.members.probe(r)
    assert (r.failures == 0) is back and r.failures == (0 if back else failures)
    assert (r.state(clock.now) == "healthy") is back
    await client.close()


async def _failing_probe(target: str, wait: float) -> int:
    return 503


# ---------------------------------------------------------------- poison requests


def _poison(status: int) -> Script:
    """Every replica answers ``status`` to a body holding b"poison", 200 to the rest."""
    return lambda index, body: status if b"poison" in body else 200


# (what the engines do, the requests sent) -> (replicas out after, requests the engines saw)
@pytest.mark.parametrize(
    ("script", "bodies", "out", "sent"),
    [
        # a 500 is not retried: the client sends it again, it fails on the second replica
        (_poison(500), [b"poison"] * 2, 0, 2),
        (_poison(500), [b"poison"] * 5, 0, 5),
        # a 502 is retried on the next replica within the request: it stops at the second
        (_poison(502), [b"poison"], 0, 2),
        (_poison(504), [b"poison"] * 3, 0, 4),  # then known: tried on one replica each time
        # distinct poisons, each failing once: at most half the fleet (one of three) goes out
        (_poison(500), [b"poison %d" % n for n in range(6)], 1, 6),
        (_poison(502), [b"poison %d" % n for n in range(6)], 0, 12),  # each judged at once
        # a broken replica fails everyone's distinct requests: it is ejected all the same
        (lambda index, body: 500 if index == 1 else 200, [b"r%d" % n for n in range(30)], 1, 0),
    ],
)
async def test_a_request_the_engines_fail_does_not_empty_the_fleet(
    script: Script, bodies: list[bytes], out: int, sent: int
) -> None:
    client, _, engines = await _client(script)
    for n, body in enumerate(bodies):
        await _send(client, body, f"session-{n}")
    assert _ejected(client.replicas.all) == out
    if sent:
        assert sum(len(e.seen) for e in engines) == sent
    else:  # the broken one: ejected for failing requests, the others healthy
        assert client.replicas.all[1].failures and _ejected(client.replicas.all) == 1
    await client.close()


async def test_a_replica_failing_requests_after_a_poison_is_still_ejected() -> None:
    """The poison judged, replica 0 then fails a request of its own: out."""
    client, _, _ = await _client(
        lambda index, body: 500 if b"poison" in body or (index == 0 and b"late" in body) else 200
    )
    for n in range(2):
        await _send(client, b"poison", f"p{n}")
    assert _ejected(client.replicas.all) == 0
    r0 = client.replicas.all[0]
    key = next(f"k{n}" for n in range(200) if client.replicas.order(f"k{n}".encode())[0] is r0)
    assert not await _send(client, b"late", key)
    assert r0.failures == 1
    await client.close()


@pytest.mark.parametrize("status", [503, 529])
async def test_two_busy_replicas_do_not_make_a_request_a_poison(status: int) -> None:
    """A 503 or 529 is the replica saying it is busy, never the request's fault: with two of
    three replicas busy, every request still reaches the third (a second 503 judged the
    request a poison and stopped it short of the replica that would answer)."""
    client, clock, engines = await _client(lambda index, body: status if index else 200)
    results = []
    for n in range(60):  # a request every 2 s: the busy ones come back for their trials
        clock.now += 2.0
        results.append(await _send(client, b"r%d" % n, f"s{n}"))
    assert all(results)
    assert len(engines[0].seen) == 60
    await client.close()
