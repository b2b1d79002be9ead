"""The one error model: status -> error.type, scrubbing, upstream mapping, rendering.

Each table row is one fact a client depends on: the SDKs pick their exception
class from the status, Claude Code retries on 429/5xx/529 and shrinks
``max_tokens`` on the exact context-limit wording, and nothing an upstream
leaks (tracebacks, paths, hosts, addresses, any configured upstream's key) may
reach the client.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any
from urllib.parse import quote

import pytest

from gateway import errors
from gateway.ops.config import UpstreamConfig
from gateway.text import jsonutil, redact

HOSTS = ("gpu-node-7.internal", "vllm")
# '/' and '+' make the URL-encoded form differ, and a path-shaped key shows that secrets go
# before the other rules (the path rule would otherwise take "/a1/Zq7+x" and leave "sk-live")
KEY = "sk-live/a1/Zq7+x=42"
OTHER_KEY = "other-upstream-9f8e7d"  # a second upstream's key, quoted by the first one
UPSTREAMS = (
    UpstreamConfig("vllm", "http://gpu-node-7.internal:8000/v1", api_key=KEY),
    UpstreamConfig("other", "http://10.0.0.2/v1", api_key=OTHER_KEY),
    UpstreamConfig("keyless", "http://10.0.0.3/v1"),
)
SECRETS = redact.Redactor.of(UPSTREAMS)


def _body(payload: Any) -> bytes:
    return payload if isinstance(payload, bytes) else jsonutil.dumpb(payload)


def _vllm(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}


def _sglang(message: str) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": "BadRequestError", "param": None,
            "code": 400}  # fmt: skip


# --- the status -> error.type table ---------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (402, "billing_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (504, "timeout_error"),
        (529, "overloaded_error"),
        (502, "api_error"),  # other 5xx
        (507, "api_error"),
        (418, "invalid_request_error"),  # other 4xx
    ],
)
def test_status_to_error_type(status: int, error_type: str) -> None:
    assert errors.error_type_for(status) == error_type
    assert errors.GatewayError("x", status=status).error_type == error_type


@pytest.mark.parametrize(
    ("err", "status", "error_type", "headers"),
    [
        (errors.InvalidRequest("messages.0.role", "must be user or assistant"), 400,
         "invalid_request_error", {}),
        (errors.AuthenticationFailed(), 401, "authentication_error", {}),
        (errors.NotFound("model: nope"), 404, "not_found_error", {}),
        (errors.RequestTooLarge(), 413, "request_too_large", {}),
        (errors.NotSupported(), 501, "not_supported", {"x-should-retry": "false"}),
        (errors.Overloaded(), 529, "overloaded_error", {"retry-after": "1"}),
        (errors.GatewayError("slow down", status=429), 429, "rate_limit_error",
         {"retry-after": "1"}),
        (errors.GatewayError("slow down", status=429, retry_after=7), 429, "rate_limit_error",
         {"retry-after": "7"}),
        (errors.UpstreamUnavailable(), 529, "overloaded_error", {"retry-after": "1"}),
        (errors.UpstreamTimeout(), 504, "timeout_error", {}),
        (errors.StreamProcessingError(), 500, "api_error", {}),
        (errors.GatewayError(), 500, "api_error", {}),
    ],
)  # fmt: skip
def test_exception_tree(
    err: errors.GatewayError, status: int, error_type: str, headers: dict[str, str]
) -> None:
    assert (err.status, err.error_type, err.headers) == (status, error_type, headers)


def test_invalid_request_names_the_field_path() -> None:
    err = errors.InvalidRequest("messages.0.role", "must be user or assistant")
    assert err.message == "messages.0.role: must be user or assistant"
    assert err.path == "messages.0.role"
    assert errors.InvalidRequest("", "body is not JSON").message == "body is not JSON"


# --- upstream status/body -> client status, type, message -----------------------------

ERROR_TABLE = [
    # (case id, upstream status, upstream body, client status, error.type, message)
    ("vllm-400-kept", 400, _vllm("temperature: Input should be less than or equal to 2"),
     400, "invalid_request_error", "temperature: Input should be less than or equal to 2"),
    ("sglang-400-kept", 400, _sglang("top_k must be -1 or at least 1"),
     400, "invalid_request_error", "top_k must be -1 or at least 1"),
    ("ollama-400-kept", 400,
     {"error": {"message": "invalid tool", "type": "invalid_request_error", "param": None,
                "code": None}},
     400, "invalid_request_error", "invalid tool"),
    ("plain-text-400", 400, b"bad request: missing messages",
     400, "invalid_request_error", "bad request: missing messages"),
    ("empty-400", 400, b"", 400, "invalid_request_error", "Invalid request"),
    ("fastapi-422", 422,
     {"detail": [{"loc": ["body", "messages"], "msg": "Field required", "type": "missing"},
                 {"loc": ["body", "model"], "msg": "Input should be a string"}]},
     400, "invalid_request_error", "Field required; Input should be a string"),
    ("unknown-4xx-is-400", 418, _vllm("teapot"), 400, "invalid_request_error", "teapot"),
    ("402-billing", 402, {"error": {"message": "Insufficient credits"}},
     402, "billing_error", "Insufficient credits"),
    ("413-html-page", 413, b"<html><head><title>413 Request Entity Too Large</title></head>"
     b"<body><center><h1>413</h1></center><hr><center>nginx/1.25.3</center></body></html>",
     413, "request_too_large", "Request too large"),
    ("429", 429, {"error": {"message": "Too many requests in queue"}},
     429, "rate_limit_error", "Too many requests in queue"),
    ("401-is-gateway-config", 401, {"error": {"message": "Invalid API key sk-abc"}},
     500, "api_error", "Internal server error"),
    ("403-is-gateway-config", 403, b"Forbidden", 500, "api_error", "Internal server error"),
    ("404-is-gateway-config", 404,
     {"error": {"message": "The model `Qwen/Qwen3-32B` does not exist.", "type": "NotFoundError",
                "code": 404}},
     500, "api_error", "Internal server error"),
    ("500-with-traceback", 500,
     {"error": {"message": "Traceback (most recent call last):\n  File \"/opt/vllm/x.py\","
                           " line 3\nRuntimeError: CUDA error"}},
     500, "api_error", "Internal server error"),
    ("502-bad-gateway", 502, b"<html>502 Bad Gateway</html>", 500, "api_error",
     "Internal server error"),
    ("503-is-overloaded", 503, {"error": {"message": "Service Unavailable"}},
     529, "overloaded_error", "Overloaded"),
    ("529-is-overloaded", 529, b"", 529, "overloaded_error", "Overloaded"),
    ("504-is-timeout", 504, b"upstream timed out", 504, "timeout_error", "Internal server error"),
    ("anthropic-shape-4xx-keeps-type", 400,
     {"type": "error", "error": {"type": "permission_error", "message": "model not allowed"}},
     400, "permission_error", "model not allowed"),
    ("anthropic-shape-unknown-type", 400,
     {"type": "error", "error": {"type": "made_up_error", "message": "odd"}},
     400, "invalid_request_error", "odd"),
    ("anthropic-shape-5xx-loses-type", 500,
     {"type": "error", "error": {"type": "invalid_request_error", "message": "at /srv/app"}},
     500, "api_error", "Internal server error"),
    ("openai-type-not-kept", 400,
     {"error": {"message": "nope", "type": "authentication_error"}},  # not Anthropic's envelope
     400, "invalid_request_error", "nope"),
    ("host-scrubbed", 400, _vllm("cannot reach http://gpu-node-7.internal:8000/v1/models"),
     400, "invalid_request_error", "cannot reach [redacted]"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("upstream_status", "body", "status", "error_type", "message"),
    [row[1:] for row in ERROR_TABLE],
    ids=[row[0] for row in ERROR_TABLE],
)
def test_from_upstream(
    upstream_status: int, body: Any, status: int, error_type: str, message: str
) -> None:
    err = errors.from_upstream(upstream_status, _body(body), hosts=HOSTS)
    assert isinstance(err, errors.UpstreamError)
    assert (err.status, err.error_type, err.message) == (status, error_type, message)


@pytest.mark.parametrize(
    ("upstream_status", "headers"),
    [
        (429, {"retry-after": "1"}),
        (503, {"retry-after": "1"}),
        (529, {"retry-after": "1"}),
        (401, {"x-should-retry": "false"}),  # retrying cannot fix the gateway's config
        (404, {"x-should-retry": "false"}),
        (400, {}),
        (500, {}),
    ],
)
def test_from_upstream_headers(upstream_status: int, headers: dict[str, str]) -> None:
    assert errors.from_upstream(upstream_status, b"{}").headers == headers


# --- context-length rewrites (the two forms Claude Code acts on) -------------------------

TOO_LONG = "prompt is too long: {} tokens > {} maximum"
EXCEED = ("input length and `max_tokens` exceed context limit: {} + {} > {}, decrease input"
          " length or `max_tokens` and try again")  # fmt: skip

CONTEXT_TABLE = [
    # (case id, status, body, max_tokens sent upstream, expected message)
    ("vllm-legacy-total", 400, _vllm(
        "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
        "(4000 in the messages, 1000 in the completion). Please reduce the length of the messages "
        "or completion."), None, EXCEED.format(4000, 1000, 4096)),
    ("vllm-legacy-total-prompt-alone", 400, _vllm(
        "This model's maximum context length is 4096 tokens. However, you requested 9000 tokens "
        "(5000 in the messages, 4000 in the completion). Please reduce the length of the messages "
        "or completion."), None, TOO_LONG.format(5000, 4096)),
    ("vllm-legacy-input", 400, _sglang(
        "This model's maximum context length is 4096 tokens. However, your request has 5000 input "
        "tokens. Please reduce the length of the input messages."), 1000,
     TOO_LONG.format(5000, 4096)),
    ("vllm-legacy-max-tokens", 400, _vllm(
        "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context "
        "length is 4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778). None"),
     None, EXCEED.format(2778, 8000, 4096)),
    ("vllm-renderer-tokens", 400, _vllm(
        "You passed 3000 input tokens and requested 2000 output tokens. However, the model's "
        "context length is only 4096 tokens, resulting in a maximum input length of 2096 tokens. "
        "Please reduce the length of the input prompt."), None, EXCEED.format(3000, 2000, 4096)),
    ("vllm-renderer-characters", 400, _vllm(
        "You passed 90000 input characters and requested 2000 output tokens. However, the model's "
        "context length is only 4096 tokens, resulting in a maximum input length of 2096 tokens "
        "(at most 50304 characters). Please reduce the length of the input prompt."), None,
     EXCEED.format(2097, 2000, 4096)),
    ("vllm-0.18-at-least", 400, _vllm(
        "This model's maximum context length is 32768 tokens. However, you requested 8192 output "
        "tokens and your prompt contains at least 24577 input tokens, for a total of at least "
        "32769 tokens. Please reduce the length of the input prompt or the number of requested "
        "output tokens. (parameter=input_tokens, value=24577)"), None,
     EXCEED.format(24577, 8192, 32768)),
    ("vllm-0.18-prompt-alone", 400, _vllm(
        "This model's maximum context length is 32768 tokens. However, you requested 0 output "
        "tokens and your prompt contains at least 32769 input tokens, for a total of at least "
        "32769 tokens. Please reduce the length of the input prompt or the number of requested "
        "output tokens."), None, TOO_LONG.format(32769, 32768)),
    ("vllm-0.18-characters", 400, _vllm(
        "This model's maximum context length is 65536 tokens. However, you requested 32000 output "
        "tokens and your prompt contains 900000 characters (more than 134144 characters, which is "
        "the upper bound for 33536 input tokens). Please reduce the length of the input prompt or "
        "the number of requested output tokens."), None, EXCEED.format(33537, 32000, 65536)),
    ("vllm-max-tokens-over-window", 400, _vllm(
        "max_tokens=32000cannot be greater than max_model_len=max_total_tokens=16384. Please "
        "request fewer output tokens. (parameter=max_tokens, value=32000)"), 32000,
     EXCEED.format(0, 32000, 16384)),
    ("vllm-engine-decoder-prompt", 400, _vllm(
        "The decoder prompt (length 5000) is longer than the maximum model length of 4096. Make "
        "sure that `max_model_len` is no smaller than the number of text tokens."), 1000,
     TOO_LONG.format(5000, 4096)),
    ("sglang-total", 400, _sglang(
        "Requested token count exceeds the model's maximum context length of 262144 tokens. You "
        "requested a total of 267042 tokens: 201506 tokens from the input messages and 65536 "
        "tokens for the completion. Please reduce the number of tokens in the input messages or "
        "the completion to fit within the limit."), None, EXCEED.format(201506, 65536, 262144)),
    ("sglang-input", 400, _sglang(
        "The input (5000 tokens) is longer than the model's context length (4096 tokens)."), 1000,
     TOO_LONG.format(5000, 4096)),
    ("sglang-scheduler", 400, _sglang(
        "Input length (5000 tokens) exceeds the maximum allowed length (4095 tokens). Use a "
        "shorter input or enable --allow-auto-truncate."), None, TOO_LONG.format(5000, 4095)),
    ("llamacpp-json", 400, {"error": {
        "code": 400, "message": "request (5584 tokens) exceeds the available context size (4096 "
        "tokens), try increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 5584,
        "n_ctx": 4096}}, 1000, TOO_LONG.format(5584, 4096)),
    ("llamacpp-fields-win-over-text", 400, {"error": {
        "code": 400, "message": "Context size has been exceeded.",
        "type": "exceed_context_size_error", "n_prompt_tokens": 3500, "n_ctx": 4096}}, 1000,
     EXCEED.format(3500, 1000, 4096)),
    ("llamacpp-message-only", 400, b"request (5584 tokens) exceeds the available context size "
     b"(4096 tokens), try increasing it", None, TOO_LONG.format(5584, 4096)),
    ("llamacpp-old", 400, {"error": {"code": 400, "message": "input (5000 tokens) is larger than "
     "the max context size (4096 tokens). skipping", "type": "invalid_request_error"}}, None,
     TOO_LONG.format(5000, 4096)),
    ("context-error-with-5xx-status", 500, _sglang(
        "The input (5000 tokens) is longer than the model's context length (4096 tokens)."), None,
     TOO_LONG.format(5000, 4096)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("upstream_status", "body", "max_tokens", "message"),
    [row[1:] for row in CONTEXT_TABLE],
    ids=[row[0] for row in CONTEXT_TABLE],
)
def test_context_length_rewrites(
    upstream_status: int, body: Any, max_tokens: int | None, message: str
) -> None:
    err = errors.from_upstream(upstream_status, _body(body), max_tokens=max_tokens)
    assert (err.status, err.error_type, err.message) == (400, "invalid_request_error", message)
    assert not err.headers  # a 400: no retry-after


@pytest.mark.parametrize(
    ("upstream_status", "body", "status", "message"),
    [
        # llama.cpp's in-generation overflow without the prompt filling the window and no
        # max_tokens known: no numbers that show an overflow, so the words pass (scrubbed).
        (400, {"error": {"code": 400, "message": "Context size has been exceeded.",
                         "type": "exceed_context_size_error", "n_prompt_tokens": 3500,
                         "n_ctx": 4096}}, 400, "Context size has been exceeded."),
        # A rate limit is never read as a context error.
        (429, _vllm("The input (5000 tokens) is longer than the model's context length "
                    "(4096 tokens)."), 429, None),
        (503, _sglang("The input (5000 tokens) is longer than the model's context length "
                      "(4096 tokens)."), 529, "Overloaded"),
    ],
)  # fmt: skip
def test_not_rewritten(upstream_status: int, body: Any, status: int, message: str | None) -> None:
    err = errors.from_upstream(upstream_status, _body(body))
    assert err.status == status
    assert "prompt is too long" not in err.message
    assert "exceed context limit" not in err.message
    if message is not None:
        assert err.message == message


def test_claude_code_regexes_match_the_rewrites() -> None:
    """The two patterns Claude Code 2.1.197 greps for (protocol §4.6)."""
    too_long = re.compile(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", re.I)
    exceed = re.compile(
        r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)"
    )
    first = too_long.search(TOO_LONG.format(5000, 4096))
    second = exceed.search(EXCEED.format(1, 2, 3))
    assert first is not None and first.groups() == ("5000", "4096")
    assert second is not None and second.groups() == ("1", "2", "3")


# --- in-band errors (a 200 reply or an SSE payload holding an error) ----------------------


@pytest.mark.parametrize(
    ("payload", "status", "error_type", "message"),
    [
        ({"error": {"message": "bad tool schema", "code": 400}}, 400, "invalid_request_error",
         "bad tool schema"),
        ({"error": {"message": "bad tool schema", "code": "400"}}, 400, "invalid_request_error",
         "bad tool schema"),
        ({"error": {"message": "slow down", "status_code": 429}}, 429, "rate_limit_error",
         "slow down"),
        (_sglang("top_p must be in (0, 1]"), 400, "invalid_request_error",
         "top_p must be in (0, 1]"),
        ({"error": {"message": "engine died at /opt/vllm/engine.py", "type": "server_error"}},
         500, "api_error", "Internal server error"),
        ({"error": {"message": "x", "code": "context_length_exceeded"}}, 500, "api_error",
         "Internal server error"),
        ({"error": {"message": "x", "code": True}}, 500, "api_error", "Internal server error"),
        ({"error": {"message": "busy", "code": 503}}, 529, "overloaded_error", "Overloaded"),
        ({"error": {"code": 400, "message": "request (5584 tokens) exceeds the available context "
                    "size (4096 tokens), try increasing it", "type": "exceed_context_size_error",
                    "n_prompt_tokens": 5584, "n_ctx": 4096}},
         400, "invalid_request_error", TOO_LONG.format(5584, 4096)),
        ("not an object", 500, "api_error", "Internal server error"),
    ],
)  # fmt: skip
def test_from_inband(payload: Any, status: int, error_type: str, message: str) -> None:
    err = errors.from_inband(payload, hosts=HOSTS)
    assert (err.status, err.error_type, err.message) == (status, error_type, message)


# --- scrubbing ---------------------------------------------------------------------------

SCRUB_TABLE = [
    # (case id, status, message, expected)
    ("5xx-replaced-whole", 500, "a harmless sentence", "Internal server error"),
    ("5xx-any", 503, "x", "Internal server error"),
    ("python-traceback", 400,
     "Invalid request\nTraceback (most recent call last):\n"
     "  File \"/usr/lib/python3.11/site-packages/vllm/entrypoints/serving.py\", line 9, in f\n"
     "    raise ValueError(\"no\")\n"
     "ValueError: no",
     "Invalid request\nValueError: no"),
    ("file-line-alone", 400, "bad input\n  File \"/srv/app/main.py\", line 3, in <module>",
     "bad input"),
    ("js-stack", 400, "TypeError: x is undefined\n    at handler (/srv/app/server.js:10:5)\n"
     "    at next (node:internal/process:1:1)", "TypeError: x is undefined"),
    ("url", 400, "see http://10.1.2.3:8000/v1/chat/completions for details",
     "see [redacted] for details"),
    ("https-url", 400, "fetch https://example.org/x?y=1 failed", "fetch [redacted] failed"),
    ("host-name", 400, "connect to gpu-node-7.internal refused", "connect to [redacted] refused"),
    ("host-name-any-case", 400, "upstream VLLM said no", "upstream [redacted] said no"),
    ("ipv4-port", 400, "peer 192.168.0.12:8000 closed", "peer [redacted] closed"),
    ("ipv6", 400, "peer [fe80::1]:8000 closed", "peer [redacted] closed"),
    ("posix-path", 400, "cannot open /models/qwen/tokenizer.json", "cannot open [redacted]"),
    ("windows-path", 400, "cannot open C:\\models\\tok.json now", "cannot open [redacted] now"),
    ("relative-kept", 400, "use input/output pairs", "use input/output pairs"),
    ("plain-kept", 400, "messages.0.content: Field required", "messages.0.content: Field required"),
    ("empty-after-scrub", 400, "Traceback (most recent call last):\n  File \"/x.py\"",
     "Invalid request"),
    ("empty-429", 429, "", "Rate limited"),
    # every configured upstream's secrets, first (a later rule never cuts one in two)
    ("key-verbatim", 400, f"key {KEY} refused", "key [redacted] refused"),
    ("key-bearer-form", 400, f"header 'Authorization: Bearer {KEY}'",
     "header 'Authorization: [redacted]'"),
    ("key-url-encoded", 400, f"GET ?key={quote(KEY, safe='')}&n=1", "GET ?key=[redacted]&n=1"),
    ("key-url-encoded-lower-hex", 400, "?key=sk-live%2fa1%2fZq7%2bx%3d42", "?key=[redacted]"),
    ("key-slash-kept-encoded", 400, f"?key={quote(KEY)}", "?key=[redacted]"),
    ("key-json-escaped", 400, "body {\"k\": \"" + KEY.replace("/", "\\/") + "\"}",
     "body {\"k\": \"[redacted]\"}"),
    ("key-in-a-url", 400, f"see http://h/x?key={quote(KEY, safe='')}", "see [redacted]"),
    ("key-inside-a-word", 400, f"token=abc{KEY}xyz", "token=abc[redacted]xyz"),
    ("key-of-another-upstream", 400, f"proxy saw {OTHER_KEY}", "proxy saw [redacted]"),
    ("key-5xx", 500, f"key {KEY}", "Internal server error"),
    # host:port tokens, whatever the host
    ("host-port-dotted", 400, "refused by gpu-node-7.internal.example:8000 now",
     "refused by [redacted] now"),
    ("host-port-cluster-name", 400, "connect to gpu-node-7:8000 failed",
     "connect to [redacted] failed"),
    ("host-port-localhost", 400, "localhost:11434 said no", "[redacted] said no"),
    ("host-port-end-of-sentence", 400, "down: api.example.com:443.", "down: [redacted]."),
    ("host-port-and-path", 400, "gpu.example:8000/v1/models is gone", "[redacted] is gone"),
    ("host-port-after-user", 400, "login user@db.internal:5432", "login user@[redacted]"),
    ("file-line-reads-as-host-port", 400, "at serving_chat.py:123", "at [redacted]"),
    ("configured-word-host-port", 400, "vllm:8000 is down", "[redacted]:8000 is down"),
    # IPv6 literals, bare or bracketed, with a port or not
    ("ipv6-bare", 400, "via fd00::17 now", "via [redacted] now"),
    ("ipv6-loopback", 400, "bind ::1 failed", "bind [redacted] failed"),
    ("ipv6-end-of-sentence", 400, "listening on ::1.", "listening on [redacted]."),
    ("ipv6-then-colon", 400, "fd00::17: connection refused", "[redacted]: connection refused"),
    ("ipv6-bracketed", 400, "peer [fd00::17] closed", "peer [redacted] closed"),
    ("ipv6-bracketed-port", 400, "peer [fd00::17]:8000 closed", "peer [redacted] closed"),
    ("ipv6-loopback-bracketed-port", 400, "[::1]:8000 refused", "[redacted] refused"),
    ("ipv6-full", 400, "to 2001:db8:85a3:0:0:8a2e:370:7334 x", "to [redacted] x"),
    ("ipv6-zone", 400, "fe80::1%eth0 down", "[redacted] down"),
    ("ipv6-v4-mapped", 400, "from ::ffff:10.0.0.1 x", "from [redacted] x"),
    ("ipv6-in-quotes", 400, "host 'fd00::17'", "host '[redacted]'"),
    ("ipv6-port-unbracketed", 400, "fd00::17:8000 x", "[redacted] x"),  # an address too
    ("slice-reads-as-ipv6", 400, "x[1::2] is bad", "x[redacted] is bad"),  # the known cost
    # ordinary text that must survive
    ("time-kept", 400, "at 12:30 today", "at 12:30 today"),
    ("time-seconds-kept", 400, "took 01:02:03.5", "took 01:02:03.5"),
    ("iso-time-kept", 400, "since 2024-01-01T12:30:00Z", "since 2024-01-01T12:30:00Z"),
    ("code-scope-kept", 400, "a::b, std::vector, dead::beef, Foo::Bar, f32::EPSILON",
     "a::b, std::vector, dead::beef, Foo::Bar, f32::EPSILON"),
    ("double-colon-alone-kept", 400, "use :: here", "use :: here"),
    ("mac-kept", 400, "nic 00:1a:2b:3c:4d:5e", "nic 00:1a:2b:3c:4d:5e"),
    ("index-kept", 400, "messages[0].content[1]: bad", "messages[0].content[1]: bad"),
    ("list-kept", 400, "expected [1, 2]", "expected [1, 2]"),
    ("ratio-kept", 400, "ratio 1:2", "ratio 1:2"),
    ("word-colon-number-kept", 400, "error:400 at line:12, tokens:4096",
     "error:400 at line:12, tokens:4096"),
    ("ollama-tag-kept", 400, "model qwen2.5:3b-instruct not found",
     "model qwen2.5:3b-instruct not found"),
    ("version-kept", 400, "v1.2.3:45 and 1.5:2", "v1.2.3:45 and 1.5:2"),
    ("key-value-kept", 400, "top_p: must be <= 1", "top_p: must be <= 1"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("status", "message", "expected"),
    [row[1:] for row in SCRUB_TABLE],
    ids=[row[0] for row in SCRUB_TABLE],
)
def test_scrub(status: int, message: str, expected: str) -> None:
    assert errors.scrub(status, message, hosts=HOSTS, secrets=SECRETS) == expected


def test_scrub_caps_at_500_characters() -> None:
    capped = errors.scrub(400, "word " * 200)
    assert len(capped) == 500
    assert capped.endswith("...")
    assert errors.scrub(400, "x" * 500) == "x" * 500


def test_scrub_caps_after_redacting() -> None:
    """A key across the 500-character cap goes whole: it is redacted before the cut."""
    capped = errors.scrub(400, "w" * 490 + " " + KEY + " tail", secrets=SECRETS)
    assert capped == "w" * 490 + " [redac..."
    assert "sk-" not in capped


@pytest.mark.parametrize(
    "text",
    [
        "gpu-node-7.internal.example:8000 " * 3000,
        "a." * 30000 + "x",
        "a-b." * 15000,
        "1:" * 30000 + "x",
        "[1:" * 20000,
        "dead::" * 10000,
    ],
)
def test_scrub_is_linear_on_hostile_text(text: str) -> None:
    """An upstream chooses its error text: no rule may backtrack on it (64 KiB here)."""
    t = time.perf_counter()
    errors.scrub(400, text, hosts=HOSTS, secrets=SECRETS)
    # milliseconds when linear; a backtracking rule takes minutes: the ceiling only has to
    # tell the two apart on a busy machine (a hang guard, not a speed claim)
    assert time.perf_counter() - t < 30.0


# --- upstream secrets: every form, every upstream -----------------------------------------


def test_secrets_of_lists_every_form_of_the_key() -> None:
    cfg = UpstreamConfig("u", "http://u/v1", api_key="sk-a/b+c")
    assert redact.secrets_of(cfg) == (
        "Bearer sk-a/b+c",
        "sk-a/b+c",
        "sk-a%2Fb%2Bc",
        "sk-a%2fb%2bc",
        "sk-a/b%2Bc",
        "sk-a\\/b+c",
    )
    assert redact.secrets_of(UpstreamConfig("u", "http://u/v1")) == ()


def test_secrets_of_escapes_a_key_for_json() -> None:
    key = 'k"e\\y'
    assert json.dumps(key)[1:-1] in redact.secrets_of(UpstreamConfig("u", "http://u", api_key=key))


REDACT_TABLE = [
    # (case id, text, expected): one redactor over every upstream's secrets
    ("bare-key", f"k={KEY}", "k=[redacted]"),
    ("bearer-whole", f"Bearer {KEY}", "[redacted]"),
    ("lower-case-bearer-keeps-its-word", f"bearer {KEY}", "bearer [redacted]"),
    ("url-encoded", f"key={quote(KEY, safe='')}", "key=[redacted]"),
    ("another-upstreams-key", f"{OTHER_KEY} and {KEY}", "[redacted] and [redacted]"),
    ("twice", f"{KEY}{KEY}", "[redacted][redacted]"),
    ("case-differs-kept", KEY.upper(), KEY.upper()),  # not the key
    ("prefix-kept", KEY[:-1] + " ", KEY[:-1] + " "),  # not the key either
    ("nothing-secret", "plain text", "plain text"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"), [r[1:] for r in REDACT_TABLE], ids=[r[0] for r in REDACT_TABLE]
)
def test_redactor(text: str, expected: str) -> None:
    assert SECRETS(text) == expected


def test_scrub_takes_the_strings_themselves() -> None:
    """An upstream client hands its own ``secrets`` (strings); the app, its compiled
    redactor of every upstream's."""
    assert errors.scrub(400, f"Bearer {KEY} x", secrets=(KEY, f"Bearer {KEY}")) == "[redacted] x"
    assert errors.from_upstream(400, _body(_vllm(KEY)), secrets=[KEY]).message == "[redacted]"


