"""Config texts shared by the config tests: one good config, and bad ones with the line
each must be refused with."""

from __future__ import annotations

GOOD = """
[server]
host = "127.0.0.1"
port = 8080
prefix = "/llm"

[upstreams.local-vllm]
base_url = "http://127.0.0.1:8000/v1"

[[models]]
name = "reasoning"
upstream = "local-vllm"
upstream_model = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"
"""

MODEL = '\n[[models]]\nname = "{name}"\nupstream = "{up}"\nupstream_model = "x"\n'

# (case id, config text, env, text the one-line error must contain)
BAD = [
    ("unknown top-level key", GOOD + "\n[extra]\na = 1\n", {}, "extra: unknown key"),
    (
        "unknown server key",
        GOOD.replace('prefix = "/llm"', 'prefix = "/llm"\nprot = 1'),
        {},
        "server.prot: unknown key",
    ),
    (
        "unknown upstream key",
        GOOD.replace(
            'base_url = "http://127.0.0.1:8000/v1"',
            'base_url = "http://127.0.0.1:8000/v1"\nbase_ur1 = "x"',
        ),
        {},
        "upstreams.local-vllm.base_ur1: unknown key",
    ),
    ("unknown model key", GOOD + "temperature = 0.5\n", {}, "models[0].temperature: unknown key"),
    (
        "port wrong type",
        GOOD.replace("port = 8080", 'port = "8080"'),
        {},
        "server.port: must be an integer",
    ),
    (
        "port bool",
        GOOD.replace("port = 8080", "port = true"),
        {},
        "server.port: must be an integer",
    ),
    ("port out of range", GOOD.replace("port = 8080", "port = 70000"), {}, "server.port"),
    (
        "prefix without slash",
        GOOD.replace('prefix = "/llm"', 'prefix = "llm"'),
        {},
        "server.prefix",
    ),
    (
        "missing base_url",
        GOOD.replace('base_url = "http://127.0.0.1:8000/v1"', ""),
        {},
        "upstreams.local-vllm.base_url: missing",
    ),
    (
        "base_url not http",
        GOOD.replace("http://127.0.0.1:8000/v1", "ftp://h/v1"),
        {},
        "upstreams.local-vllm.base_url: must be an http(s) URL",
    ),
    (
        "base_url no host",
        GOOD.replace("http://127.0.0.1:8000/v1", "http:///v1"),
        {},
        "upstreams.local-vllm.base_url",
    ),
    (
        "model missing upstream_model",
        GOOD.replace('upstream_model = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"', ""),
        {},
        "models[0].upstream_model: missing",
    ),
    (
        "model unknown upstream",
        GOOD + MODEL.format(name="b", up="nope"),
        {},
        "models[1].upstream: unknown upstream 'nope'",
    ),
    (
        "duplicate model name",
        GOOD + MODEL.format(name="reasoning", up="local-vllm"),
        {},
        "models[1].name: duplicate model name 'reasoning'",
    ),
    (
        "model name wrong type",
        GOOD.replace('name = "reasoning"', "name = 3"),
        {},
        "models[0].name: must be a string",
    ),
    (
        "bad kind",
        GOOD.replace(
            'base_url = "http://127.0.0.1:8000/v1"',
            'base_url = "http://127.0.0.1:8000/v1"\nkind = "tgi"',
        ),
        {},
        "upstreams.local-vllm.kind",
    ),
    (
        "negative timeout",
        GOOD.replace(
            'base_url = "http://127.0.0.1:8000/v1"',
            'base_url = "http://127.0.0.1:8000/v1"\nidle_timeout = -1',
        ),
        {},
        "upstreams.local-vllm.idle_timeout: must be > 0",
    ),
    (
        "timeout wrong type",
        GOOD.replace(
            'base_url = "http://127.0.0.1:8000/v1"',
            'base_url = "http://127.0.0.1:8000/v1"\nconnect_timeout = "5s"',
        ),
        {},
        "upstreams.local-vllm.connect_timeout: must be an integer or a number",
    ),
    (
        "zero response cap",
        GOOD.replace(
            'base_url = "http://127.0.0.1:8000/v1"',
            'base_url = "http://127.0.0.1:8000/v1"\nmax_response_bytes = 0',
        ),
        {},
        "upstreams.local-vllm.max_response_bytes: must be > 0",
    ),
    (
        "keepalive not a boolean",
        GOOD.replace(
            'base_url = "http://127.0.0.1:8000/v1"',
            'base_url = "http://127.0.0.1:8000/v1"\nkeepalive = "no"',
        ),
        {},
        "upstreams.local-vllm.keepalive: must be one of auto, always, never "
        "(or true for auto, false for never), got 'no'",
    ),
    (
        "unknown balance",
        GOOD.replace(
            'base_url = "http://127.0.0.1:8000/v1"',
            'base_url = "http://127.0.0.1:8000/v1"\nbalance = "random"',
        ),
        {},
        "upstreams.local-vllm.balance: must be one of affinity, round_robin, least_busy",
    ),
    (
        "api_key_env unset",
        GOOD.replace(
            'base_url = "http://127.0.0.1:8000/v1"',
            'base_url = "http://127.0.0.1:8000/v1"\napi_key_env = "NO_SUCH_VAR_X"',
        ),
        {},
        "upstreams.local-vllm.api_key_env: environment variable NO_SUCH_VAR_X is not set",
    ),
    (
        "api_key with a newline",
        GOOD.replace(
            'base_url = "http://127.0.0.1:8000/v1"',
            'base_url = "http://127.0.0.1:8000/v1"\napi_key_env = "UPKEY"',
        ),
        {"UPKEY": "sk-1\r\nX-Injected: 1"},
        "upstreams.local-vllm.api_key_env: the key in UPKEY must be printable ASCII without spaces",
    ),
    (
        "api_keys_env unset",
        GOOD.replace('prefix = "/llm"', 'prefix = "/llm"\napi_keys_env = "NO_SUCH_KEYS"'),
        {},
        "server.api_keys_env: environment variable NO_SUCH_KEYS is not set",
    ),
    ("no models", GOOD.split("[[models]]")[0], {}, "models: at least one"),
    (
        "models not an array",
        GOOD.split("[[models]]")[0] + "\n[models]\nname = 'x'\n",
        {},
        "models: must be an array",
    ),
    ("not TOML", "[server\nport = 1", {}, "not valid TOML"),
    (
        "oidc without a client id",
        GOOD + '\n[auth]\noidc_issuer = "https://idp.example"\n',
        {},
        "auth.oidc_client_id: required with auth.oidc_issuer",
    ),
    (
        "oidc scopes without openid",
        GOOD + '\n[auth]\noidc_issuer = "https://idp.example"\noidc_client_id = "gw"\n'
        'oidc_scopes = ["email"]\n',
        {},
        "auth.oidc_scopes: must hold 'openid'",
    ),
    (
        "oidc secret env unset",
        GOOD + '\n[auth]\noidc_issuer = "https://idp.example"\noidc_client_id = "gw"\n'
        'oidc_client_secret_env = "NO_OIDC"\n',
        {},
        "auth.oidc_client_secret_env: environment variable NO_OIDC is not set",
    ),
    (
        "one oidc value, two clients",
        GOOD
        + '\n[[clients]]\nname = "a"\nkey_sha256 = "'
        + "a" * 64
        + '"\noidc_values = ["dev@x"]\n[[clients]]\nname = "b"\nkey_sha256 = "'
        + "b" * 64
        + '"\noidc_values = ["dev@x"]\n',
        {},
        "clients: oidc_values 'dev@x' is listed by both 'a' and 'b'",
    ),
    (
        "bad log level",
        GOOD.replace('prefix = "/llm"', 'prefix = "/llm"\nlog_level = "loud"'),
        {},
        "server.log_level",
    ),
    (
        "negative max_concurrency",
        GOOD + "max_concurrency = -1\n",
        {},
        "models[0].max_concurrency: must be >= 0",
    ),
    (
        "a Redis URL with a port out of range",
        GOOD + '\n[limits]\nredis_url_env = "RURL"\n',
        {"RURL": "redis://:pw-secret@127.0.0.1:99999/0"},
        "limits.redis_url_env: the Redis URL cannot be parsed",
    ),
    (
        "a Redis URL whose database is no number",
        GOOD + '\n[limits]\nredis_url_env = "RURL"\n',
        {"RURL": "redis://:pw-secret@127.0.0.1/zero"},
        "limits.redis_url_env: the Redis URL's database must be a number",
    ),
    (
        "a telemetry table without its endpoint",
        GOOD + '\n[telemetry]\nservice_name = "gw"\n',
        {},
        "telemetry.otlp_endpoint",
    ),
    (
        "a telemetry endpoint that is no http URL",
        GOOD + '\n[telemetry]\notlp_endpoint = "grpc://127.0.0.1:4317"\n',
        {},
        "telemetry.otlp_endpoint",
    ),
    (
        "a sample ratio past 1",
        GOOD + '\n[telemetry]\notlp_endpoint = "http://127.0.0.1:4318"\nsample_ratio = 2\n',
        {},
        "telemetry.sample_ratio",
    ),
    (
        "collector headers that are no name=value pairs (the value not echoed)",
        GOOD + '\n[telemetry]\notlp_endpoint = "http://127.0.0.1:4318"\nheaders_env = "H"\n',
        {"H": "Bearer secret-value"},
        "telemetry.headers_env: H must hold name=value pairs",
    ),
]
