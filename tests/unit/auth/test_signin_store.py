"""The sign-in's tables (gateway/auth/signin_store.py) and the bearer check
(gateway/auth/service.py) on a real SQLite file and a real PostgreSQL database: the device
grant's protocol answers at given times, single use, the cap on pending codes, refresh
rotation and reuse, revocation, and what a bearer check costs (database reads counted)."""

from __future__ import annotations

import dataclasses
import itertools
import os
import tomllib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.auth import codes
from gateway.auth.service import SignIn, TokenRefused
from gateway.auth.signin_store import GRANT_GRACE, AuthStore, Issued
from gateway.ops import config
from gateway.ops.config_schema import AuthConfig
from gateway.tenancy.clients import Tenants
from tests.config_cases import GOOD

T0 = 1_800_000_000.0
USER = "BCDFGHJK"
DEVICE = codes.digest("device-code-1")


_DBS = itertools.count()


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AuthStore]:
    """The store on a SQLite file, and on a throwaway PostgreSQL database (replicas)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'auth.sqlite3'}"
    else:
        server = request.getfixturevalue("pg_server")
        url = server.create_db(f"auth_{os.getpid()}_{next(_DBS)}")
    s = AuthStore.open(url)
    yield s
    await s.close()


def _issued(session: str = "sess") -> tuple[Issued, str, str]:
    access, refresh = codes.new_access_token(), codes.new_refresh_token()
    return (
        Issued(codes.digest(access), T0 + 3600, codes.digest(refresh), T0 + 86400, session),
        access,
        refresh,
    )


async def _grant(store: AuthStore, interval: int = 5, **kw: Any) -> str:
    args: dict[str, Any] = {
        "device_digest": DEVICE,
        "user_code": USER,
        "now": T0,
        "expires_at": T0 + 600,
        "interval": interval,
        "surface": "claude_code",
        "max_pending": 10,
    }
    return await store.new_grant(**{**args, **kw})


# (case, approved?, polls as seconds after T0 -> expected answer of the last poll)
POLLS: list[tuple[str, bool, list[float], str]] = [
    ("first poll, not approved", False, [5], "authorization_pending"),
    ("on time twice", False, [5, 10], "authorization_pending"),
    ("a little early still counts (1 s of slack)", False, [5, 9.5], "authorization_pending"),
    ("too soon", False, [5, 6], "slow_down"),
    ("after a slow_down the interval is 10 s", False, [5, 6, 12], "slow_down"),
    ("after a slow_down, 10 s later", False, [5, 6, 16], "authorization_pending"),
    ("expired", False, [600], "expired_token"),
    ("expired though approved", True, [600], "expired_token"),
    ("approved", True, [5], "ok"),
]


@pytest.mark.parametrize(("case", "approved", "polls", "last"), POLLS, ids=[p[0] for p in POLLS])
async def test_device_code_polls(
    store: AuthStore, case: str, approved: bool, polls: list[float], last: str
) -> None:
    assert await _grant(store) == "ok"
    if approved:
        assert await store.approve(USER, "alice", T0 + 1)
    outcome = None
    for t in polls:
        outcome, client = await store.exchange_device_code(DEVICE, T0 + t, _issued()[0])
    assert outcome == last
    if last == "ok":
        assert client == "alice"


async def test_a_device_code_is_exchanged_once(store: AuthStore) -> None:
    await _grant(store)
    assert await store.approve(USER, "alice", T0 + 1)
    issued, access, _ = _issued()
    assert (await store.exchange_device_code(DEVICE, T0 + 5, issued))[0] == "ok"
    assert (await store.exchange_device_code(DEVICE, T0 + 10, _issued()[0]))[0] == "invalid_grant"
    row = await store.lookup(codes.digest(access))
    assert row is not None and (row.client, row.kind, row.revoked) == ("alice", "access", False)


@pytest.mark.parametrize(
    ("case", "code", "at"),
    [
        ("unknown code", "BBBBBBBB", T0 + 1),
        ("expired", USER, T0 + 601),
    ],
)
async def test_approval_needs_a_pending_unexpired_code(
    store: AuthStore, case: str, code: str, at: float
) -> None:
    await _grant(store)
    assert not await store.approve(code, "alice", at)


async def test_an_approved_code_cannot_be_approved_again_by_another(store: AuthStore) -> None:
    await _grant(store)
    assert await store.approve(USER, "alice", T0 + 1)
    assert not await store.approve(USER, "mallory", T0 + 2)
    assert await store.exchange_device_code(DEVICE, T0 + 5, _issued()[0]) == ("ok", "alice")


async def test_pending_codes_are_capped_and_expired_ones_purged(store: AuthStore) -> None:
    for i in range(3):
        assert (
            await _grant(
                store, device_digest=bytes([i]) * 32, user_code=f"BBBBBBB{'CDF'[i]}", max_pending=3
            )
            == "ok"
        )
    assert await _grant(store, max_pending=3) == "full"
    # once they expire (and their grace passes) there is room again
    later = T0 + 600 + GRANT_GRACE + 1
    assert await _grant(store, now=later, expires_at=later + 600, max_pending=3) == "ok"


async def test_a_user_code_in_use_is_reported(store: AuthStore) -> None:
    await _grant(store)
    assert await _grant(store, device_digest=b"x" * 32) == "taken"


async def _signed_in(store: AuthStore) -> tuple[Issued, str, str]:
    await _grant(store)
    await store.approve(USER, "alice", T0 + 1)
    issued, access, refresh = _issued()
    assert (await store.exchange_device_code(DEVICE, T0 + 5, issued))[0] == "ok"
    return issued, access, refresh


def _alive(*names: str) -> Callable[[str], bool]:
    return lambda name: name in names


async def test_refresh_rotates_and_a_reused_refresh_token_revokes_the_session(
    store: AuthStore,
) -> None:
    first, _access, refresh = await _signed_in(store)
    second, _access2, _ = _issued(session="ignored")
    client, revoked = await store.exchange_refresh_token(
        codes.digest(refresh), T0 + 100, second, _alive("alice")
    )
    assert (client, revoked) == ("alice", None)
    new = await store.lookup(second.access)
    assert new is not None and new.session == first.session  # the same sign-in
    # the spent one again: refused, and the whole sign-in revoked
    client, revoked = await store.exchange_refresh_token(
        codes.digest(refresh), T0 + 200, _issued()[0], _alive("alice")
    )
    assert (client, revoked) == (None, first.session)
    for d in (first.access, second.access, second.refresh):
        row = await store.lookup(d)
        assert row is not None and row.revoked


@pytest.mark.parametrize(
    ("case", "at", "alive", "token"),
    [
        ("expired", T0 + 86401, ("alice",), "refresh"),
        ("client removed from the config", T0 + 100, ("bob",), "refresh"),
        ("an access token is no refresh token", T0 + 100, ("alice",), "access"),
        ("unknown", T0 + 100, ("alice",), "other"),
    ],
)
async def test_refresh_refusals(
    store: AuthStore, case: str, at: float, alive: tuple[str, ...], token: str
) -> None:
    _, access, refresh = await _signed_in(store)
    presented = {"refresh": refresh, "access": access, "other": "gwrt_x"}[token]
    client, _ = await store.exchange_refresh_token(
        codes.digest(presented), at, _issued()[0], _alive(*alive)
    )
    assert client is None


async def test_revoking_either_token_revokes_the_sign_in(store: AuthStore) -> None:
    issued, _access, refresh = await _signed_in(store)
    assert await store.revoke(codes.digest(refresh)) == issued.session
    row = await store.lookup(issued.access)
    assert row is not None and row.revoked
    assert await store.revoke(codes.digest("unknown")) is None


# ---------------------------------------------------------------- the bearer check


def _tenants(*clients: str) -> Tenants:
    text = GOOD
    env = {}
    for name in clients:
        text += f'\n[[clients]]\nname = "{name}"\nkey_env = "KEY_{name.upper()}"\n'
        env[f"KEY_{name.upper()}"] = f"key-{name}"
    return Tenants(config.parse(tomllib.loads(text), "t.toml", env))


class CountingStore:
    """The store, its reads counted: what a bearer check costs."""

    def __init__(self, store: AuthStore) -> None:
        self._store = store
        self.lookups = 0

    async def lookup(self, digest: bytes) -> Any:
        self.lookups += 1
        return await self._store.lookup(digest)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def _bearer(store: AuthStore, tenants: Tenants) -> tuple[SignIn, CountingStore, bytes]:
    counting = CountingStore(store)
    signin = SignIn(AuthConfig(cache_seconds=30), counting, lambda: tenants)  # type: ignore[arg-type]
    _, access, _ = await _signed_in(store)
    return signin, counting, access.encode()


async def test_a_token_is_read_from_the_database_once_while_fresh(
    store: AuthStore, at: Callable[[float], None]
) -> None:
    tenants = _tenants("alice")
    signin, counting, access = await _bearer(store, tenants)
    at(T0)  # the test's tokens expire at T0 + 3600
    for _ in range(5):
        client = await signin.identify(access, tenants)
        assert client is not None and client.name == "alice"
    assert counting.lookups == 1


async def test_a_key_is_not_a_token_and_costs_no_read(store: AuthStore) -> None:
    tenants = _tenants("alice")
    signin, counting, _ = await _bearer(store, tenants)
    assert await signin.identify(b"key-alice", tenants) is None  # the caller's ordinary 401
    assert await signin.identify(b"gwrt_refresh-is-not-a-bearer", tenants) is None
    assert counting.lookups == 0


async def test_revocation_here_is_seen_at_once_and_elsewhere_within_the_ttl(
    store: AuthStore, at: Callable[[float], None]
) -> None:
    tenants = _tenants("alice")
    here, _, access = await _bearer(store, tenants)
    there = SignIn(AuthConfig(cache_seconds=30), store, lambda: tenants)  # another replica
    at(T0)
    for s in (here, there):
        assert await s.identify(access, tenants) is not None
    session = await store.revoke(codes.digest(access))
    assert session is not None
    here.cache.forget_session(session)  # what the revocation endpoint does
    with pytest.raises(TokenRefused):
        await here.identify(access, tenants)
    assert await there.identify(access, tenants) is not None  # its cache is still fresh
    there.cache.fresh_seconds = 0  # ... until its entry is older than cache_seconds
    with pytest.raises(TokenRefused) as refused:
        await there.identify(access, tenants)
    assert refused.value.status == 401 and refused.value.headers == {"x-should-retry": "false"}


@pytest.mark.parametrize(
    ("case", "token", "clients", "now"),
    [
        ("unknown token", b"gwat_unknown", ("alice",), T0),
        ("expired", None, ("alice",), T0 + 3600),
        ("client removed by a reload", None, ("bob",), T0),
    ],
)
async def test_tokens_refused(
    store: AuthStore,
    at: Callable[[float], None],
    case: str,
    token: bytes | None,
    clients: tuple[str, ...],
    now: float,
) -> None:
    signin, _, access = await _bearer(store, _tenants("alice"))
    at(now)
    with pytest.raises(TokenRefused):
        await signin.identify(token or access, _tenants(*clients))


@pytest.fixture
def at(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """Tokens made at T0 checked as at a given wall-clock time (what expiry reads)."""
    return lambda now: monkeypatch.setattr("gateway.auth.service.time", _Clock(now))


@dataclasses.dataclass
class _Clock:
    at: float

    def time(self) -> float:
        return self.at

    def monotonic(self) -> float:
        import time

        return time.monotonic()
