"""The counter stores' contract, one table run against LocalStore and against RedisCounters on
a real redis-server: token buckets that start full and refill limit/period a second, takes that
are all-or-nothing with needs capped at the limit, settles that may go below zero, leases with
a ttl. Time is the ``now`` each call is given, so refills are tested without sleeping.

Then what only the Redis store has: key expiry, a stamp that never moves back, a flushed
script cache, AUTH and SELECT, and its failures (a dead port, a server that stops and comes
back, hostile servers): each a CountersUnavailable within the store timeout, counted, and
never naming the URL or its password.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from gateway.ops.metrics import STORE_ERRORS, Metrics
from gateway.tenancy.clients import Client
from gateway.tenancy.counters import (
    CounterStore,
    CountersUnavailable,
    LocalStore,
    Meter,
    SlotLease,
)
from gateway.tenancy.limits import Plan, admit
from gateway.tenancy.redis_counters import PREFIX, RedisCounters
from gateway.tenancy.resp import Redis, StoreFailed, parse_url
from gateway.tenancy.store_errors import StoreErrors
from tests.procs import free_port
from tests.redis_server import RedisServer, running_redis

TIMEOUT = 0.25
# a hard bound on any one failing call: the store timeout, the connect and its set-up
BOUND = 4 * TIMEOUT + 1.0


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


_seq = iter(range(1_000_000))


@pytest.fixture(params=["local", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[CounterStore]:
    if request.param == "local":
        yield LocalStore()
        return
    server = request.getfixturevalue("redis_server")
    redis = RedisCounters(server.url, TIMEOUT)
    yield redis
    await redis.close()


M = Meter("", 3, 60.0)  # 0.05 a second: one unit per 20 s
T = Meter("", 100, 60.0)


@dataclass(frozen=True)
class Take:
    meters: tuple[Meter, ...]
    needs: tuple[int, ...]
    now: float
    ok: bool
    remaining: tuple[int, ...]
    retry_after: float | None = None  # None: not checked (0 when it passed)
    reset: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Settle:
    meters: tuple[Meter, ...]
    amounts: tuple[int, ...]
    now: float


@dataclass(frozen=True)
class Enter:
    lease: str
    now: float
    ok: bool
    limit: int = 2
    ttl: float = 10.0


@dataclass(frozen=True)
class Leave:
    lease: str


@dataclass(frozen=True)
class EnterTake:
    """A lease (``lease`` None: none) and a take at once; ``ok`` None: all leases held."""

    lease: str | None
    meters: tuple[Meter, ...]
    needs: tuple[int, ...]
    now: float
    ok: bool | None
    remaining: tuple[int, ...] = ()
    limit: int = 2


@dataclass(frozen=True)
class SettleLeave:
    meters: tuple[Meter, ...]
    amounts: tuple[int, ...]
    now: float
    lease: str | None


CASES: dict[str, list[Any]] = {
    "starts full, takes down to empty, then refuses": [
        Take((M,), (1,), 0, True, (2,), reset=(20.0,)),
        Take((M,), (1,), 0, True, (1,)),
        Take((M,), (1,), 0, True, (0,), reset=(60.0,)),
        Take((M,), (1,), 0, False, (0,), retry_after=20.0),
    ],
    "refills limit/period a second, to the limit": [
        Take((M,), (3,), 0, True, (0,)),
        Take((M,), (1,), 19.9, False, (0,), retry_after=0.1),
        Take((M,), (1,), 20, True, (0,)),
        Take((M,), (3,), 1000, True, (0,)),  # refilled to 3, not 50
        Take((M,), (1,), 1000, False, (0,), retry_after=20.0),
    ],
    "all or nothing: a refused take leaves every meter as it was": [
        Take((T,), (100,), 0, True, (0,)),
        Take((M, T), (1, 10), 0, False, (3, 0), retry_after=6.0),
        Take((M,), (3,), 0, True, (0,)),  # M was not touched by the refused take
    ],
    "the wait is the longest of the meters' waits": [
        Take((M, T), (3, 50), 0, True, (0, 50)),
        Take((M, T), (1, 100), 0, False, (0, 50), retry_after=30.0),
        Take((M, T), (1, 60), 0, False, (0, 50), retry_after=20.0),
    ],
    "a need over the limit is capped: a full meter passes it, going below zero": [
        Take((M,), (10,), 0, True, (0,), reset=(200.0,)),
        Take((M,), (1,), 0, False, (0,), retry_after=160.0),
        Take((M,), (1,), 160, True, (0,)),
    ],
    "settle takes more, below zero": [
        Take((M,), (1,), 0, True, (2,)),
        Settle((M,), (5,), 0),
        Take((M,), (1,), 0, False, (0,), retry_after=80.0, reset=(120.0,)),
        Take((M,), (1,), 80, True, (0,)),
    ],
    "settle gives back, capped at the limit": [
        Take((M,), (2,), 0, True, (1,)),
        Settle((M,), (-5,), 0),
        Take((M,), (3,), 0, True, (0,)),
        Take((M,), (1,), 0, False, (0,)),
    ],
    "settle refills first, then takes": [
        Take((M,), (3,), 0, True, (0,)),
        Settle((M,), (1,), 40),  # 0 + 2 refilled - 1
        Take((M,), (1,), 40, True, (0,)),
        Take((M,), (1,), 40, False, (0,)),
    ],
    "a settle on an unused meter starts from full": [
        Settle((T,), (30,), 5),
        Take((T,), (70,), 5, True, (0,)),
        Take((T,), (1,), 5, False, (0,)),
    ],
    "leases: at most the limit, a returned one is free again": [
        Enter("a", 0, True),
        Enter("b", 0, True),
        Enter("c", 0, False),
        Leave("a"),
        Enter("c", 0, True),
        Enter("d", 0, False),
        Leave("nobody"),
        Enter("d", 0, False),
    ],
    "leases lapse after their ttl": [
        Enter("a", 0, True, ttl=5),
        Enter("b", 0, True, ttl=10),
        Enter("c", 4.9, False),
        Enter("c", 5, True),  # a's expiry (5) has come
        Enter("d", 9, False),
        Enter("d", 10, True),  # b lapsed
    ],
    "enter_take: a concurrency refusal leaves the meters untouched": [
        EnterTake("a", (M,), (1,), 0, True, (2,), limit=1),
        EnterTake("b", (M,), (1,), 0, None, limit=1),
        Take((M,), (1,), 0, True, (1,)),  # b took nothing
        SettleLeave((), (), 0, "a"),
        EnterTake("b", (M,), (1,), 0, True, (0,), limit=1),
    ],
    "enter_take: a meter refusal holds no lease": [
        EnterTake("a", (M,), (3,), 0, True, (0,)),
        EnterTake("b", (M, T), (1, 1), 0, False, (0, 100)),
        Take((T,), (100,), 0, True, (0,)),  # T was not touched by the refusal
        Enter("c", 0, True),  # b holds nothing: one of two free
        Enter("d", 0, False),
    ],
    "enter_take without a lease is a take; with no meters, a lease": [
        EnterTake(None, (M,), (2,), 0, True, (1,)),
        EnterTake(None, (M,), (2,), 0, False, (1,)),
        EnterTake("a", (), (), 0, True, (), limit=1),
        EnterTake("b", (), (), 0, None, limit=1),
    ],
    "settle_leave settles and returns the lease": [
        EnterTake("a", (M,), (1,), 0, True, (2,), limit=1),
        SettleLeave((M,), (2,), 0, "a"),
        Take((M,), (1,), 0, False, (0,)),
        Enter("b", 0, True, limit=1),
        SettleLeave((M,), (-3,), 0, None),  # a settle alone
        Take((M,), (3,), 0, True, (0,)),
        Enter("c", 0, False, limit=1),  # b still held
    ],
    "a limit of one": [
        Enter("a", 0, True, limit=1),
        Enter("b", 0, False, limit=1),
        Leave("a"),
        Enter("b", 0, True, limit=1),
    ],
}


def _keyed(step: Any, tag: str) -> Any:
    """The step with its meters keyed for this case (Redis keeps state between cases)."""
    if isinstance(step, Take | Settle | EnterTake | SettleLeave):
        meters = tuple(Meter(f"{tag}:{m.limit}", m.limit, m.period) for m in step.meters)
        return dataclasses.replace(step, meters=meters)
    return step


@pytest.mark.parametrize("name", list(CASES))
async def test_contract(store: CounterStore, name: str) -> None:
    tag = f"case{next(_seq)}"
    for i, raw in enumerate(CASES[name]):
        step = _keyed(raw, tag)
        where = f"step {i}: {raw}"
        if isinstance(step, Take):
            got = await store.take(step.meters, step.needs, step.now)
            assert (got.ok, got.remaining) == (step.ok, step.remaining), where
            want = 0.0 if step.ok else step.retry_after
            if want is not None:
                assert got.retry_after == pytest.approx(want), where
            if step.reset is not None:
                assert got.reset == pytest.approx(step.reset), where
        elif isinstance(step, Settle):
            await store.settle(step.meters, step.amounts, step.now)
        elif isinstance(step, EnterTake):
            lease = (
                None if step.lease is None else SlotLease(f"{tag}:c", step.limit, step.lease, 10)
            )
            reading = await store.enter_take(step.meters, step.needs, step.now, lease)
            if step.ok is None:
                assert reading is None, where
            else:
                assert reading is not None, where
                assert (reading.ok, reading.remaining) == (step.ok, step.remaining), where
        elif isinstance(step, SettleLeave):
            lease = None if step.lease is None else SlotLease(f"{tag}:c", 1, step.lease, 10)
            await store.settle_leave(step.meters, step.amounts, step.now, lease)
        elif isinstance(step, Enter):
            ok = await store.enter(f"{tag}:c", step.limit, step.lease, step.now, step.ttl)
            assert ok is step.ok, where
        else:
            await store.leave(f"{tag}:c", step.lease)


async def test_both_stores_answer_alike_to_the_last_bit(redis_server: RedisServer) -> None:
    """Odd limits and periods, fractional times: the readings are equal, not just close."""
    local, redis = LocalStore(), RedisCounters(redis_server.url, TIMEOUT)
    meters = [Meter(f"bits{next(_seq)}:a", 7, 13.0), Meter(f"bits{next(_seq)}:b", 1000, 86400.0)]
    try:
        now = 1_764_000_000.123
        for i in range(40):
            now += (i % 7) * 0.731
            needs = [i % 3, (i * 37) % 400]
            got = [await s.take(meters, needs, now) for s in (local, redis)]
            assert got[0] == got[1], i
            if i % 5 == 0:
                for s in (local, redis):
                    await s.settle(meters, [1, -(i * 11)], now)
    finally:
        await redis.close()


# --- what only the Redis store has ------------------------------------------------------


async def _calls(server: RedisServer) -> int:
    """The scripts clients ran on the server (INFO commandstats' EVALSHA and EVAL: the
    commands a script runs are counted too, under their own names)."""
    text = (await _raw(server, "INFO", "commandstats")).decode()
    return sum(
        int(line.split("calls=")[1].split(",")[0])
        for line in text.splitlines()
        if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:"))
    )


@pytest.mark.parametrize("concurrency", [0, 2])
async def test_a_request_costs_two_round_trips(redis_server: RedisServer, concurrency: int) -> None:
    """Admission (lease and meters) is one script, the end (settle and lease) another: two
    commands per request, where enter, take, settle and leave were four."""
    client = Client(
        f"trips{next(_seq)}",
        max_concurrency=concurrency,
        requests_per_minute=10,
        output_tokens_per_minute=1000,
    )
    plan = Plan.of(client)
    store = RedisCounters(redis_server.url, TIMEOUT)
    try:
        await store.ping()  # connected, scripts loaded by a first request
        await (await admit(store, plan, 40, 100, lease="warm", now=0)).close(now=0)
        before = await _calls(redis_server)
        charge = await admit(store, plan, 40, 100, lease="one", now=0)
        charge.ended((10, 20))
        await charge.close(now=0)
        assert await _calls(redis_server) - before == 2
        assert await _raw(redis_server, "ZCARD", f"{PREFIX}c:{plan.client}:concurrency") == 0
    finally:
        await store.close()


async def _raw(server: RedisServer, *args: str) -> Any:
    r = Redis(parse_url(server.url), 2.0)
    try:
        return await r.call(*args)
    finally:
        await r.close()


async def test_keys_are_prefixed_and_expire_once_the_meter_would_be_full(
    redis_server: RedisServer,
) -> None:
    tag = f"ttl{next(_seq)}"
    m = Meter(f"{tag}:rpm", 60, 60.0)
    store = RedisCounters(redis_server.url, TIMEOUT)
    try:
        await store.take([m], [1], 0)
        pttl = await _raw(redis_server, "PTTL", f"{PREFIX}m:{tag}:rpm")
        assert 60_000 < pttl <= 61_000  # 1 s to full + a period
        await store.settle([m], [600], 0)  # 10 periods below zero
        pttl = await _raw(redis_server, "PTTL", f"{PREFIX}m:{tag}:rpm")
        assert 660_000 < pttl <= 662_000
        await store.enter(f"{tag}:c", 2, "a", 0, 30)
        pttl = await _raw(redis_server, "PTTL", f"{PREFIX}c:{tag}:c")
        assert 30_000 < pttl <= 31_000
        # an expired meter reads as full
        await _raw(redis_server, "DEL", f"{PREFIX}m:{tag}:rpm")
        assert (await store.take([m], [60], 0)).ok
    finally:
        await store.close()


async def test_a_clock_behind_sees_no_refill_and_does_not_grant_the_skew_twice(
    redis_server: RedisServer,
) -> None:
    m = Meter(f"skew{next(_seq)}", 3, 60.0)
    store = RedisCounters(redis_server.url, TIMEOUT)
    try:
        assert (await store.take([m], [2], 100)).ok  # a replica whose clock reads 100
        got = await store.take([m], [1], 90)  # one 10 s behind: no refill, its take passes
        assert got.ok and got.remaining == (0,)
        # refilled since 100, not since 90: half a unit at 110 (from 90 it would be one)
        assert not (await store.take([m], [1], 110)).ok
        got = await store.take([m], [1], 120)
        assert got.ok and got.remaining == (0,)
        assert not (await store.take([m], [1], 120)).ok
    finally:
        await store.close()


async def test_a_closed_store_makes_no_new_connection(redis_server: RedisServer) -> None:
    store = RedisCounters(redis_server.url, TIMEOUT)
    assert await store.ping()
    await store.close()
    with pytest.raises(CountersUnavailable):
        await store.take([Meter("closed", 3, 60.0)], [1], 0)
    assert store.redis.connects == 1


async def test_a_flushed_script_cache_is_refilled(redis_server: RedisServer) -> None:
    m = Meter(f"flush{next(_seq)}", 3, 60.0)
    store = RedisCounters(redis_server.url, TIMEOUT)
    try:
        assert (await store.take([m], [1], 0)).remaining == (2,)
        assert await _raw(redis_server, "SCRIPT", "FLUSH") == b"OK"
        assert (await store.take([m], [1], 0)).remaining == (1,)
    finally:
        await store.close()


async def test_auth_and_select() -> None:
    secret = "s3cret-pw-7"
    with running_redis(password=secret) as server:
        url = f"redis://:{secret}@127.0.0.1:{server.port}/5"
        store = RedisCounters(url, TIMEOUT)
        m = Meter(f"auth{next(_seq)}", 3, 60.0)
        try:
            assert (await store.take([m], [1], 0)).ok
        finally:
            await store.close()
        r = Redis(parse_url(url), 2.0)
        assert await r.call("EXISTS", f"{PREFIX}m:{m.key}") == 1  # in db 5
        await r.call("SELECT", "0")
        assert await r.call("EXISTS", f"{PREFIX}m:{m.key}") == 0
        await r.close()
        for bad in (
            f"redis://:wrong-{secret}@127.0.0.1:{server.port}/0",
            f"redis://127.0.0.1:{server.port}/0",  # no password: NOAUTH on the script
        ):
            store = RedisCounters(bad, TIMEOUT)
            with pytest.raises(CountersUnavailable) as got:
                await store.take([m], [1], 0)
            assert got.value.kind == "reply"  # type: ignore[attr-defined]
            assert secret not in repr(got.value) and str(server.port) not in str(got.value)
            assert secret not in repr(store.redis)
            await store.close()


async def test_rediss_verifies_the_server_against_the_trusted_cas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``rediss://``: TLS with the system's verification (here the test CA is the trusted
    one, through OpenSSL's SSL_CERT_FILE); an untrusted certificate is a connection error."""
    with running_redis(password="tls-pw", tls=True) as server:
        m = Meter(f"tls{next(_seq)}", 3, 60.0)
        store = RedisCounters(server.url, 2.0)
        with pytest.raises(StoreFailed) as got:  # the test CA is not trusted yet
            await store.take([m], [1], 0)
        assert (got.value.kind, got.value.reason) == ("connection", "TLS handshake failed")
        await store.close()
        monkeypatch.setenv("SSL_CERT_FILE", str(server.ca_file))
        store = RedisCounters(server.url, 2.0)
        try:
            assert (await store.take([m], [2], 0)).remaining == (1,)
        finally:
            await store.close()


