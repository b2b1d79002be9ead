"""Bad input from a client, against the real gateway process in front of the scripted stub
(issue 16: every bad input is a 4xx envelope naming the field; decoding is bounded).

Protocol facts these tests rely on:

* A JSON text may hold what is not Unicode: ``\\ud800`` escapes a lone UTF-16 surrogate
  (JavaScript's ``JSON.stringify`` writes one for a string cut inside a pair), and
  ujson also decodes the bytes ``ED A0 80`` to one. Nothing can encode such a string
  again as UTF-8, so the gateway refuses it where it decodes, naming the path.
* ujson accepts ``NaN``, ``Infinity`` and numbers that overflow (``1e400``), and nests
  up to 1,024 levels; Python's own ``json`` recursed past about 980.
* The SDKs retry every 5xx: a client mistake answered as a 500 is sent again. A 413 or a
  400 is not retried; a 529 (503 on the OpenAI routes) with ``retry-after`` is.
* ``/proc/PID/status`` ``VmHWM`` is a process's peak resident set since it started.

Everything runs on 127.0.0.1; every request has a timeout, every loop a count.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import stub_config
from tests.procs import peak_rss_mb, post, start_gateway
from tests.route_bodies import (
    BODY_CAP,
    ROUTES,
    hostile_body,
    route_body,
    run_at_once,
)
from tests.waits import wait_until

pytestmark = pytest.mark.e2e

MAX_VALUES = 1 << 19  # gateway.text.jsonutil.MAX_VALUES
# The documented figure (docs/reliability.md): four maximum-size hostile bodies at once
# keep the gateway under this peak RSS (the Kubernetes pod limit is 1 GiB).
PEAK_RSS_BOUND_MB = 300
HI = [{"role": "user", "content": "hi"}]


def _nest(levels: int, inner: bytes = b"0") -> bytes:
    return b"[" * levels + inner + b"]" * levels


# (case, route -> body, status, the path the message must start with (None: any))
Case = tuple[str, Callable[[str], bytes], int, Callable[[str], str | None]]


def _text_path(route: str) -> str:
    return ROUTES[route][2]


EVERY_ROUTE: list[Case] = [
    ("surrogate-escape-in-text", lambda r: route_body(r, b'"a\\ud800b"'), 400, _text_path),
    ("low-surrogate-in-text", lambda r: route_body(r, b'"\\uDC00"'), 400, _text_path),
    ("surrogate-bytes-in-text", lambda r: route_body(r, b'"\xed\xa0\x80"'), 400, _text_path),
    ("surrogate-as-model", lambda r: route_body(r, model=b'"\\ud800"'), 400, lambda r: "model"),
    # the route's pattern (m-claude-*) would take it: the name is refused before routing
    (
        "surrogate-in-pattern-model",
        lambda r: route_body(r, model=b'"m-claude-\\ud83d"'),
        400,
        lambda r: "model",
    ),
    ("surrogate-key", lambda r: route_body(r, x=b'{"\\ud800":1}'), 400, lambda r: "x"),
    ("nan", lambda r: route_body(r, temperature=b"NaN"), 400, lambda r: "temperature"),
    ("infinity", lambda r: route_body(r, temperature=b"-Infinity"), 400, lambda r: "temperature"),
    ("overflow-1e400", lambda r: route_body(r, x=b"[1e400]"), 400, lambda r: "x.0"),
    (
        "nesting-980-with-nan",
        lambda r: route_body(r, x=_nest(980), y=b'"NaN"'),
        400,
        lambda r: "x.0.0",
    ),
    (
        "nesting-980-with-5e100",
        lambda r: route_body(r, x=_nest(980), y=b"5e100"),
        400,
        lambda r: "x.0.0",
    ),
    ("nesting-5000", lambda r: route_body(r, x=_nest(5000)), 400, lambda r: None),
    ("integer-700-digits", lambda r: route_body(r, x=b"9" * 700), 400, lambda r: None),
    ("not-json", lambda r: b'{"model": "m-ok", ', 400, lambda r: None),
    (
        "too-many-values",
        lambda r: route_body(r, x=b"[" + b"[]," * MAX_VALUES + b"[]]"),
        413,
        lambda r: None,
    ),
]
# count_tokens takes max_tokens unchecked and never forwards it (validate.py)
MESSAGES_ONLY: list[Case] = [
    (
        "max-tokens-400-digits",
        lambda r: route_body(r, max_tokens=b"9" * 400),
        400,
        lambda r: "max_tokens",
    ),
    (
        "max-tokens-2**64",
        lambda r: route_body(r, max_tokens=str(2**64).encode()),
        400,
        lambda r: "max_tokens",
    ),
]
ANTHROPIC_ONLY: list[Case] = [
    (
        "budget-tokens-2**64",
        lambda r: route_body(
            r, max_tokens=b"4096", thinking=b'{"type":"enabled","budget_tokens":%d}' % 2**64
        ),
        400,
        lambda r: "thinking.budget_tokens",
    ),
    ("top-k-2**64", lambda r: route_body(r, top_k=str(2**64).encode()), 400, lambda r: "top_k"),
    (
        "surrogate-in-system",
        lambda r: route_body(r, system=b'[{"type":"text","text":"\\udbff"}]'),
        400,
        lambda r: "system.0.text",
    ),
    (
        "surrogate-in-stop-sequence",
        lambda r: route_body(r, stop_sequences=b'["\\ud800"]'),
        400,
        lambda r: "stop_sequences.0",
    ),
    (
        "surrogate-in-tool-schema",
        lambda r: route_body(r, tools=b'[{"name":"f","input_schema":{"description":"\\ud800"}}]'),
        400,
        lambda r: "tools.0.input_schema.description",
    ),
    (
        "surrogate-in-tool-input",
        lambda r: route_body(
            r,
            messages=b'[{"role":"user","content":"q"},{"role":"assistant",'
            b'"content":[{"type":"tool_use","id":"t","name":"f",'
            b'"input":{"a":"\\ud800"}}]}]',
        ),
        400,
        lambda r: "messages.1.content.0.input.a",
    ),
]
CASES = (
    [(route, case) for route in ROUTES for case in EVERY_ROUTE]
    + [(route, case) for route in ("messages", "count_tokens") for case in ANTHROPIC_ONLY]
    + [("messages", case) for case in MESSAGES_ONLY]
)


def _check_envelope(
    status: int, headers: dict[str, str], raw: bytes, *, openai: bool
) -> dict[str, Any]:
    assert headers["content-type"].startswith("application/json"), (status, raw[:200])
    assert headers.get("request-id")
    body = json.loads(raw)
    if openai:
        error = body["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == status
    else:
        assert body["type"] == "error" and body["request_id"] == headers["request-id"]
        error = body["error"]
        assert set(error) <= {"type", "message", "details"}
    assert isinstance(error["message"], str) and error["message"]
    return error


@pytest.fixture(scope="module")
def gateway(stub_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    proc, url = start_gateway(
        stub_config(stub_url, models=("ok", "claude-*")), tmp_path_factory.mktemp("hostile-input")
    )
    try:
        yield proc, url + "/llm"
    finally:
        proc.stop()


@pytest.mark.parametrize(
    ("route", "case"), CASES, ids=[f"{route}-{case[0]}" for route, case in CASES]
)
def test_bad_input_is_a_4xx_envelope_naming_the_field(gateway: Any, route: str, case: Case) -> None:
    _, base = gateway
    _, build, expected, path_of = case
    path, _, _, openai = ROUTES[route]
    status, headers, raw = post(base + path, build(route), timeout=30)
    assert status == expected, raw[:300]
    error = _check_envelope(status, headers, raw, openai=openai)
    if openai:
        assert error["type"] == "invalid_request_error"
    else:
        assert error["type"] == ("request_too_large" if status == 413 else "invalid_request_error")
    field = path_of(route)
    if field is not None:
        assert error["message"].startswith(field), error["message"]
    raw.decode("utf-8")  # valid UTF-8: no surrogate reached the reply


def test_the_pass_through_forwards_an_integer_it_does_not_bound(gateway: Any) -> None:
    """The chat route asks only for a model: a 2**64 or 400-digit max_tokens goes upstream
    as sent, and whatever the upstream makes of it, the client never gets a 5xx."""
    _, base = gateway
    for value in (str(2**64).encode(), b"9" * 400):
        status, headers, raw = post(
            base + "/v1/chat/completions", route_body("chat", max_tokens=value), timeout=30
        )
        assert status < 500 and headers["content-type"].startswith("application/json"), raw


def test_the_gateway_logged_no_traceback(gateway: Any) -> None:
    """Run last in this module (pytest keeps file order): none of the cases above made the
    gateway log a traceback or an error line."""
    proc, base = gateway
    _, headers, _ = post(base + "/v1/messages", route_body("messages", b'"\\ud800"'), timeout=30)
    # lines are flushed in order, every 0.5 s
    wait_until(
        lambda: headers["request-id"] in proc.output(), "the last request's access line", every=0.05
    )
    out = proc.output()
    assert "Traceback" not in out and "unhandled_error" not in out
    assert '"level":"error"' not in out


# --- amplification: maximum-size hostile bodies at once ------------------------------------


@pytest.mark.timeout(180)
def test_four_maximum_size_hostile_bodies_at_once(stub_url: str, gateway_factory: Any) -> None:
    """Four 32 MiB ``[[],[],...]`` bodies at once, on four JSON routes: each is refused (413
    past the value bound, or 529/503 past ``max_decoding_bytes``) before a value is built;
    the gateway's peak RSS stays under the documented figure and /health keeps answering
    throughout (its latency is printed, not asserted)."""
    proc, url = gateway_factory(stub_config(stub_url, models=("ok",)))
    start_mb = peak_rss_mb(proc.pid)
    routes = ("messages", "count_tokens", "chat", "embeddings")
    jobs = [(ROUTES[r][0], hostile_body(r)) for r in routes]
    assert all(len(body) <= BODY_CAP for _, body in jobs)
    replies, latencies, elapsed = run_at_once(url, jobs)
    peak_mb = peak_rss_mb(proc.pid)
    statuses = sorted(status for _, status, _, _ in replies)
    print(
        f"\n4 x 32 MiB hostile bodies: statuses {statuses}, {elapsed:.2f} s; peak RSS "
        f"{peak_mb:.0f} MB (at start {start_mb:.0f} MB); /health max "
        f"{max(latencies) * 1000:.0f} ms over {len(latencies)} probes"
    )
    openai_paths = {ROUTES[r][0] for r in ROUTES if ROUTES[r][3]}
    for path, status, headers, raw in replies:
        openai = path in openai_paths
        busy = 503 if openai else 529
        assert status in (413, busy), (path, status, raw[:200])
        error = _check_envelope(status, headers, raw, openai=openai)
        if status == 413:
            assert "values" in error["message"]
        else:
            assert headers.get("retry-after") and error["message"].startswith("Overloaded")
    assert 413 in statuses  # at least one was received whole and refused by the bound
    assert peak_mb < PEAK_RSS_BOUND_MB
    assert "Traceback" not in proc.output()


@pytest.mark.timeout(180)
def test_a_32_mib_prompt_full_of_separators_passes_the_bound(
    stub_url: str, gateway_factory: Any
) -> None:
    """The value bound counts separators outside strings: a 32 MiB prompt of CSV (two
    million commas, all inside one string) is counted, not refused (count_tokens on an
    ``openai`` upstream estimates, so the body never needs the stub)."""
    proc, url = gateway_factory(stub_config(stub_url, models=("ok",)))
    row = '1,2,3,[4],{5:6}, "seven"\n'
    text = (row * ((BODY_CAP - 200) // (len(row) + 4))).encode()
    body = route_body("count_tokens", json.dumps(text.decode()).encode())
    assert len(body) <= BODY_CAP and body.count(b",") > 2 * MAX_VALUES
    replies, latencies, elapsed = run_at_once(url, [(ROUTES["count_tokens"][0], body)])
    _, status, _, raw = replies[0]
    print(
        f"\n32 MiB CSV prompt: {status} in {elapsed:.2f} s; /health max "
        f"{max(latencies) * 1000:.0f} ms; peak RSS {peak_rss_mb(proc.pid):.0f} MB"
    )
    assert status == 200, raw[:300]
    assert json.loads(raw)["input_tokens"] > 0
