"""Config loading: every bad config exits 2 with one line naming the file and the key."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gateway.ops import config, config_schema, signing_key
from tests.config_cases import BAD, GOOD, MODEL


@pytest.mark.parametrize("text,env,expected", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_config_names_the_key(
    tmp_path: Path, text: str, env: dict[str, str], expected: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(config.ConfigError) as info:
        config.load(str(path), env)
    message = str(info.value)
    assert message.startswith(str(path) + ": ")
    assert expected in message
    assert "\n" not in message


def test_builtin_default_matches_design() -> None:
    cfg = config.load(None, {})
    assert (cfg.server.host, cfg.server.port, cfg.server.prefix) == ("127.0.0.1", 8080, "/llm")
    assert cfg.models["reasoning"].upstream.base_url == "http://127.0.0.1:8000/v1"
    assert cfg.models["qwen2.5:3b-instruct"].upstream.base_url == "http://127.0.0.1:11434/v1"


def test_values_are_loaded(tmp_path: Path) -> None:
    text = GOOD.replace(
        'base_url = "http://127.0.0.1:8000/v1"',
        'base_url = "http://127.0.0.1:8000/v1/"\napi_key_env = "UPKEY"\n'
        "pool_size = 7\nconnect_timeout = 1\nheader_timeout = 2.5\n"
        "idle_timeout = 9",
    )
    text = text.replace('prefix = "/llm"', 'prefix = "/llm"\napi_keys_env = "KEYS"')
    path = tmp_path / "c.toml"
    path.write_text(text)
    cfg = config.load(str(path), {"UPKEY": "sk-up", "KEYS": "a, b,,c"})
    up = cfg.upstreams["local-vllm"]
    assert up.base_url == "http://127.0.0.1:8000/v1"
    assert (up.api_key, up.pool_size, up.connect_timeout, up.header_timeout, up.idle_timeout) == (
        "sk-up",
        7,
        1.0,
        2.5,
        9.0,
    )
    assert cfg.server.api_keys == ("a", "b", "c")
    assert "sk-up" not in repr(cfg)
    assert (up.response_timeout, up.max_response_bytes, up.keepalive) == (900.0, 64 << 20, "auto")
    over = config.with_overrides(cfg, host="0.0.0.0", port=9)
    assert (over.server.host, over.server.port) == ("0.0.0.0", 9)


def test_the_upstream_client_knobs_are_loaded() -> None:
    text = GOOD.replace(
        'base_url = "http://127.0.0.1:8000/v1"',
        'base_url = "http://127.0.0.1:8000/v1"\nresponse_timeout = 30\n'
        "max_response_bytes = 1024\nkeepalive = false",
    )
    up = config.parse(tomllib.loads(text), "c.toml", {}).upstreams["local-vllm"]
    assert (up.response_timeout, up.max_response_bytes, up.keepalive) == (30.0, 1024, "never")
    assert isinstance(up.response_timeout, float)


@pytest.mark.parametrize(
    ("written", "loaded"),
    [
        ("", "auto"),
        ("true", "auto"),
        ("false", "never"),
        ('"auto"', "auto"),
        ('"always"', "always"),
        ('"never"', "never"),
    ],
)
def test_keepalive_is_tri_state_and_the_old_booleans_still_load(written: str, loaded: str) -> None:
    """true was the default until keep-alive had to be earned: it now means "auto" (a file
    that spelled the old default out gets the new one); false still means never."""
    extra = f"\nkeepalive = {written}" if written else ""
    text = GOOD.replace(
        'base_url = "http://127.0.0.1:8000/v1"', 'base_url = "http://127.0.0.1:8000/v1"' + extra
    )
    assert (
        config.parse(tomllib.loads(text), "c.toml", {}).upstreams["local-vllm"].keepalive == loaded
    )


PATTERNS = GOOD + "".join(
    MODEL.format(name=n, up="local-vllm")
    for n in ("claude-haiku-*", "claude-*", "*-instruct", "a.b*")
)

# (client's model name, the configured route it takes, or None for a 404)
ROUTES = [
    ("reasoning", "reasoning"),  # exact
    ("claude-haiku-4-5-20251001", "claude-haiku-*"),  # the first pattern in config order
    ("claude-opus-4-8", "claude-*"),
    ("claude-", "claude-*"),  # `*` matches the empty run too
    ("claude-haiku-*", "claude-haiku-*"),  # a pattern's own name
    ("qwen-instruct", "*-instruct"),
    ("a.bc", "a.b*"),
    ("axbc", None),  # `.` is no regex wildcard
    ("Claude-opus", None),  # case-sensitive, like exact names
    ("xclaude-opus", None),  # anchored at both ends
    ("claude-opus\nreasoning", "claude-*"),  # any character, newline included
]


@pytest.mark.parametrize(("name", "expected"), ROUTES)
def test_pattern_routes(tmp_path: Path, name: str, expected: str | None) -> None:
    path = tmp_path / "c.toml"
    path.write_text(PATTERNS)
    cfg = config.load(str(path), {})
    route = config.find_route(cfg.models, name)
    assert (route.name if route else None) == expected


def test_exact_name_wins_over_an_earlier_pattern(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        GOOD.replace('name = "reasoning"', 'name = "claude-*"')
        + MODEL.format(name="claude-opus-4-8", up="local-vllm")
    )
    cfg = config.load(str(path), {})
    assert config.find_route(cfg.models, "claude-opus-4-8").name == "claude-opus-4-8"
    assert config.find_route(cfg.models, "claude-sonnet").name == "claude-*"


def test_builtin_default_routes_claude_code_model_names() -> None:
    cfg = config.load(None, {})
    for name in ("claude-opus-4-8", "claude-opus-5-5", "claude-haiku-4-5-20251001"):
        route = config.find_route(cfg.models, name)
        assert route is not None and route.name == "claude-*"
        assert route.upstream.name == "local-vllm"


def test_default_signing_key_is_kept_in_the_state_directory(tmp_path: Path) -> None:
    """Replayed thinking signatures must open after a restart and on every worker."""
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    first = config.load(None, env).server
    again = config.load(None, env).server
    assert first.signing_key_source == "file" and first.signing_key == again.signing_key
    key_file = tmp_path / "state" / "llm-gateway" / "signing.key"
    assert key_file.read_bytes() == first.signing_key and len(first.signing_key) == 32
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert list(key_file.parent.iterdir()) == [key_file]  # no temporary file left
    systemd = config.load(
        None, {"STATE_DIRECTORY": str(tmp_path / "sd"), "HOME": str(tmp_path / "home")}
    ).server
    assert (tmp_path / "sd" / "signing.key").read_bytes() == systemd.signing_key
    assert not (tmp_path / "home").exists()


def test_default_signing_key_without_a_writable_state_directory(tmp_path: Path) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("x")
    env = {"XDG_STATE_HOME": str(blocked)}
    one, two = config.load(None, env).server, config.load(None, env).server
    assert one.signing_key_source == "random" and one.signing_key != two.signing_key
    shared = {**env, signing_key.SHARED_KEY_ENV: "ab" * 32}  # what the --workers supervisor sets
    assert config.load(None, shared).server.signing_key == bytes.fromhex("ab" * 32)


def test_signing_key_env_wins(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(GOOD.replace('prefix = "/llm"', 'prefix = "/llm"\nsigning_key_env = "SK"'))
    server = config.load(str(path), {"SK": "secret", "XDG_STATE_HOME": str(tmp_path)}).server
    assert (server.signing_key, server.signing_key_source) == (b"secret", "env")
    assert not (tmp_path / "llm-gateway").exists()


def test_the_decoding_budget_is_loaded() -> None:
    """server.max_decoding_bytes (gateway/http/body.py): 64 MiB unless set, and above zero."""
    assert config.parse(tomllib.loads(GOOD), "c.toml", {}).server.max_decoding_bytes == 64 << 20
    text = GOOD.replace('prefix = "/llm"', 'prefix = "/llm"\nmax_decoding_bytes = 1048576')
    assert config.parse(tomllib.loads(text), "c.toml", {}).server.max_decoding_bytes == 1 << 20
    with pytest.raises(config.ConfigError, match=r"server\.max_decoding_bytes: must be > 0"):
        config.parse(tomllib.loads(text.replace("1048576", "0")), "c.toml", {})


def test_the_client_connection_knobs_are_loaded() -> None:
    """Deadlines, the connection cap and the metrics listener (gateway/http/protocol.py)."""
    server = config.parse(tomllib.loads(GOOD), "c.toml", {}).server
    assert (
        server.idle_timeout,
        server.request_head_timeout,
        server.request_body_timeout,
        server.max_connections,
        server.metrics_port,
        server.metrics_apart,
    ) == (60.0, 30.0, 60.0, 0, 0, False)
    text = GOOD.replace(
        'prefix = "/llm"',
        'prefix = "/llm"\nidle_timeout = 5\n'
        "request_head_timeout = 2\nrequest_body_timeout = 3\n"
        'max_connections = 100\nmetrics_port = 9464\nmetrics_host = "10.0.0.1"',
    )
    server = config.parse(tomllib.loads(text), "c.toml", {}).server
    assert (
        server.idle_timeout,
        server.request_head_timeout,
        server.request_body_timeout,
        server.max_connections,
        server.metrics_port,
        server.metrics_host,
    ) == (5.0, 2.0, 3.0, 100, 9464, "10.0.0.1")
    assert isinstance(server.idle_timeout, float) and server.metrics_apart


@pytest.mark.parametrize(
    "extra,message",
    [
        ("idle_timeout = 0", "server.idle_timeout: must be > 0"),
        ("request_head_timeout = -1", "server.request_head_timeout: must be > 0"),
        ("request_body_timeout = 0", "server.request_body_timeout: must be > 0"),
        ("max_connections = -1", "server.max_connections: must be >= 0"),
        ("max_connections = 1.5", "server.max_connections: must be an integer"),
        ("metrics_port = 70000", "server.metrics_port: must be 0..65535"),
        ("metrics_port = 8080", "server.metrics_port: must differ from server.port"),
        ('metrics_host = "127.0.0.1"', "server.metrics_host: needs server.metrics_port"),
    ],
)
def test_bad_client_connection_knobs_name_the_key(extra: str, message: str) -> None:
    text = GOOD.replace('prefix = "/llm"', f'prefix = "/llm"\n{extra}')
    with pytest.raises(config.ConfigError, match=message):
        config.parse(tomllib.loads(text), "c.toml", {})


def test_a_pattern_with_many_stars_routes_a_crafted_name_in_linear_time(tmp_path: Path) -> None:
    """``x-*-*-*-*-z`` as a regex (``x\\-.*\\-.*…``) backtracks polynomially on a name of
    dashes with no final ``z``: 2,000 characters held the event loop for minutes, and with
    more stars even a name within the length limit does. The glob matcher places each literal
    piece at its leftmost spot once, so this returns at once (the per-test timeout is the
    bound, no wall-clock assert)."""
    from gateway.text.glob import glob_match

    path = tmp_path / "c.toml"
    path.write_text(GOOD + MODEL.format(name="x-*-*-*-*-*-*-*-z", up="local-vllm"))
    cfg = config.load(str(path), {})
    crafted = "x-" + "-" * 250 + "y"
    for _ in range(1000):
        assert config.find_route(cfg.models, crafted) is None
    assert config.find_route(cfg.models, crafted[:-1] + "z").name == "x-*-*-*-*-*-*-*-z"
    assert not glob_match("x-*-*-*-*-z", "x-" + "-" * 20000 + "y")


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("a*b*c", "abc", True),
        ("a*b*c", "aXbYc", True),
        ("a*b*c", "acb", False),
        ("*", "", True),
        ("**", "x", True),
        ("a**", "a", True),
        ("ab*ba", "aba", False),
        ("ab*ba", "abba", True),
        ("*aa*aa*", "aaa", False),
        ("*aa*aa*", "aaaa", True),
        ("a*", "b", False),
        ("*a", "ba", True),
        ("x", "x", True),
        ("x", "xx", False),
    ],
)
def test_glob_match_agrees_with_fullmatch(pattern: str, name: str, expected: bool) -> None:
    import re

    from gateway.text.glob import glob_match

    regex = ".*".join(map(re.escape, pattern.split("*")))
    assert bool(re.fullmatch(regex, name, re.DOTALL)) is expected
    assert glob_match(pattern, name) is expected


def test_a_model_name_past_the_limit_routes_nowhere(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(PATTERNS)
    cfg = config.load(str(path), {})
    fits = "claude-" + "o" * (config_schema.MAX_MODEL_NAME_CHARS - len("claude-"))
    assert config.find_route(cfg.models, fits).name == "claude-*"
    assert config.find_route(cfg.models, fits + "o") is None


def test_a_configured_model_name_past_the_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(GOOD + MODEL.format(name="m" * 257, up="local-vllm"))
    with pytest.raises(
        config.ConfigError, match=r"models\[1\]\.name: must be at most 256 characters"
    ):
        config.load(str(path), {})


def test_batches_without_client_keys_warn_at_start() -> None:
    """Batches are owned by the client key that made them: without keys every client reads,
    cancels and deletes every batch, and nothing said so at start."""
    from gateway.__main__ import start_warnings

    cfg = config.parse(tomllib.loads(GOOD), "c.toml", {})
    assert not cfg.server.api_keys
    events = [e for e, _ in start_warnings(cfg, batches=True)]
    assert "auth_disabled" in events and "batches_unowned" in events
    assert "batches_unowned" not in [e for e, _ in start_warnings(cfg, batches=False)]
    keyed = config.parse(
        tomllib.loads(
            GOOD.replace("[server]", '[server]\napi_keys_env = "K"')
            if "[server]" in GOOD
            else '[server]\napi_keys_env = "K"\n' + GOOD
        ),
        "c.toml",
        {"K": "sk-client"},
    )
    assert keyed.server.api_keys
    assert start_warnings(keyed, batches=True) == [
        w for w in start_warnings(keyed, batches=True) if w[0] == "signing_key_ephemeral"
    ]


def test_telemetry_is_absent_unless_configured_and_its_headers_are_read() -> None:
    assert config.parse(tomllib.loads(GOOD), "t", {}).telemetry is None
    text = GOOD + '\n[telemetry]\notlp_endpoint = "http://127.0.0.1:4318"\nheaders_env = "H"\n'
    cfg = config.parse(tomllib.loads(text), "t", {"H": "authorization=Bearer k, x-team = a"})
    assert cfg.telemetry is not None
    assert cfg.telemetry.headers == (("authorization", "Bearer k"), ("x-team", "a"))
    assert cfg.telemetry.sample_ratio == 1.0 and cfg.telemetry.service_name == "llm-gateway"