# --- failures ------------------------------------------------------------------------


def _counted() -> tuple[CollectorRegistry, StoreErrors]:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    return registry, StoreErrors(metrics.limits_store_errors, "closed")


def _errors(registry: CollectorRegistry) -> dict[str, float]:
    name = "llm_gateway_limits_store_errors_total"
    return {k: registry.get_sample_value(name, {"kind": k}) or 0.0 for k in STORE_ERRORS}


async def test_a_dead_port_fails_fast_with_one_connect_per_backoff() -> None:
    port = free_port()  # nothing listens
    password = "dead-port-secret"
    registry, errors = _counted()
    store = RedisCounters(f"redis://:{password}@127.0.0.1:{port}/0", TIMEOUT, errors)
    m = Meter("dead", 3, 60.0)
    with capture_logs() as logs:
        got = await asyncio.wait_for(
            asyncio.gather(*(store.take([m], [1], 0) for _ in range(50)), return_exceptions=True),
            BOUND,
        )
        assert all(isinstance(g, CountersUnavailable) for g in got)
        assert store.redis.connects == 1  # 50 calls, one connect attempt
        got = await asyncio.gather(
            *(store.settle([m], [1], 0) for _ in range(20)), return_exceptions=True
        )
        assert all(isinstance(g, CountersUnavailable) for g in got)
        assert store.redis.connects == 1  # still inside the backoff: no new attempt
    await store.close()
    assert _errors(registry) == {"connection": 70, "timeout": 0, "protocol": 0, "reply": 0}
    lines = [e for e in logs if e["event"] == "limits_store_error"]
    assert len(lines) == 1  # once a second at most
    assert lines[0]["reason"] == "ECONNREFUSED" and lines[0]["on_store_error"] == "closed"
    text = repr(logs) + "".join(repr(g) for g in got)
    assert password not in text and str(port) not in text


