"""Keys to clients (Tenants.identify, is_admin, by_owner) and a client's models (may_use)."""

from __future__ import annotations

import hashlib
import tomllib
from typing import Any

import pytest

from gateway.ops import config
from gateway.tenancy.clients import ANONYMOUS_CLIENT, Client, Tenants, owner_id
from tests.config_cases import GOOD

ENV = {"ANON": "anon-1, anon-2", "KEY_A": "key-a", "ADMIN": "adm-1"}


def _cfg(*, anon: bool, clients: bool, admin: bool = False) -> config.Config:
    server = []
    if anon:
        server.append('api_keys_env = "ANON"')
    if admin:
        server.append('admin_keys_env = "ADMIN"')
    text = GOOD.replace('prefix = "/llm"', 'prefix = "/llm"\n' + "\n".join(server))
    if clients:
        text += '\n[[clients]]\nname = "alice"\nkey_env = "KEY_A"\nmodels = ["reasoning"]\n'
        text += (
            f'\n[[clients]]\nname = "bob"\nkey_sha256 = "{hashlib.sha256(b"key-b").hexdigest()}"\n'
        )
    return config.parse(tomllib.loads(text), "t.toml", ENV)


# (case id, anonymous keys configured, [[clients]] configured, presented key, client name or None)
IDENTIFY: list[tuple[str, bool, bool, bytes | None, str | None]] = [
    ("no keys at all: no key", False, False, None, "anonymous"),
    ("no keys at all: any key", False, False, b"whatever", "anonymous"),
    ("anonymous key", True, False, b"anon-1", "anonymous"),
    ("second anonymous key", True, False, b"anon-2", "anonymous"),
    ("anonymous keys: unknown key", True, False, b"anon-3", None),
    ("anonymous keys: no key", True, False, None, None),
    ("named client by key_env", False, True, b"key-a", "alice"),
    ("named client by key_sha256", False, True, b"key-b", "bob"),
    ("clients only: unknown key", False, True, b"key-c", None),
    ("clients only: no key", False, True, None, None),
    ("clients only: a digest is not a key", False, True, hashlib.sha256(b"key-b").digest(), None),
    ("both: anonymous key", True, True, b"anon-2", "anonymous"),
    ("both: named key", True, True, b"key-a", "alice"),
    ("both: unknown key", True, True, b"key-a ", None),
]


@pytest.mark.parametrize(
    "anon,clients,presented,expected", [c[1:] for c in IDENTIFY], ids=[c[0] for c in IDENTIFY]
)
def test_identify(anon: bool, clients: bool, presented: bytes | None, expected: str | None) -> None:
    tenants = Tenants(_cfg(anon=anon, clients=clients))
    client = tenants.identify(presented)
    assert (client.name if client is not None else None) == expected
    assert tenants.keyed == (anon or clients)
    assert tenants.identify(presented) is client  # the second time from the seen keys


def test_only_known_keys_are_remembered() -> None:
    """A known key is looked up without hashing the next time; an unknown one is never kept,
    so random keys from a hostile caller cannot grow the table."""
    tenants = Tenants(_cfg(anon=True, clients=True))
    for i in range(1000):
        assert tenants.identify(b"guess-%d" % i) is None
    assert tenants._seen == {}
    alice = tenants.identify(b"key-a")
    assert alice is not None and tenants._seen == {b"key-a": alice}
    assert tenants.identify(b"key-a") is alice
    assert tenants.identify(b"key-a\0") is None and len(tenants._seen) == 1


def test_clients_and_owners() -> None:
    tenants = Tenants(_cfg(anon=True, clients=True, admin=True))
    assert sorted(tenants.clients) == ["alice", "anonymous", "bob"]
    assert tenants.clients["alice"].models == ("reasoning",)
    assert tenants.clients["anonymous"] is ANONYMOUS_CLIENT
    # a batch's owner (a key's digest, as the batches store keeps it) -> its client
    alice_owner = owner_id(hashlib.sha256(b"key-a").digest())
    assert tenants.by_owner(alice_owner).name == "alice"
    assert tenants.by_owner(owner_id(hashlib.sha256(b"anon-1").digest())) is ANONYMOUS_CLIENT
    assert tenants.by_owner("0" * 32) is ANONYMOUS_CLIENT  # a key since removed
    # admin keys are no client keys, nor client keys admin keys
    assert tenants.is_admin(b"adm-1") and tenants.identify(b"adm-1") is None
    assert not tenants.is_admin(b"key-a") and not tenants.is_admin(None)


# (case id, the client's models, requested name, the route it reached, may use)
MAY_USE: list[tuple[str, tuple[str, ...], str, str, bool]] = [
    ("no list: anything", (), "anything", "anything", True),
    ("exact name", ("reasoning",), "reasoning", "reasoning", True),
    ("another name", ("reasoning",), "coder", "coder", False),
    ("a prefix is not a match", ("reason",), "reasoning", "reasoning", False),
    ("a pattern", ("qwen*",), "qwen2.5:3b", "qwen2.5:3b", True),
    ("a pattern, not matching", ("qwen*",), "llama3", "llama3", False),
    ("a pattern in the middle", ("*-coder-*",), "qwen-coder-7b", "qwen-coder-7b", True),
    ("the route's name (a pattern route)", ("claude-*",), "claude-opus-4", "claude-*", True),
    ("the route's configured name listed", ("claude-*",), "opus", "claude-*", True),
    ("a configured pattern route, name outside", ("local",), "claude-x", "claude-*", False),
    ("case matters", ("Reasoning",), "reasoning", "reasoning", False),
    ("one of several", ("a", "b", "c*"), "cx", "cx", True),
]


@pytest.mark.parametrize(
    "models,requested,route,expected", [c[1:] for c in MAY_USE], ids=[c[0] for c in MAY_USE]
)
def test_may_use(models: tuple[str, ...], requested: str, route: str, expected: bool) -> None:
    assert Client("c", models).may_use(requested, route) is expected


@pytest.mark.parametrize(
    "limits,limited",
    [
        ({}, False),
        ({"max_concurrency": 3}, False),  # a concurrency cap is no rate limit
        ({"requests_per_minute": 1}, True),
        ({"input_tokens_per_minute": 1}, True),
        ({"output_tokens_per_minute": 1}, True),
        ({"tokens_per_day": 1}, True),
    ],
)
def test_limited(limits: dict[str, Any], limited: bool) -> None:
    assert Client("c", **limits).limited is limited