def test_redactor_takes_the_longest_secret_first() -> None:
    """A key that holds another upstream's key goes whole, not in two pieces."""
    both = redact.Redactor(["abc", "abcdef"])
    assert both("x abcdef y abc") == "x [redacted] y [redacted]"


def test_redactor_without_secrets_and_its_repr() -> None:
    assert not redact.NO_SECRETS and redact.NO_SECRETS(KEY) == KEY
    assert SECRETS and KEY not in repr(SECRETS) and OTHER_KEY not in repr(SECRETS)


def test_the_app_redacts_every_upstreams_secrets() -> None:
    from prometheus_client import CollectorRegistry

    from gateway.app import build_app
    from gateway.http.keys import SECRETS as SECRETS_KEY
    from gateway.ops import config

    cfg = config.parse(
        {
            "upstreams": {
                "a": {"base_url": "http://a:1/v1", "api_key_env": "A_KEY"},
                "b": {"base_url": "http://b:1/v1", "api_key_env": "B_KEY"},
            },
            "models": [{"name": "m", "upstream": "a", "upstream_model": "m"}],
        },
        "test.toml",
        {"A_KEY": "sk-aaaa", "B_KEY": "sk-bbbb"},
    )
    app = build_app(cfg, CollectorRegistry())
    assert app[SECRETS_KEY]("sk-aaaa sk-bbbb Bearer sk-bbbb") == "[redacted] [redacted] [redacted]"