async def test_a_server_that_stops_mid_run_fails_then_recovers() -> None:
    with running_redis() as server:
        registry, errors = _counted()
        store = RedisCounters(server.url, TIMEOUT, errors)
        m = Meter(f"stop{next(_seq)}", 1000, 60.0)
        try:
            assert (await store.take([m], [1], 0)).ok
            server.stop()
            with pytest.raises(CountersUnavailable):
                await asyncio.wait_for(store.take([m], [1], 0), BOUND)
            with pytest.raises(CountersUnavailable):
                await asyncio.wait_for(store.enter("stop:c", 2, "a", 0, 5), BOUND)
            server.start()
            # back: within a few backoffs (at most 2 s each) a call passes again; state was
            # lost with the server (no persistence), so the meter reads full
            deadline = time.monotonic() + 10
            while True:
                try:
                    got = await asyncio.wait_for(store.take([m], [1], 0), BOUND)
                    break
                except CountersUnavailable:
                    assert time.monotonic() < deadline, "no recovery"
                    await asyncio.sleep(0.05)
            assert got.ok and got.remaining == (999,)
            assert store.redis.connects <= 2 + 10 / 0.1  # bounded by the backoff
        finally:
            await store.close()
        assert _errors(registry)["connection"] >= 2


async def _hostile(behaviour: str) -> tuple[asyncio.Server, int, list[asyncio.Event]]:
    """A server that reads a request and answers with ``behaviour``; an event per connection,
    set when the connection ended (an endless writer ends when the client goes)."""
    ended: list[asyncio.Event] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ended.append(asyncio.Event())
        try:
            await reader.read(1024)
            chunk = b"x" * 65536
            if behaviour == "endless bulk":
                writer.write(b"$10000000000\r\n")
            elif behaviour == "stalled bulk":
                writer.write(b"$16000\r\n" + b"x" * 100)
                await writer.drain()
                await asyncio.sleep(30)
            elif behaviour == "endless line":
                writer.write(b"+")
            elif behaviour == "garbage":
                writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                await writer.drain()
                await asyncio.sleep(30)
            elif behaviour == "silence":
                await asyncio.sleep(30)
            elif behaviour == "deep array":
                writer.write(b"*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n")
                await asyncio.sleep(30)
            elif behaviour == "unasked replies":
                writer.write(b":1\r\n" * 10)
                await asyncio.sleep(30)
            elif behaviour == "error reply":
                writer.write(b"-ERR something 127.0.0.1 secret\r\n")
                await asyncio.sleep(30)
            while behaviour in ("endless bulk", "endless line"):
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            ended[-1].set()
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], ended


