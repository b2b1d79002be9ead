"""What a re-read config changes (gateway/ops/config_reload.py): the clients added, removed and
changed, the server keys, and the tables whose change needs a restart."""

from __future__ import annotations

import hashlib
import tomllib

import pytest

from gateway.ops import config
from gateway.ops.config_reload import Changes, changes, tenancy_of
from tests.config_cases import GOOD

ENV = {"K_A": "key-a", "K_B": "key-b", "ANON": "anon-1", "ANON2": "anon-2", "UP": "up-key"}
SHA_C = hashlib.sha256(b"key-c").hexdigest()


def _client(name: str, key: str, extra: str = "") -> str:
    return f'\n[[clients]]\nname = "{name}"\n{key}\n{extra}\n'


BASE = GOOD.replace('prefix = "/llm"', 'prefix = "/llm"\napi_keys_env = "ANON"') + (
    _client("alice", 'key_env = "K_A"') + _client("bob", 'key_env = "K_B"')
)


def _load(text: str) -> config.Config:
    return config.parse(tomllib.loads(text), "t.toml", ENV)


# (case id, the new file, the changes expected against BASE)
CASES = [
    ("same file", BASE, Changes()),
    (
        "a client added",
        BASE + _client("carol", f'key_sha256 = "{SHA_C}"'),
        Changes(added=("carol",)),
    ),
    (
        "a client removed",
        BASE.replace(_client("bob", 'key_env = "K_B"'), ""),
        Changes(removed=("bob",)),
    ),
    (
        "a key changed",
        BASE.replace('name = "bob"\nkey_env = "K_B"', f'name = "bob"\nkey_sha256 = "{SHA_C}"'),
        Changes(changed=("bob",)),
    ),
    (
        "the same key written as its digest",
        BASE.replace(
            'name = "bob"\nkey_env = "K_B"',
            f'name = "bob"\nkey_sha256 = "{hashlib.sha256(b"key-b").hexdigest()}"',
        ),
        Changes(changed=("bob",)),  # key_env -> key_sha256 is a change of the file
    ),
    (
        "a limit changed",
        BASE.replace('key_env = "K_A"', 'key_env = "K_A"\nrequests_per_minute = 5'),
        Changes(changed=("alice",)),
    ),
    (
        "models changed",
        BASE.replace('key_env = "K_A"', 'key_env = "K_A"\nmodels = ["reasoning"]'),
        Changes(changed=("alice",)),
    ),
    (
        "a client renamed",
        BASE.replace('name = "bob"', 'name = "robert"'),
        Changes(added=("robert",), removed=("bob",)),
    ),
    (
        "anonymous keys' variable changed",
        BASE.replace('api_keys_env = "ANON"', 'api_keys_env = "ANON2"'),
        Changes(server_keys=True),
    ),
    (
        "admin keys added",
        BASE.replace('api_keys_env = "ANON"', 'api_keys_env = "ANON"\nadmin_keys_env = "ANON2"'),
        Changes(server_keys=True),
    ),
    (
        "a server key: needs a restart",
        BASE.replace("port = 8080", "port = 8081"),
        Changes(needs_restart=("server",)),
    ),
    (
        "an upstream: needs a restart",
        BASE.replace('base_url = "http://127.0.0.1:8000/v1"', 'base_url = "http://127.0.0.1:9/v1"'),
        Changes(needs_restart=("upstreams", "models")),  # the model's upstream is that one
    ),
    (
        "a model: needs a restart",
        BASE.replace("[[models]]", "[[models]]\nmax_concurrency = 3"),
        Changes(needs_restart=("models",)),
    ),
    (
        "limits: needs a restart",
        BASE + '\n[limits]\non_store_error = "closed"\n',
        Changes(needs_restart=("limits",)),
    ),
    (
        "batches: needs a restart",
        BASE + "\n[batches]\nenabled = false\n",
        Changes(needs_restart=("batches",)),
    ),
    (
        "web_search added: needs a restart",
        BASE + '\n[web_search]\nsearxng_url = "http://127.0.0.1:9"\n',
        Changes(needs_restart=("web_search",)),
    ),
    (
        "a client and a server key at once",
        BASE.replace("port = 8080", "port = 8081") + _client("dan", f'key_sha256 = "{SHA_C}"'),
        Changes(added=("dan",), needs_restart=("server",)),
    ),
]


@pytest.mark.parametrize("text,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_changes(text: str, expected: Changes) -> None:
    started = _load(BASE)
    assert changes(started, started, _load(text)) == expected


def test_a_restart_change_is_reported_until_a_restart() -> None:
    """The tenancy part is compared with what was applied last, the rest with the start."""
    started = _load(BASE)
    moved = BASE.replace("port = 8080", "port = 8081") + _client("dan", f'key_sha256 = "{SHA_C}"')
    applied = tenancy_of(started, _load(moved))
    again = changes(started, applied, _load(moved))
    assert again == Changes(needs_restart=("server",))


def test_tenancy_of_takes_only_the_tenancy_part() -> None:
    started = _load(BASE)
    new = _load(
        BASE.replace("port = 8080", "port = 8081").replace(
            'api_keys_env = "ANON"', 'api_keys_env = "ANON2"'
        )
        + _client("dan", f'key_sha256 = "{SHA_C}"')
    )
    out = tenancy_of(started, new)
    assert [c.name for c in out.clients] == ["alice", "bob", "dan"]
    assert (out.server.api_keys_env, out.server.api_keys) == ("ANON2", ("anon-2",))
    assert out.server.port == 8080  # not applied
    assert out.models is started.models and out.upstreams is started.upstreams