@pytest.mark.parametrize("upstream_status", [400, 413, 422, 429])
@pytest.mark.parametrize(
    "body",
    [
        _vllm(f"invalid key {KEY} (Bearer {KEY}) at gpu-node-7.internal.example:8000 via fd00::17"),
        _sglang(f"key={quote(KEY, safe='')} of {OTHER_KEY} refused by [fd00::17]:8000"),
        f"plain text: {KEY} {OTHER_KEY}".encode(),
    ],
    ids=["vllm", "sglang", "plain"],
)
def test_from_upstream_redacts_every_secret(upstream_status: int, body: Any) -> None:
    err = errors.from_upstream(upstream_status, _body(body), hosts=HOSTS, secrets=SECRETS)
    assert err.status == (400 if upstream_status == 422 else upstream_status)
    assert "[redacted]" in err.message
    for leak in (KEY, quote(KEY, safe=""), OTHER_KEY, "sk-live", "gpu-node", "fd00", "17:8000"):
        assert leak not in err.message


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"error": {"message": f"bad key {KEY}", "code": 400}}, "bad key [redacted]"),
        (_sglang(f"bad key {KEY}"), "bad key [redacted]"),
        ({"error": {"message": f"bad key {KEY}", "code": 500}}, "Internal server error"),
    ],
)
def test_inband_error_is_scrubbed(payload: dict[str, Any], message: str) -> None:
    err = errors.inband_error(payload, hosts=HOSTS, secrets=SECRETS)
    assert err is not None and err.message == message


