"""The generic pass (gateway/ops/config_check.py): each key checked against its schema entry.

A sample of keys of each kind (a value set, an alias, bounds exclusive and inclusive, a cap, a
range, a type, an array, a format), each with values taken and values refused; a refusal is
one line naming the key path, ``PATH: must ..., got VALUE``.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.ops import config, config_check, config_schema

BASE: dict[str, Any] = {
    "upstreams": {"vllm": {"base_url": "http://127.0.0.1:8000/v1"}},
    "models": [{"name": "m", "upstream": "vllm", "upstream_model": "x"}],
    "web_search": {"searxng_url": "http://127.0.0.1:8888"},
}

# where the key goes in BASE, and how the loaded value is read back
PLACES = {
    "server": (lambda d: d.setdefault("server", {}), lambda c: c.server),
    "upstream": (lambda d: d["upstreams"]["vllm"], lambda c: c.upstreams["vllm"]),
    "model": (lambda d: d["models"][0], lambda c: c.models[next(iter(c.models))]),
    "batches": (lambda d: d.setdefault("batches", {}), lambda c: c.batches),
    "web_search": (lambda d: d["web_search"], lambda c: c.web_search),
}

# (place, key, value written, value loaded)
TAKEN = [
    ("upstream", "kind", "sglang", "sglang"),  # a choice
    ("upstream", "keepalive", True, "auto"),  # an alias of a choice
    ("upstream", "keepalive", False, "never"),
    ("upstream", "keepalive", "always", "always"),
    ("upstream", "idle_timeout", 3, 3.0),  # an integer for a number
    ("upstream", "health_interval", 0, 0.0),  # >= 0 takes 0
    ("upstream", "max_replicas", 256, 256),  # the cap itself
    ("server", "port", 0, 0),  # a range's both ends
    ("server", "port", 65535, 65535),
    ("server", "prefix", "", ""),  # a format's empty value
    ("server", "log_level", "debug", "debug"),
    ("batches", "max_in_flight", 64, 64),
    ("batches", "public_base_url", "https://gw.example/llm/", "https://gw.example/llm"),
    ("web_search", "max_results", 20, 20),
    ("web_search", "searxng_url", "http://s:8888/", "http://s:8888"),
    ("upstream", "base_url", "https://h/v1/", "https://h/v1"),
    ("model", "fallbacks", [], ()),  # an array becomes a tuple
    ("model", "images", "no", "no"),
]


@pytest.mark.parametrize(
    ("place", "key", "written", "loaded"), TAKEN, ids=[f"{p}.{k}={w!r}" for p, k, w, _ in TAKEN]
)
def test_a_value_in_its_set_and_bounds_is_taken(
    place: str, key: str, written: Any, loaded: Any
) -> None:
    table, read = PLACES[place]
    data = _copy(BASE)
    table(data)[key] = written
    value = getattr(read(config.parse(data, "c.toml", {})), key)
    assert value == loaded and type(value) is type(loaded)


# (place, key, value, the whole message after the file name)
REFUSED = [
    (
        "upstream",
        "kind",
        "tgi",
        "upstreams.vllm.kind: must be one of openai, vllm, sglang, llamacpp, ollama, got 'tgi'",
    ),
    (
        "upstream",
        "keepalive",
        "yes",
        "upstreams.vllm.keepalive: must be one of auto, always, "
        "never (or true for auto, false for never), got 'yes'",
    ),
    ("upstream", "idle_timeout", -1, "upstreams.vllm.idle_timeout: must be > 0, got -1.0"),
    ("upstream", "idle_timeout", 0, "upstreams.vllm.idle_timeout: must be > 0, got 0.0"),
    ("upstream", "health_interval", -0.5, "upstreams.vllm.health_interval: must be >= 0, got -0.5"),
    ("upstream", "max_replicas", 257, "upstreams.vllm.max_replicas: must be at most 256, got 257"),
    ("upstream", "max_replicas", 0, "upstreams.vllm.max_replicas: must be > 0, got 0"),
    (
        "upstream",
        "connect_timeout",
        "5s",
        "upstreams.vllm.connect_timeout: must be an integer or a number, got '5s'",
    ),
    ("upstream", "pool_size", True, "upstreams.vllm.pool_size: must be an integer, got True"),
    ("upstream", "pool_size", 1.5, "upstreams.vllm.pool_size: must be an integer, got 1.5"),
    (
        "upstream",
        "text_tool_calls",
        "yes",
        "upstreams.vllm.text_tool_calls: must be a boolean, got 'yes'",
    ),
    (
        "upstream",
        "base_url",
        "ftp://h/v1",
        "upstreams.vllm.base_url: must be an http(s) URL, got 'ftp://h/v1'",
    ),
    (
        "upstream",
        "health_path",
        "/a b",
        "upstreams.vllm.health_path: must start with '/' and "
        "hold printable ASCII without spaces, got '/a b'",
    ),
    ("server", "port", 65536, "server.port: must be 0..65535, got 65536"),
    ("server", "port", -1, "server.port: must be 0..65535, got -1"),
    (
        "server",
        "log_level",
        "loud",
        "server.log_level: must be one of debug, info, warning, error, got 'loud'",
    ),
    (
        "server",
        "prefix",
        "/llm/",
        "server.prefix: must start with '/' and not end with '/' (or be empty), got '/llm/'",
    ),
    ("server", "api_keys_env", 3, "server.api_keys_env: must be a string, got 3"),
    ("model", "images", "maybe", "models[0].images: must be one of auto, yes, no, got 'maybe'"),
    ("model", "fallbacks", "m", "models[0].fallbacks: must be an array of strings, got 'm'"),
    ("model", "fallbacks", ["a", 3], "models[0].fallbacks[1]: must be a string, got 3"),
    ("model", "name", "", "models[0].name: must not be empty, got ''"),
    ("batches", "max_in_flight_idle", 65, "batches.max_in_flight_idle: must be 0..64, got 65"),
    (
        "batches",
        "database",
        "mysql://u:secret@h/db",  # no value echoed: it may hold a password
        "batches.database: must be sqlite:///PATH, an absolute path or postgresql://...",
    ),
    (
        "web_search",
        "max_result_chars",
        8001,
        "web_search.max_result_chars: must be at most 8000, got 8001",
    ),
    (
        "web_search",
        "searxng_url",
        "http://s/?q=1",
        "web_search.searxng_url: must be an "
        "http(s) URL (scheme://host[:port][/path]), got 'http://s/?q=1'",
    ),
]


@pytest.mark.parametrize(
    ("place", "key", "value", "message"), REFUSED, ids=[f"{p}.{k}={v!r}" for p, k, v, _ in REFUSED]
)
def test_a_value_out_of_its_set_or_bounds_is_refused_naming_the_key(
    place: str, key: str, value: Any, message: str
) -> None:
    table, _ = PLACES[place]
    data = _copy(BASE)
    table(data)[key] = value
    with pytest.raises(config.ConfigError) as info:
        config.parse(data, "c.toml", {})
    assert str(info.value) == f"c.toml: {message}"


def test_every_key_declares_a_description_and_only_known_formats() -> None:
    schema = config_schema.schema()
    assert len(schema) >= 79
    for path, knob in schema.items():
        assert knob.doc and "\n" not in knob.doc and "|" not in knob.doc, path
        assert knob.fmt is None or knob.fmt in config_schema.FORMATS, path
        assert knob.default is None or knob.choices is None or knob.default in knob.choices
    advanced = {p for p, k in schema.items() if k.advanced}
    assert advanced == {"server.decode_offload_bytes", "batches.poll_interval", "batches.lease"}


def test_every_default_passes_its_own_checks() -> None:
    """A default that its own bounds or value set would refuse is a schema error (a default
    written in words, such as base_url's "required unless base_urls", is a placeholder)."""
    for path, knob in config_schema.schema().items():
        if not knob.required and knob.default not in (None, ()) and knob.shown is None:
            assert config_check.check_value("s", path, knob.default, knob) == knob.default


def test_the_old_bound_spelling_still_declares_a_key() -> None:
    """``_knob(…, bound=_POS)`` (the spelling before gt/ge) still works, so a branch that
    added a key that way merges."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Table:
        a: float = config_schema._knob(1.0, bound=config_schema._POS)
        b: int = config_schema._knob(0, bound=config_schema._NONNEG)

    a, b = config_schema.knobs(Table)["a"], config_schema.knobs(Table)["b"]
    assert (a.gt, a.ge, b.gt, b.ge) == (0, None, None, 0)
    with pytest.raises(config.ConfigError, match=r"t\.a: must be > 0, got 0\.0"):
        config_check.check_table("s", "t", {"a": 0}, config_schema.knobs(Table))


def test_a_parse_checks_each_given_key_once() -> None:
    """It runs at start and on SIGHUP only; counted in key checks, not timed: one parse of a
    config with every table checks each given key once."""
    data = _copy(BASE)
    calls = 0
    real = config_check.check_value

    def counting(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(config_check, "check_value", counting)
        config.parse(data, "c.toml", {})
    assert calls == 5  # base_url, name, upstream, upstream_model, searxng_url


def _copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_copy(v) for v in data]
    return data
