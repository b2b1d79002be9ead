"""What local engines really emit, through a real gateway process to the real SDKs.

The stub upstream's ``golden:CASE`` scenario replays a ``tests/golden/streams/local_*``
recording (streamed, or the completion its deltas join into when asked for a buffered
reply): Qwen3's inline ``<think>`` from llama.cpp without a reasoning parser, a Hermes tool
call written as text, and tool arguments that are not JSON (trailing commas and Python
literals; cut by ``max_tokens``). Each is read with the Python SDK's stream helper
(``get_final_message`` must not raise), with ``messages.create`` (equal to the streamed
message but for ids) and with the TypeScript SDK's ``finalMessage()``; each moves
``llm_gateway_local_fixes_total`` by what it fixed, under its own ``fix`` label.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest

from tests import sdk
from tests.conftest import stub_config
from tests.node import CLIENTS, ts_sdk_ready
from tests.procs import Proc, get, start_gateway

pytestmark = [pytest.mark.e2e]

THINK = "local_llamacpp_qwen3_inline_think"
TEXT_CALL = "local_llamacpp_hermes_text_call"
NOT_JSON = "local_vllm_tool_args_not_json"
CUT = "local_llamacpp_tool_args_cut_by_length"

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
    },
}
FILES = [
    {"name": name, "input_schema": {"type": "object"}}
    for name in ("read_file", "search", "write_file")
]

# case -> (request fields besides model/max_tokens/messages, expected content (generated ids
# blanked), stop_reason, {fix label: count per reply})
CASES: dict[str, tuple[dict[str, Any], list[dict[str, Any]], str, dict[str, int]]] = {
    THINK: (
        {"thinking": {"type": "enabled", "budget_tokens": 1024}},
        [
            {
                "type": "thinking",
                "thinking": "Okay, the user asks for the capital of France. That's Paris.",
            },
            {"type": "text", "text": "The capital of France is **Paris**."},
        ],
        "end_turn",
        {"inline_thinking": 1},
    ),
    TEXT_CALL: (
        {"tools": [WEATHER]},
        [
            {"type": "text", "text": "I'll check the current weather in Paris for you."},
            {
                "type": "tool_use",
                "id": "toolu_generated",
                "name": "get_weather",
                "input": {"city": "Paris", "unit": "celsius"},
            },
        ],
        "tool_use",
        {"text_tool_call": 1},
    ),
    NOT_JSON: (
        {"tools": FILES},
        [
            {
                "type": "tool_use",
                "id": "chatcmpl-tool-4a1b2c3d4e5f",
                "name": "read_file",
                "input": {"path": "notes.txt", "lines": [1, 2, 3]},
            },
            {
                "type": "tool_use",
                "id": "chatcmpl-tool-6a7b8c9d0e1f",
                "name": "search",
                "input": {"query": "weather paris", "exact": True, "limit": None},
            },
        ],
        "tool_use",
        {"tool_arguments_repaired": 2},
    ),
    CUT: (
        {"tools": FILES},
        [
            {
                "type": "tool_use",
                "id": "mXyZ0aBcDeFgHiJkLmNoPqRsTuVwXyZ1",
                "name": "write_file",
                "input": {"path": "notes.txt", "content": "Dear team,\nthe meeting is"},
            }
        ],
        "max_tokens",
        {"tool_arguments_repaired": 1},
    ),
}
FIXES = (
    "tool_arguments_repaired",
    "tool_arguments_unrepairable",
    "text_tool_call",
    "inline_thinking",
)
_GENERATED = re.compile(r"toolu_[0-9A-Za-z]{24}")


class Gateway(NamedTuple):
    api: str  # base URL with the /llm prefix
    root: str  # /metrics is here


@pytest.fixture(scope="module")
def local_gateway(stub_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway routing ``m-golden:CASE`` to each replayed case (defaults: inline_thinking
    auto, text_tool_calls on)."""
    models = tuple(f"golden:{case}" for case in CASES)
    proc: Proc
    proc, url = start_gateway(
        stub_config(stub_url, models=models), tmp_path_factory.mktemp("local-gateway")
    )
    try:
        yield Gateway(url + "/llm", url)
    finally:
        proc.stop()


def _request(case: str) -> dict[str, Any]:
    extra = CASES[case][0]
    return {
        "model": f"m-golden:{case}",
        "max_tokens": 2048,
        "messages": [{"role": "user", "content": "Go."}],
        **extra,
    }