@pytest.mark.parametrize(
    "payload",
    [{"choices": [{"delta": {"content": "error"}}]}, {"error": None}, {"object": "chunk"}],
)
def test_inband_error_none_when_no_error(payload: dict[str, Any]) -> None:
    assert errors.inband_error(payload) is None


# --- rendering ------------------------------------------------------------------------------


def test_anthropic_body() -> None:
    err = errors.NotFound("model: nope")
    assert errors.anthropic_body(err) == (
        b'{"type":"error","error":{"type":"not_found_error","message":"model: nope"}}'
    )
    assert errors.anthropic_body(err, "req_1") == (
        b'{"type":"error","error":{"type":"not_found_error","message":"model: nope"},'
        b'"request_id":"req_1"}'
    )


def test_sse_error_event() -> None:
    assert errors.sse_error_event(errors.Overloaded()) == (
        b"event: error\n"
        b'data: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'
    )


@pytest.mark.parametrize(
    ("err", "status", "body"),
    [
        (errors.Overloaded(), 503,
         {"error": {"message": "Overloaded", "type": "server_error", "param": None, "code": 503}}),
        (errors.InvalidRequest("model", "required"), 400,
         {"error": {"message": "model: required", "type": "invalid_request_error", "param": None,
                    "code": 400}}),
        (errors.GatewayError("slow", status=429), 429,
         {"error": {"message": "slow", "type": "rate_limit_exceeded", "param": None,
                    "code": 429}}),
        (errors.UpstreamTimeout(), 504,
         {"error": {"message": "Upstream request timed out", "type": "server_error",
                    "param": None, "code": 504}}),
    ],
)  # fmt: skip
def test_openai_rendering(err: errors.GatewayError, status: int, body: dict[str, Any]) -> None:
    assert errors.openai_status(err) == status
    assert jsonutil.loads(errors.openai_body(err)) == body