HOSTILE = [
    ("endless bulk", "protocol"),
    ("endless line", "protocol"),
    ("stalled bulk", "timeout"),
    ("garbage", "protocol"),
    ("deep array", "protocol"),
    ("unasked replies", "protocol"),
    ("silence", "timeout"),
    ("error reply", "reply"),
]


@pytest.mark.parametrize(("behaviour", "kind"), HOSTILE)
async def test_a_hostile_server_is_a_bounded_failure(behaviour: str, kind: str) -> None:
    server, port, ended = await _hostile(behaviour)
    registry, errors = _counted()
    store = RedisCounters(f"redis://127.0.0.1:{port}/0", TIMEOUT, errors)
    m = Meter("hostile", 3, 60.0)
    try:
        with capture_logs() as logs:
            with pytest.raises(StoreFailed) as got:
                await asyncio.wait_for(store.take([m], [1], 0), BOUND)
        assert got.value.kind == kind
        assert _errors(registry)[kind] == 1
        assert "secret" not in repr(logs) and str(port) not in repr(logs)
        assert len(ended) == 1  # one connection: no reconnect loop
        if behaviour.startswith("endless"):
            # the client dropped the connection: the endless writer meets its end
            await asyncio.wait_for(ended[0].wait(), BOUND)
    finally:
        await store.close()
        server.close()
        await server.wait_closed()