_SAMPLE = re.compile(r"^llm_gateway_local_fixes_total\{([^}]*)\} (\S+)$", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def _fixes(gw: Gateway, case: str) -> dict[str, float]:
    """llm_gateway_local_fixes_total per fix label for the case's model, from /metrics."""
    status, _, raw = get(gw.root + "/metrics")
    assert status == 200
    out = dict.fromkeys(FIXES, 0.0)
    for labels, value in _SAMPLE.findall(raw.decode()):
        found = dict(_LABEL.findall(labels))
        if found.get("model") == f"m-golden:{case}":
            out[found["fix"]] = float(value)
    return out


def _moved(gw: Gateway, case: str, before: dict[str, float], replies: int) -> None:
    after = _fixes(gw, case)
    expected = {fix: float(replies * CASES[case][3].get(fix, 0)) for fix in FIXES}
    assert {fix: after[fix] - before[fix] for fix in FIXES} == expected


def _shape(message: dict[str, Any]) -> dict[str, Any]:
    """A message's content (signatures, and the SDK's unset optional fields, dropped;
    generated tool ids blanked) and stop."""
    content = []
    for block in message["content"]:
        block = {k: v for k, v in block.items() if k != "signature" and v is not None}
        if block["type"] == "tool_use" and _GENERATED.fullmatch(block["id"]):
            block["id"] = "toolu_generated"
        content.append(block)
    return {"content": content, "stop_reason": message["stop_reason"]}


def _signatures(message: dict[str, Any]) -> list[str]:
    return [b["signature"] for b in message["content"] if b["type"] == "thinking"]


@pytest.mark.parametrize("case", list(CASES))
def test_python_sdk_stream_helper(local_gateway: Gateway, case: str) -> None:
    _, content, stop, _ = CASES[case]
    before = _fixes(local_gateway, case)
    client = sdk.client(local_gateway.api, api_key="test-key", max_retries=0)
    with client.messages.stream(**_request(case)) as stream:
        final = stream.get_final_message()
    message = final.model_dump()
    assert _shape(message) == {"content": content, "stop_reason": stop}
    for block in final.content:
        if block.type == "tool_use":
            assert isinstance(block.input, dict)
        if block.type == "thinking":
            assert block.signature
    _moved(local_gateway, case, before, 1)


@pytest.mark.parametrize("case", list(CASES))
def test_python_sdk_buffered_equals_streamed(local_gateway: Gateway, case: str) -> None:
    before = _fixes(local_gateway, case)
    client = sdk.client(local_gateway.api, api_key="test-key", max_retries=0)
    created = client.messages.create(**_request(case)).model_dump()
    with client.messages.stream(**_request(case)) as stream:
        streamed = stream.get_final_message().model_dump()
    _moved(local_gateway, case, before, 2)
    assert _shape(created) == _shape(streamed)
    assert _signatures(created) == _signatures(streamed)  # one key, the same text
    assert created["usage"]["output_tokens"] == streamed["usage"]["output_tokens"]


def _run_ts(url: str, request: dict[str, Any]) -> dict[str, Any]:
    ts_sdk_ready()
    proc = subprocess.run(
        ["node", str(CLIENTS / "ts_local.mjs"), url, json.dumps(request)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=CLIENTS,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout + proc.stderr
    return json.loads(lines[-1])  # type: ignore[no-any-return]


@pytest.mark.clients
@pytest.mark.parametrize("case", list(CASES))
def test_ts_sdk_stream_helper(local_gateway: Gateway, case: str) -> None:
    _, content, stop, _ = CASES[case]
    before = _fixes(local_gateway, case)
    out = _run_ts(local_gateway.api, _request(case))
    assert "fatal" not in out, out
    assert _shape(out["stream"]) == {"content": content, "stop_reason": stop}
    assert out["events"][0] == "message_start" and out["events"][-1] == "message_stop"
    created = _shape(out["created"])
    assert created == _shape(out["stream"])
    _moved(local_gateway, case, before, 2)


def test_buffered_reply_matched_locally_reports_the_upstreams_input_tokens(
    stub_url: str, gateway_factory: Any
) -> None:
    """llama.cpp reports ``prompt_tokens: 31`` on its finish chunk (the replayed golden):
    a buffered reply says 31 whichever way the gateway read the upstream."""
    _, url = gateway_factory(
        stub_config(stub_url, models=(f"golden:{THINK}",), extra_upstream='kind = "llamacpp"')
    )
    client = sdk.client(url + "/llm", api_key="test-key", max_retries=0)
    plain = client.messages.create(**_request(THINK))
    assert plain.usage.input_tokens == 31  # upstream read buffered: from_chat
    matched = client.messages.create(**_request(THINK), stop_sequences=["never-said"])
    assert _shape(matched.model_dump()) == _shape(plain.model_dump())
    assert matched.usage.input_tokens == 31