def test_pass_through_stream_errors() -> None:
    """Chat and completions streams end with a ``data:`` error body; a Responses stream with
    an ``error`` event (its documented fields), both holding the ``error`` member on which
    the OpenAI SDKs raise."""
    err = errors.UpstreamTimeout()
    assert errors.openai_sse_error(err) == b"data: " + errors.openai_body(err) + b"\n\n"
    frame = errors.responses_sse_error(err)
    assert frame.startswith(b"event: error\ndata: ") and frame.endswith(b"}\n\n")
    event = jsonutil.loads(frame.split(b"data: ", 1)[1])
    assert event == {
        "type": "error",
        "code": "server_error",
        "message": "Upstream request timed out",
        "param": None,
        "error": jsonutil.loads(errors.openai_body(err))["error"],
    }
    with_seq = jsonutil.loads(errors.responses_sse_error(err, 7).split(b"data: ", 1)[1])
    assert with_seq == {**event, "sequence_number": 7}
    assert errors.responses_failure(err) == {
        "code": "server_error",
        "message": "Upstream request timed out",
    }


# --- rendering cannot fail (issue 16) ---------------------------------------------------

_RENDERERS = {
    "anthropic": lambda err: errors.anthropic_body(err, "req_1"),
    "openai": errors.openai_body,
    "sse": errors.sse_error_event,
    "openai_sse": errors.openai_sse_error,
    "responses_sse": lambda err: errors.responses_sse_error(err, 3),
}


