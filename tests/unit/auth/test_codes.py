"""User codes, device codes and tokens (gateway/auth/codes.py), the page throttle and the
token cache."""

from __future__ import annotations

import pytest

from gateway.auth import codes
from gateway.auth.cache import TokenCache, TokenEntry
from gateway.auth.throttle import WINDOW, Throttle


def test_a_user_code_is_8_letters_of_the_base20_alphabet() -> None:
    assert len(codes.USER_CODE_ALPHABET) == 20
    assert not set("AEIOUY0123456789") & set(codes.USER_CODE_ALPHABET)
    drawn = {codes.new_user_code() for _ in range(200)}
    assert len(drawn) == 200  # 2.6e10 codes: no repeat in 200
    for code in drawn:
        assert len(code) == 8 and set(code) <= set(codes.USER_CODE_ALPHABET)
        assert codes.normalise_user_code(codes.shown(code)) == code


@pytest.mark.parametrize(
    ("typed", "stored"),
    [
        ("BCDF-GHJK", "BCDFGHJK"),
        ("bcdf-ghjk", "BCDFGHJK"),
        (" bcdf ghjk ", "BCDFGHJK"),
        ("BCDFGHJK", "BCDFGHJK"),
        ("BCDF-GHJ", None),  # too short
        ("BCDF-GHJKL", None),  # too long
        ("BCDF-GHJA", None),  # a vowel: not of the alphabet
        ("BCDF-GHJ1", None),
        ("", None),
        ("B" * 100, None),
        ('"><script>', None),
    ],
)
def test_typed_codes_are_normalised(typed: str, stored: str | None) -> None:
    assert codes.normalise_user_code(typed) == stored


def test_secrets_are_long_random_and_prefixed() -> None:
    device = {codes.new_device_code() for _ in range(50)}
    assert len(device) == 50 and all(len(d) >= 43 for d in device)  # 256 bits, base64url
    access, refresh = codes.new_access_token(), codes.new_refresh_token()
    assert access.startswith("gwat_") and refresh.startswith("gwrt_")
    assert codes.is_access_token(access.encode()) and not codes.is_access_token(refresh.encode())
    assert not codes.is_access_token(b"some-client-key")
    assert codes.digest(access) == codes.digest(access.encode()) != codes.digest(refresh)
    assert len(codes.digest(access)) == 32


def test_the_throttle_allows_limit_tries_a_minute_per_address() -> None:
    t = Throttle(limit=3)
    assert [t.allow("a", 100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = t.allow("a", 110.0)
    assert wait == pytest.approx(WINDOW - 10)  # refused until the window ends
    assert t.allow("b", 110.0) == 0.0  # another address: its own count
    assert t.allow("a", 100.0 + WINDOW) == 0.0  # a new window


def test_the_throttle_keeps_a_bounded_number_of_addresses() -> None:
    t = Throttle(limit=1, max_addresses=100)
    for i in range(1000):
        t.allow(f"10.0.{i // 256}.{i % 256}", 0.0)
    assert len(t._windows) == 100


def _entry(session: str = "s", checked: float = 0.0, expires: float = 1e12) -> TokenEntry:
    return TokenEntry("alice", session, expires, checked)


def test_the_cache_answers_while_fresh_then_asks_again() -> None:
    c = TokenCache(fresh_seconds=30)
    c.put(b"d", _entry(checked=100.0))
    assert c.get(b"d", 129.0) is not None
    assert c.get(b"d", 130.0) is None  # stale: the database is asked again
    assert c.get(b"d", 100.0) is None  # and the stale entry is gone


def test_the_cache_forgets_a_revoked_session_at_once() -> None:
    c = TokenCache(fresh_seconds=30)
    c.put(b"a1", _entry("s1"))
    c.put(b"a2", _entry("s1"))
    c.put(b"b1", _entry("s2"))
    assert c.forget_session("s1") == 2
    assert c.get(b"a1", 0.0) is None and c.get(b"a2", 0.0) is None
    assert c.get(b"b1", 0.0) is not None


def test_the_cache_is_bounded() -> None:
    c = TokenCache(fresh_seconds=30, max_entries=10)
    for i in range(100):
        c.put(i.to_bytes(4, "big"), _entry())
    assert len(c) == 10
    assert c.get((99).to_bytes(4, "big"), 0.0) is not None  # the newest kept
