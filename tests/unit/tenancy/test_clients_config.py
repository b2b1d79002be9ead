"""[[clients]] and [limits] as the loader takes or refuses them: one line naming the file and
the key, never a key's or a URL's value."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gateway.ops import config
from gateway.ops.config_schema import MAX_CLIENTS
from tests.config_cases import GOOD

SHA_A = hashlib.sha256(b"key-a").hexdigest()
ENV = {"KEY_A": "key-a", "KEY_B": "key-b", "ANON": "anon-1,anon-2", "ADMIN": "adm-secret-1"}


def _client(name: str, key: str = 'key_env = "KEY_B"', extra: str = "") -> str:
    return f'\n[[clients]]\nname = "{name}"\n{key}\n{extra}\n'


def _with_server(line: str) -> str:
    return GOOD.replace('prefix = "/llm"', f'prefix = "/llm"\n{line}')


# (case id, config text, env, text the one-line error must contain, text it must not hold)
REFUSED = [
    (
        "duplicate name",
        GOOD + _client("team", 'key_env = "KEY_A"') + _client("team"),
        ENV,
        "clients[1].name: duplicate client name 'team'",
        "",
    ),
    ("reserved name", GOOD + _client("anonymous"), ENV, "clients[0].name: 'anonymous'", ""),
    (
        "both key_env and key_sha256",
        GOOD + _client("a", f'key_env = "KEY_B"\nkey_sha256 = "{SHA_A}"'),
        ENV,
        "clients[0].key_env: set key_env or key_sha256 (one of them)",
        "",
    ),
    (
        "neither key_env nor key_sha256",
        GOOD + _client("a", ""),
        ENV,
        "clients[0].key_env: set key_env or key_sha256 (one of them)",
        "",
    ),
    (
        "key_sha256 not hex",
        GOOD + _client("a", f'key_sha256 = "{"z" * 64}"'),
        ENV,
        "clients[0].key_sha256: must be 64 hex digits",
        "z" * 64,
    ),
    (
        "key_sha256 too short",
        GOOD + _client("a", 'key_sha256 = "abc123"'),
        ENV,
        "clients[0].key_sha256: must be 64 hex digits",
        "abc123",
    ),
    (
        "key shared with server.api_keys_env",
        _with_server('api_keys_env = "ANON"')
        + _client("a", f'key_sha256 = "{hashlib.sha256(b"anon-2").hexdigest()}"'),
        ENV,
        "clients[0]: its key is also the key of server.api_keys_env",
        "anon-2",
    ),
    (
        "key shared with another client",
        GOOD + _client("a", 'key_env = "KEY_A"') + _client("b", f'key_sha256 = "{SHA_A}"'),
        ENV,
        "clients[1]: its key is also the key of clients[0]",
        "key-a",
    ),
    (
        "key env var missing",
        GOOD + _client("a", 'key_env = "NO_SUCH_VAR"'),
        ENV,
        "clients[0].key_env: environment variable NO_SUCH_VAR is not set",
        "",
    ),
    (
        "key with a space",
        GOOD + _client("a", 'key_env = "SPACED"'),
        {"SPACED": "two words"},
        "clients[0].key_env: the key in SPACED must be printable ASCII without spaces",
        "two words",
    ),
    (
        "bad client name",
        GOOD + _client("team a"),
        ENV,
        "clients[0].name: must be 1 to 64 letters",
        "",
    ),
    ("clients not an array", 'clients = "x"\n' + GOOD, ENV, "clients: must be an array", ""),
    (
        "too many clients",
        GOOD
        + "".join(_client(f"c{i}", f'key_sha256 = "{i:064x}"') for i in range(MAX_CLIENTS + 1)),
        ENV,
        f"clients: at most {MAX_CLIENTS} clients",
        "",
    ),
    (
        "negative limit",
        GOOD + _client("a", extra="requests_per_minute = -1"),
        ENV,
        "clients[0].requests_per_minute",
        "",
    ),
    ("zero weight", GOOD + _client("a", extra="weight = 0"), ENV, "clients[0].weight", ""),
    ("unknown client key", GOOD + _client("a", extra="rpm = 5"), ENV, "clients[0].rpm", ""),
    (
        "bad redis URL",
        GOOD + '\n[limits]\nredis_url_env = "REDIS"\n',
        {"REDIS": "http://user:hunter2@cache:6379"},
        "limits.redis_url_env: the URL in REDIS must be redis://",
        "hunter2",
    ),
    (
        "redis env var missing",
        GOOD + '\n[limits]\nredis_url_env = "REDIS"\n',
        {},
        "limits.redis_url_env: environment variable REDIS is not set",
        "",
    ),
    (
        "on_store_error not a choice",
        GOOD + '\n[limits]\non_store_error = "maybe"\n',
        {},
        "limits.on_store_error",
        "",
    ),
    (
        "admin keys env var missing",
        _with_server('admin_keys_env = "NO_ADMIN"'),
        {},
        "server.admin_keys_env: environment variable NO_ADMIN is not set",
        "",
    ),
]


@pytest.mark.parametrize(
    "text,env,expected,hidden", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_refused(
    tmp_path: Path, text: str, env: dict[str, str], expected: str, hidden: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(config.ConfigError) as info:
        config.load(str(path), env)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert expected in message
    assert "\n" not in message
    if hidden:
        assert hidden not in message


def test_taken(tmp_path: Path) -> None:
    text = (
        _with_server('api_keys_env = "ANON"\nadmin_keys_env = "ADMIN"')
        + _client(
            "alice",
            'key_env = "KEY_A"',
            'models = ["reasoning", "qwen*"]\nmax_concurrency = 2\nrequests_per_minute = 60\n'
            "input_tokens_per_minute = 1000\noutput_tokens_per_minute = 500\n"
            "tokens_per_day = 9000\nweight = 2.5",
        )
        + _client("bob", f'key_sha256 = "{hashlib.sha256(b"key-b").hexdigest().upper()}"')
        + '\n[limits]\nredis_url_env = "REDIS"\non_store_error = "closed"\nstore_timeout = 0.5\n'
    )
    path = tmp_path / "c.toml"
    path.write_text(text)
    cfg = config.load(str(path), {**ENV, "REDIS": " redis://:pw@127.0.0.1:6379/2 "})
    alice, bob = cfg.clients
    assert (alice.name, alice.models, alice.max_concurrency, alice.requests_per_minute) == (
        "alice",
        ("reasoning", "qwen*"),
        2,
        60,
    )
    assert (alice.input_tokens_per_minute, alice.output_tokens_per_minute) == (1000, 500)
    assert (alice.tokens_per_day, alice.weight) == (9000, 2.5)
    assert alice.key_digest == hashlib.sha256(b"key-a").digest()
    # an upper-case digest is the same digest
    assert bob.key_digest == hashlib.sha256(b"key-b").digest()
    assert (bob.models, bob.max_concurrency, bob.weight) == ((), 0, 1.0)
    assert cfg.server.api_keys == ("anon-1", "anon-2")
    assert cfg.server.admin_keys == ("adm-secret-1",)
    assert cfg.limits.redis_url == "redis://:pw@127.0.0.1:6379/2"
    assert (cfg.limits.on_store_error, cfg.limits.store_timeout) == ("closed", 0.5)
    # no secret in the config's repr (a log line, a traceback)
    for secret in ("key-a", "anon-1", "adm-secret-1", ":pw@", alice.key_digest.hex()):
        assert secret not in repr(cfg)


def test_no_clients_no_limits() -> None:
    cfg = config.load(None, {})
    assert cfg.clients == ()
    assert (cfg.limits.redis_url, cfg.limits.on_store_error) == ("", "open")