def _envelope(frame: bytes) -> dict[str, Any]:
    """The JSON of a body or of an SSE frame's data line, decoded strictly."""
    data = frame.split(b"data: ", 1)[1] if frame.startswith((b"event:", b"data:")) else frame
    frame.decode("utf-8")  # valid UTF-8 throughout
    decoded: dict[str, Any] = json.loads(data)
    return decoded


UNENCODABLE = [
    # (what built the error, the error, the text its message must read)
    (
        "surrogate-in-message",
        lambda: errors.NotFound("model: claude-\ud800"),
        "model: claude-\\ud800",
    ),
    ("low-surrogate-in-path", lambda: errors.InvalidRequest("x.\udfff", "bad"), "x.\\udfff: bad"),
    (
        "surrogate-in-upstream-error",
        lambda: errors.UpstreamError("busy \udc80", status=429),
        "busy \\udc80",
    ),
    ("message-changed-after", lambda: _changed(errors.Overloaded(), "over\ud800"), "over\\ud800"),
    (
        "unencodable-details",
        lambda: errors.InvalidRequest("a", "b", details={"x": float("nan"), "y": "\ud800"}),
        "a: b",
    ),
    (
        "long-message",
        lambda: errors.InvalidRequest("p", "w" * 100_000),
        "p: " + "w" * (errors.MAX_RENDERED - 6) + "...",
    ),
    ("non-ascii-kept", lambda: errors.InvalidRequest("p", "não é válido 😀"), "p: não é válido 😀"),
]


