"""Replica choice (rendezvous hashing with bounded load) and passive health, without I/O."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.messages.session_key import session_key
from gateway.upstream.replicas import (
    BACKOFF_MAX,
    Replicas,
    backoff,
    overloaded,
    rendezvous,
)

URLS = ["http://a:8000/v1", "http://b:8000/v1", "http://c:8000/v1"]
KEYS = [f"session-{i}".encode() for i in range(600)]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_rendezvous_is_stable_and_spreads_sessions() -> None:
    first = {k: rendezvous(k, URLS)[0] for k in KEYS}
    assert first == {k: rendezvous(k, list(URLS))[0] for k in KEYS}  # same in every process
    shares = [sum(1 for v in first.values() if v == i) / len(KEYS) for i in range(3)]
    assert all(s > 0.25 for s in shares), shares


def test_losing_a_replica_moves_only_its_sessions() -> None:
    before = {k: URLS[rendezvous(k, URLS)[0]] for k in KEYS}
    rest = [URLS[0], URLS[2]]
    after = {k: rest[rendezvous(k, rest)[0]] for k in KEYS}
    moved = {k for k in KEYS if before[k] != after[k]}
    assert moved == {k for k in KEYS if before[k] == URLS[1]}
    # and an ejected replica's sessions go to their own second choice
    clock = Clock()
    reps = Replicas(URLS, clock=clock)
    reps.failed(reps.all[1])
    for k in KEYS:
        chosen = reps.order(k)[0].base_url
        assert chosen == (before[k] if before[k] != URLS[1] else after[k])


def test_order_without_a_key_is_least_busy_first() -> None:
    reps = Replicas(URLS)
    reps.started(reps.all[0])
    reps.started(reps.all[2])
    assert reps.order(None)[0] is reps.all[1]


def test_a_replica_far_above_the_average_spills_to_the_next_choice() -> None:
    assert not overloaded(4, 6, 3)  # 4 <= 1.5 * 2 + 2
    assert overloaded(7, 9, 3)  # 7 > 1.5 * 3 + 2
    reps = Replicas(URLS)
    key = KEYS[0]
    best, second = reps.order(key)[:2]
    for _ in range(8):
        reps.started(best)
    assert reps.order(key)[0] is second
    assert reps.order(key)[-1] is best  # still tried, last
    for _ in range(8):
        reps.finished(best)
    assert reps.order(key)[0] is best  # the spill lasts only while it is that far above


def test_ejection_backs_off_doubling_to_a_cap_then_one_trial() -> None:
    assert [backoff(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff(30) == BACKOFF_MAX == 60.0
    clock = Clock()
    health: list[tuple[int, bool]] = []
    reps = Replicas(URLS, clock=clock, on_health=lambda r, ok: health.append((r.index, ok)))
    a = reps.all[0]
    reps.failed(a)
    assert a.state(clock.now) == "ejected" and health == [(0, False)]
    assert a not in reps.order(None)[:2]
    clock.now += 1.0
    assert a.state(clock.now) == "trial"
    assert a in reps.order(None)[:3] and reps.order(None)[0] is a  # idle and due a trial
    reps.started(a)  # the trial request
    assert a.trial and a not in reps.order(None)[:2]  # one trial at a time
    reps.finished(a)
    reps.failed(a)  # the trial failed: twice as long
    assert a.ejected_until == clock.now + 2.0
    clock.now += 2.0
    reps.started(a)
    reps.succeeded(a)
    reps.finished(a)
    assert a.state(clock.now) == "healthy" and a.failures == 0
    assert health == [(0, False), (0, True)]


def test_with_every_replica_out_the_soonest_back_goes_first() -> None:
    clock = Clock()
    reps = Replicas(URLS, clock=clock)
    for r, n in zip(reps.all, (3, 1, 2), strict=True):
        for _ in range(n):
            reps.failed(r)
    assert [r.index for r in reps.order(KEYS[0])] == [1, 2, 0]


def test_a_lone_replica_is_never_ejected() -> None:
    reps = Replicas(URLS[:1])
    reps.failed(reps.all[0])
    assert reps.all[0].failures == 0 and reps.attempts == 1


def test_the_session_key_is_the_header_else_user_id_else_the_stable_prefix() -> None:
    turn1 = {"system": "be brief", "messages": [{"role": "user", "content": "hi"}]}
    turn2 = {
        "system": "be brief",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"},
        ],
    }
    other = {"system": "be brief", "messages": [{"role": "user", "content": "bye"}]}
    assert session_key("abc", turn1) == "h:abc"
    assert session_key(None, {**turn1, "metadata": {"user_id": "u1"}}) == "u:u1"
    assert session_key(None, turn1) == session_key(None, turn2) != session_key(None, other)


def test_the_pass_through_session_key_is_the_header_else_user_else_the_chat_prefix() -> None:
    from gateway.openai.session_scan import session_key as openai_key

    turn1 = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}]}
    turn2 = {
        "messages": [
            *turn1["messages"],
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ]
    }
    assert openai_key("x", turn1) == "h:x"
    assert openai_key(None, {**turn1, "user": "u"}) == "u:u"
    assert openai_key(None, turn1) == openai_key(None, turn2) is not None
    assert openai_key(None, {"input": "embed me"}) is None  # the least busy replica


def test_balance_settings_are_the_configs() -> None:
    from gateway.ops.config import BALANCE as IN_CONFIG
    from gateway.upstream.replicas import BALANCE

    assert BALANCE == IN_CONFIG  # config.py cannot import replicas.py (layers): kept equal here
    with pytest.raises(ValueError, match="balance"):
        Replicas(URLS, balance="random")


def test_round_robin_takes_the_replicas_in_turn_whatever_the_session() -> None:
    reps = Replicas(URLS, balance="round_robin")
    firsts = [reps.order(KEYS[0])[0].index for _ in range(6)]
    assert firsts == [0, 1, 2, 0, 1, 2]  # one session, every replica in turn
    assert [r.index for r in reps.order(None)] == [0, 1, 2]  # the rest follow in turn
    affinity = Replicas(URLS)
    assert len({affinity.order(KEYS[0])[0].index for _ in range(6)}) == 1


def test_least_busy_ignores_the_session() -> None:
    reps = Replicas(URLS, balance="least_busy")
    for replica, busy in zip(reps.all, (2, 0, 1), strict=True):
        for _ in range(busy):
            reps.started(replica)
    assert [r.index for r in reps.order(KEYS[0])] == [1, 2, 0]
    assert [r.index for r in reps.order(KEYS[1])] == [1, 2, 0]


@pytest.mark.parametrize("balance", ["affinity", "round_robin", "least_busy"])
def test_every_policy_passes_over_an_ejected_replica(balance: str) -> None:
    reps = Replicas(URLS, balance=balance, clock=Clock())
    reps.failed(reps.all[1])
    for key in KEYS[:20]:
        order = reps.order(key)
        assert order[0] is not reps.all[1] and order[-1] is reps.all[1]


class _HashLog:
    """hashlib.blake2b that records the bytes each hash was fed."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.fed: list[int] = []

    def __call__(self, data: bytes = b"", **kwargs: Any) -> Any:
        self.fed.append(len(data))
        log, h = self, self.real(data, **kwargs)

        class _Logged:
            def update(self, more: bytes) -> None:
                log.fed.append(len(more))
                h.update(more)

            def digest(self) -> bytes:
                return bytes(h.digest())

        return _Logged()


