"""Real agent clients on their default settings, through the gateway, in a tool loop.

The stub's ``agent:NAME:ARGS`` scenario asks for one call of tool NAME, and once the tool's
result is the last message it answers ``The tool said: <result>``: a final answer holding the
tool's text proves the upstream received the tool result.

Protocol facts these tests pin down:

* Both SDKs' tool runners (Python ``client.beta.messages.tool_runner``, anthropic 2.14;
  TypeScript ``client.beta.messages.toolRunner``, @anthropic-ai/sdk 1.14) run over a message
  thread by default (beta ``message-threads-2026-08-12``): the first request carries
  ``thread: {"type": "create"}``, later ones only the new messages and
  ``thread: {"type": "continue", ...}``. Each runner's thread is made with
  ``unsupported_request_behavior`` ``continue_unthreaded`` (Python
  ``anthropic/lib/threads/_beta_threads.py`` ``_for_tool_runner``, TypeScript
  ``Messages._toolRunnerThread``), so on a 400 whose ``error.details.error_code`` is
  ``thread_unsupported_request`` it stops threading and resends the turn, and every later one,
  with the full history and no ``thread``. The gateway answers ``thread`` with exactly that 400.
* langchain-anthropic's ``ChatAnthropic`` and pydantic-ai's ``anthropic:`` models send plain
  Messages requests with the whole history; they are here so that a change in how they shape
  tool calls and results (or in the gateway's reading of them) shows up.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from tests import sdk
from tests.conftest import stub_config, stub_requests
from tests.logs import access_lines
from tests.node import CLIENTS, ts_sdk_ready
from tests.procs import Proc
from tests.waits import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.clients]

QUESTION = "What is the weather in Paris?"
RESULT = "Sunny and 21 C in Paris"
SCENARIO = 'agent:get_weather:{"city": "Paris"}'


def _missing(message: str) -> None:
    """Skip locally, fail in CI, where .ci/run installs every client."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _gateway(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]]
) -> tuple[Proc, str, int]:
    """A gateway routing ``agent-model`` to the agent scenario; (process, base URL with the
    prefix, how many requests the shared stub had seen before)."""
    config = stub_config(stub_url, models=())
    config += (
        '\n[[models]]\nname = "agent-model"\nupstream = "stub"\n'
        f"upstream_model = {json.dumps(SCENARIO)}\n"
    )
    proc, url = gateway_factory(config)
    return proc, url + "/llm", len(stub_requests(stub_url))


def _upstream_requests(stub_url: str, since: int) -> list[dict[str, Any]]:
    """The chat requests the stub saw since the test began (tests run one at a time)."""
    return [
        s["body"]
        for s in stub_requests(stub_url)[since:]
        if s["path"].endswith("/chat/completions")
    ]


def _access(proc: Proc, count: int) -> list[dict[str, Any]]:
    """The gateway's access lines for /v1/messages, once ``count`` are written (flushed every
    0.5 s)."""
    with contextlib.suppress(AssertionError):  # the caller's assertion shows what came
        wait_until(
            lambda: len(access_lines(proc.output(), route="messages")) >= count,
            f"{count} access lines",
            timeout=5,
        )
    return access_lines(proc.output(), route="messages")


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str) or content is None:
        return content or ""
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def _assert_full_history_upstream(stub_url: str, since: int, *, stream: bool) -> None:
    """Two upstream calls, none of them with a thread; the second holds the whole conversation:
    the question, the assistant's tool call and the tool's result."""
    bodies = _upstream_requests(stub_url, since)
    assert len(bodies) == 2, bodies
    first, second = bodies
    for body in (first, second):
        assert "thread" not in body
        assert body.get("stream", False) is stream
        assert [t["function"]["name"] for t in body["tools"]] == ["get_weather"]
    assert [m["role"] for m in first["messages"] if m["role"] != "system"] == ["user"]
    history = [m for m in second["messages"] if m["role"] != "system"]
    assert [m["role"] for m in history] == ["user", "assistant", "tool"], history
    assert QUESTION in _text(history[0])
    (call,) = history[1]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"])["city"] == "Paris"
    assert history[2]["tool_call_id"] == call["id"]
    assert RESULT in _text(history[2])


def _assert_thread_fallback(proc: Proc) -> None:
    """The runner's first request carried a thread and was refused; the resend and the next turn
    went through."""
    access = _access(proc, 3)
    assert [a["status"] for a in access] == [400, 200, 200], access
    assert access[0]["error_type"] == "invalid_request_error"
    assert access[0]["error"].startswith("thread: "), access[0]