def _changed(err: errors.GatewayError, message: str) -> errors.GatewayError:
    err.message = message
    return err


@pytest.mark.parametrize("renderer", list(_RENDERERS), ids=list(_RENDERERS))
@pytest.mark.parametrize(
    ("make", "shown"), [u[1:] for u in UNENCODABLE], ids=[u[0] for u in UNENCODABLE]
)
def test_rendering_cannot_fail(renderer: str, make: Any, shown: str) -> None:
    err = make()
    body = _envelope(_RENDERERS[renderer](err))
    error = body["error"]
    assert (error["message"] if "message" in error else body["message"]) == shown
    assert "details" not in error or jsonutil.dumpb(error["details"])


def test_echo_is_short_and_encodable() -> None:
    assert errors.echo("x" * 100) == "x" * 64 + "..."
    assert errors.echo("x" * 100, 10) == "x" * 10 + "..."
    assert errors.echo("a\ud800b") == "a\\ud800b"
    assert errors.echo(12345) == "12345"
    assert errors.echo("ok") == "ok"


def test_middleware_renders_an_unencodable_message_in_each_shape() -> None:
    """The chat route's renderer broke on a surrogate model name: aiohttp answered a
    text/plain 500. Both shapes render it as JSON."""
    from aiohttp.test_utils import make_mocked_request

    from gateway.http.keys import EXCHANGE, AppView, Exchange
    from gateway.http.middleware import render_error

    err = errors.NotFound("The model `\ud800` does not exist")
    for api, key in (("chat", "message"), ("messages", "message")):
        request = make_mocked_request("POST", "/llm/v1/x")
        request[EXCHANGE] = Exchange(AppView(), "req_1", api, api == "chat")
        response = render_error(request, err, "req_1")
        assert response.status == 404 and response.content_type == "application/json"
        assert isinstance(response.body, bytes)
        assert json.loads(response.body)["error"][key] == "The model `\\ud800` does not exist"