def test_the_url_is_read_without_echoing_it() -> None:
    t = parse_url("rediss://user:p%40ss@redis.example:6380/2")
    assert (t.host, t.port, t.tls, t.username, t.password, t.db) == (
        "redis.example",
        6380,
        True,
        "user",
        "p@ss",
        2,
    )
    assert parse_url("redis://lonepass@h").password == "lonepass"
    assert parse_url("unix://:pw@/run/redis.sock?db=3").path == "/run/redis.sock"
    assert "p@ss" not in repr(t)
    for bad in ("redis://:pw@h:99999/0", "redis://:pw@h/notadb", "http://:pw@h/0"):
        with pytest.raises(ValueError) as got:
            parse_url(bad)
        assert "pw" not in str(got.value)


# --- the same on uvloop, which the gateway runs (its transports are not asyncio's classes) --


def _on_uvloop(make: Callable[[], Coroutine[Any, Any, None]]) -> None:
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(make())


@pytest.mark.parametrize("name", list(CASES))
def test_contract_on_uvloop(redis_server: RedisServer, name: str) -> None:
    async def run() -> None:
        store = RedisCounters(redis_server.url, TIMEOUT)
        try:
            await test_contract(store, name)
        finally:
            await store.close()

    _on_uvloop(run)


def test_failures_on_uvloop() -> None:
    _on_uvloop(test_a_dead_port_fails_fast_with_one_connect_per_backoff)
    for behaviour, kind in HOSTILE:
        _on_uvloop(lambda b=behaviour, k=kind: test_a_hostile_server_is_a_bounded_failure(b, k))