@pytest.mark.parametrize(
    ("key_len", "replicas", "as_bytes"),
    [
        (10, 3, False),
        (10, 64, False),
        (1_000_000, 3, False),
        (1_000_000, 64, False),
        (10_000_000, 64, False),
        (1_000_000, 64, True),
    ],
)
def test_a_session_key_is_hashed_once_whatever_its_length_and_the_fleet(
    monkeypatch: pytest.MonkeyPatch, key_len: int, replicas: int, as_bytes: bool
) -> None:
    """A long ``metadata.user_id`` was hashed in full once per replica, on the loop."""
    import hashlib

    from gateway.upstream import replicas as module

    log = _HashLog(hashlib.blake2b)
    monkeypatch.setattr(module.hashlib, "blake2b", log)
    reps = Replicas([f"http://r{n}:8000/v1" for n in range(replicas)])
    key = session_key(None, {"metadata": {"user_id": "u" * key_len}, "messages": []})
    reps.order(key.encode() if as_bytes else key)
    assert max(log.fed) <= 4096  # no hash sees the whole of a long key
    assert sum(log.fed) <= 4096 + 64 * replicas  # a bounded digest, then a little per replica


@pytest.mark.parametrize(
    "header",
    [
        "caf\udce9",  # latin-1 bytes, as aiohttp decodes them (surrogate escapes)
        "\udcff\udcfe\udc80abc",  # no text at all
        "\ud800",  # a lone surrogate of any kind
        "é",
        "plain",
    ],
)
def test_any_session_header_is_a_key(header: str) -> None:
    """A session header that is not UTF-8 was a 500 (its key could not be encoded)."""
    for balance in ("affinity", "round_robin", "least_busy"):
        reps = Replicas(URLS, balance=balance)
        key = session_key(header, {"messages": []})
        assert len(reps.order(key)) == 3
    affinity = Replicas(URLS)
    assert len({affinity.order(session_key(header, {}))[0].index for _ in range(5)}) == 1
    assert rendezvous(session_key(header, {}), URLS) == rendezvous(
        session_key(header, {}), list(URLS)
    )
    # the bytes of a key are the key (every process, and the tests' predictions, agree)
    raw = session_key(header, {}).encode("utf-8", "surrogatepass")
    assert rendezvous(raw, URLS) == rendezvous(session_key(header, {}), URLS)


@pytest.mark.parametrize(
    ("replicas", "balance", "keyed"),
    [
        (1, "affinity", False),
        (3, "affinity", True),
        (3, "least_busy", False),
        (3, "round_robin", False),
    ],
)
def test_a_session_key_is_asked_for_only_where_the_order_reads_it(
    replicas: int, balance: str, keyed: bool
) -> None:
    """Callers make the key (a prompt prefix's hash) only when ``keyed``: elsewhere every
    key gives the order no key gives."""
    keys = [None, *KEYS[:20]]
    made = [Replicas(URLS[:replicas], balance=balance) for _ in keys]
    for reps in made:  # some load, so least_busy has an order of its own
        reps.all[-1].in_flight = 2
    orders = [[r.index for r in reps.order(key)] for reps, key in zip(made, keys, strict=True)]
    assert made[0].keyed is keyed
    assert (len({tuple(o) for o in orders}) > 1) is keyed