def test_from_upstream_redacts_a_key_across_the_plain_text_cut() -> None:
    """A plain-text error body is scrubbed whole (it was cut at 8 KiB first): a key, address or
    host name across the cut lost the end that makes it a match, and what precedes it (a
    URL, a traceback) can scrub down to nothing, bringing the rest within the 500 shown."""
    url = "http://proxy.example/" + "a" * 8155  # "Bearer sk-live/" ends past byte 8192
    body = f"{url} Bearer {KEY}".encode()
    assert len(f"{url} Bearer ".encode()) < 8192 < len(body)  # the key straddles the cut
    err = errors.from_upstream(400, body, hosts=HOSTS, secrets=SECRETS)
    assert "sk-live" not in err.message, err.message
    for leak in ("10.0.0.17", "gpu-node-7.internal"):  # an address, a host across the cut
        text = f"{url[: 8192 - 4 - len(leak) // 2]} {leak} tail"
        message = errors.from_upstream(400, text.encode(), hosts=HOSTS).message
        assert message == "[redacted] [redacted] tail", message


@pytest.mark.parametrize(
    ("payload", "status"),
    [
        ({"error": {"message": "bad", "code": 400}}, 400),
        ({"error": {"message": "bad", "code": "429"}}, 429),
        ({"error": {"message": "engine died"}}, 500),  # no code: a 5xx
        ({"error": "plain words"}, 500),
        (_sglang("bad"), 400),
        ({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}, 500),
        ({"choices": [], "error": None}, None),  # no error
        ({"choices": [{"delta": {"content": "error"}}]}, None),
    ],
)
def test_inband_status_is_the_mapped_status_without_mapping(
    monkeypatch: pytest.MonkeyPatch, payload: dict[str, Any], status: int | None
) -> None:
    """The resumable pump asks only whether an in-band error is a 5xx: it gets the status the
    map would give, and the map (run once, later, by the translator) does not run."""
    mapped = errors.inband_error(payload)
    assert (None if mapped is None else mapped.upstream_status) == status

    def no_map(*args: Any, **kw: Any) -> errors.UpstreamError:
        raise AssertionError("mapped")

    monkeypatch.setattr(errors.upstream_map, "from_upstream", no_map)
    assert errors.inband_status(payload) == status