# --- the SDKs' tool runners -------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
def test_python_tool_runner_falls_back_from_threads(stub_url, gateway_factory, stream) -> None:
    from anthropic import DefaultHttpxClient, beta_tool

    proc, base, since = _gateway(stub_url, gateway_factory)
    sent: list[dict[str, Any]] = []

    def record(request: Any) -> None:
        sent.append(
            {"beta": request.headers.get("anthropic-beta"), "body": json.loads(request.content)}
        )

    client = sdk.client(
        base,
        api_key="test-key",
        max_retries=0,
        http_client=DefaultHttpxClient(event_hooks={"request": [record]}),
    )
    calls: list[str] = []

    @beta_tool
    def get_weather(city: str) -> str:
        """The current weather in a city.

        Args:
            city: the city's name
        """
        calls.append(city)
        return f"Sunny and 21 C in {city}"

    runner = client.beta.messages.tool_runner(  # type: ignore[call-overload]
        model="agent-model",
        max_tokens=200,
        tools=[get_weather],
        stream=stream,
        messages=[{"role": "user", "content": QUESTION}],
    )
    if stream:  # read each reply's events as an application printing them does
        for message_stream in runner:
            for _event in message_stream:
                pass
    final = runner.until_done()

    assert calls == ["Paris"]
    assert final.stop_reason == "end_turn"
    assert f"The tool said: {RESULT}" in "".join(b.text for b in final.content if b.type == "text")
    # the SDK threaded by default, then fell back to the full history
    assert [s["body"].get("thread") for s in sent] == [{"type": "create"}, None, None]
    assert "message-threads-2026-08-12" in (sent[0]["beta"] or "")
    assert len(sent[2]["body"]["messages"]) == 3
    assert [s["body"].get("stream", False) for s in sent] == [stream] * 3
    _assert_thread_fallback(proc)
    _assert_full_history_upstream(stub_url, since, stream=stream)


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
def test_ts_tool_runner_falls_back_from_threads(stub_url, gateway_factory, stream) -> None:
    ts_sdk_ready()
    proc, base, since = _gateway(stub_url, gateway_factory)
    run = subprocess.run(
        [
            "node",
            str(CLIENTS / "ts_tool_runner.mjs"),
            base,
            "agent-model",
            "stream" if stream else "buffered",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=CLIENTS,
    )
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("{")]
    assert lines, run.stdout + run.stderr
    out = json.loads(lines[-1])
    assert "fatal" not in out, out

    assert out["calls"] == ["Paris"]
    assert out["final"]["stop_reason"] == "end_turn"
    assert f"The tool said: {RESULT}" in _text(out["final"])
    sent = out["sent"]
    assert [(s["status"], s["body"].get("thread")) for s in sent] == [
        (400, {"type": "create"}),
        (200, None),
        (200, None),
    ], sent
    assert "message-threads-2026-08-12" in (sent[0]["beta"] or "")
    assert len(sent[2]["body"]["messages"]) == 3
    assert [s["body"].get("stream", False) for s in sent] == [stream] * 3
    _assert_thread_fallback(proc)
    _assert_full_history_upstream(stub_url, since, stream=stream)


# --- agent frameworks -------------------------------------------------------------------------


def _need(module: str, package: str) -> None:
    try:
        __import__(module)
    except ImportError:
        _missing(f"{package} not installed: pip install '.[test]'")


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
def test_langchain_anthropic_tool_loop(stub_url, gateway_factory, stream) -> None:
    _need("langchain_anthropic", "langchain-anthropic")
    from langchain_anthropic import ChatAnthropic
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    proc, base, since = _gateway(stub_url, gateway_factory)

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return f"Sunny and 21 C in {city}"

    llm = ChatAnthropic(
        model_name="agent-model",
        base_url=base,  # type: ignore[call-arg]
        api_key="test-key",
        max_tokens=200,
        max_retries=0,
        streaming=stream,
        timeout=30,
    )
    model = llm.bind_tools([get_weather])
    messages: list[Any] = [HumanMessage(QUESTION)]
    for _ in range(4):  # a plain agent loop: call the model, run its tool calls, repeat
        reply = model.invoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            messages.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))
    assert not reply.tool_calls
    assert f"The tool said: {RESULT}" in reply.text
    assert [a["status"] for a in _access(proc, 2)] == [200, 200]
    _assert_full_history_upstream(stub_url, since, stream=stream)


async def test_pydantic_ai_agent_with_a_tool(stub_url, gateway_factory, monkeypatch) -> None:
    _need("pydantic_ai.models.anthropic", "pydantic-ai-slim[anthropic]")
    from pydantic_ai import Agent

    proc, base, since = _gateway(stub_url, gateway_factory)
    # what a user of the `anthropic:` model string sets: the SDK's own variables
    monkeypatch.setenv("ANTHROPIC_BASE_URL", base)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    agent = Agent("anthropic:agent-model", instructions="Answer with the tool's help.")
    calls: list[str] = []

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"Sunny and 21 C in {city}"

    async with agent:  # entering the agent is what closes its provider's HTTP client after
        result = await agent.run(QUESTION)
    assert calls == ["Paris"]
    assert f"The tool said: {RESULT}" in result.output
    assert [a["status"] for a in _access(proc, 2)] == [200, 200]
    _assert_full_history_upstream(stub_url, since, stream=False)  # Agent.run asks buffered
