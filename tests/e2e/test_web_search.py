"""The ``web_search`` server tool run by the gateway against SearXNG (#27), end to end.

Three real processes: the gateway with a ``[web_search]`` table pointing at the SearXNG
stand-in (tests/searxng_stub.py, its JSON shape recorded from SearXNG's source) and the
scripted upstream (tests/stub_upstream.py), which plays a searching model whenever it is
offered a ``web_search`` function: it calls it with the user's text as the query, then
answers ``According to <the first URL it was shown>, that is the answer.``

What the client must see (Anthropic's web search tool docs; SDK 2.15 types): ONE message
holding, per search, a ``server_tool_use`` block (``srvtoolu_`` id, name ``web_search``,
input ``{"query": …}``) then a ``web_search_tool_result`` block (``tool_use_id`` = that id;
content a list of ``web_search_result`` {url, title, encrypted_content, page_age}, or one
``web_search_tool_result_error`` with a documented code), then the model's text; and
``usage.server_tool_use.web_search_requests``. Buffered and streamed alike; the Python SDK
parses it with strict response validation, each raw stream event with pydantic, and the
stream passes tests/anthropic_stream_check.py. A failing, slow, empty or garbled backend is a
result block the model is told about, never a dropped result, a 5xx or a leaked address.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anthropic
import pydantic
import pytest
from anthropic.types import (
    CitationsWebSearchResultLocation,
    Message,
    RawMessageStreamEvent,
    ServerToolUseBlock,
    TextBlock,
    ToolUseBlock,
    WebSearchResultBlock,
    WebSearchToolResultBlock,
    WebSearchToolResultError,
)

from tests import sdk
from tests.anthropic_stream_check import check_stream
from tests.conftest import clear_stub, stub_requests
from tests.logs import access_lines, log_lines
from tests.node import CLIENTS, ts_sdk_ready
from tests.procs import Proc, free_port, start_gateway, wait_http
from tests.searxng_stub import HOSTS, ODD_URL, slug
from tests.waits import wait_until

pytestmark = pytest.mark.e2e

SEARCH_TIMEOUT = 1  # [web_search] timeout: the stub's #slow sleeps 30 s
MAX_RESULTS = 4  # [web_search] max_results: the stub's #many gives 10
TOOL_TYPES = ("web_search_20250305", "web_search_20260209", "web_search_20260318")
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
# gateway alias -> the stub's scenario
ROUTES = {
    "ws": "ok",
    "ws-twice": "search:2",
    "ws-parallel": "search-parallel:2",
    "ws-no-query": 'search-args:{"q": "x"}',
    "ws-bad-json": "search-args:{'query': ",
    "ws-quote": "search-quote",
    "ws-3": "search:3",
    "ws-4": "search:4",
    "ws-tool": 'search-tool:get_weather:{"city": "Paris"}',
}
EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)


def web_search(kind: str = "web_search_20250305", **fields: Any) -> dict:
    return {"type": kind, "name": "web_search", **fields}


def expected_urls(query: str, hosts: tuple[str, ...] = HOSTS) -> list[str]:
    """The URLs the SearXNG stub returns for ``query`` (three results, three hosts)."""
    return [f"https://{h}/{slug(query)}/{n}" for n, h in enumerate(hosts, 1)]


# --- processes ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def searxng() -> Iterator[str]:
    """The SearXNG stand-in: its base URL (``/search``, ``/_requests``)."""
    port = free_port()
    proc = Proc(
        [
            sys.executable,
            str(Path(__file__).resolve().parents[1] / "searxng_stub.py"),
            str(port),
            "30",
        ]
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc.popen)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


def searches(searxng: str, *, clear: bool = True) -> list[dict]:
    """The search requests the stub has seen (their parameters), then forgets them."""
    with urllib.request.urlopen(searxng + "/_requests", timeout=5) as resp:
        seen = json.loads(resp.read())
    if clear:
        req = urllib.request.Request(searxng + "/_requests", method="DELETE")
        with urllib.request.urlopen(req, timeout=5) as resp:
            resp.read()
    return [s["params"] for s in seen]


def config(stub_url: str, searxng: str | None, extra: str = "") -> str:
    text = f"""
[server]
host = "127.0.0.1"
port = 8080
prefix = "/llm"

[upstreams.stub]
base_url = "{stub_url}"
connect_timeout = 2
header_timeout = 3
idle_timeout = 3
"""
    for name, scenario in ROUTES.items():  # json.dumps quotes as a TOML basic string does
        text += (
            f'\n[[models]]\nname = {json.dumps(name)}\nupstream = "stub"\n'
            f"upstream_model = {json.dumps(scenario)}\n"
        )
    if searxng is not None:
        text += (
            f'\n[web_search]\nsearxng_url = "{searxng}"\ntimeout = {SEARCH_TIMEOUT}\n'
            f"max_results = {MAX_RESULTS}\n{extra}"
        )
    return text


@pytest.fixture(scope="module")
def gateway(stub_url: str, searxng: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway with ``[web_search]``: its base URL with the /llm prefix."""
    proc, url = start_gateway(config(stub_url, searxng), tmp_path_factory.mktemp("ws"))
    try:
        yield url + "/llm"
    finally:
        proc.stop()


@pytest.fixture
def client(gateway: str, stub_url: str, searxng: str) -> anthropic.Anthropic:
    clear_stub(stub_url)
    searches(searxng)
    return sdk.client(gateway, api_key="k", max_retries=0, _strict_response_validation=True)


def raw_stream(base: str, body: dict) -> list[dict]:
    """POST a streamed request; the events, checked well-formed and each parsed by the SDK's
    own event types."""
    req = urllib.request.Request(
        base + "/v1/messages",
        method="POST",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={
            "content-type": "application/json",
            "x-api-key": "k",
            "anthropic-version": "2023-06-01",
        },
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
        raw = resp.read()
    events = check_stream(raw)
    for event in events:
        if event["type"] != "ping":
            EVENT.validate_python(event)
    return events


def _tool_messages(body: dict) -> list[dict]:
    return [m for m in body["messages"] if m["role"] == "tool"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content)


# --- one search, buffered and streamed --------------------------------------------------


def check_searched(msg: Message, query: str) -> tuple[ServerToolUseBlock, WebSearchToolResultBlock]:
    """The reply of one successful search of the stub for ``query``."""
    kinds = (ServerToolUseBlock, WebSearchToolResultBlock, TextBlock)  # or their subclasses
    assert len(msg.content) == 3 and all(
        isinstance(b, k) for b, k in zip(msg.content, kinds, strict=True)
    ), msg.content
    use, result, text = msg.content
    assert isinstance(use, ServerToolUseBlock) and isinstance(result, WebSearchToolResultBlock)
    assert use.id.startswith("srvtoolu_") and use.name == "web_search"
    assert use.input == {"query": query}
    assert result.tool_use_id == use.id
    assert isinstance(result.content, list)
    assert all(isinstance(r, WebSearchResultBlock) for r in result.content)
    urls = expected_urls(query)
    assert [r.url for r in result.content] == urls
    assert [r.title for r in result.content] == [f"{query} - result {n}" for n in (1, 2, 3)]
    assert all(r.encrypted_content for r in result.content)
    # the stub's second result has no publishedDate; the others are dated in 2026
    ages = [r.page_age for r in result.content]
    assert ages[1] is None and all(a and "2026" in a for a in (ages[0], ages[2])), ages
    assert isinstance(text, TextBlock)
    assert text.text == f"According to {urls[0]}, that is the answer."
    assert not text.citations  # never invented
    assert msg.stop_reason == "end_turn"
    assert msg.usage.server_tool_use is not None
    assert msg.usage.server_tool_use.web_search_requests == 1
    return use, result


def check_upstream_loop(stub_url: str, query: str, use_id: str) -> dict:
    """Two upstream calls: the first offers ``web_search`` as a function with one string
    parameter; the second carries the call and a tool message listing every result (title,
    URL verbatim, snippet). -> the tool message."""
    first, second = (r["body"] for r in stub_requests(stub_url))
    (tool,) = first["tools"]
    assert tool["type"] == "function" and tool["function"]["name"] == "web_search"
    assert tool["function"]["description"]
    params = tool["function"]["parameters"]
    assert params["type"] == "object" and params["required"] == ["query"]
    assert list(params["properties"]) == ["query"]
    assert params["properties"]["query"]["type"] == "string"
    call = next(m for m in second["messages"] if m.get("tool_calls"))["tool_calls"][0]
    assert call["function"]["name"] == "web_search" and call["id"] == use_id
    assert json.loads(call["function"]["arguments"]) == {"query": query}
    (message,) = _tool_messages(second)
    assert message["tool_call_id"] == use_id
    text = _text(message["content"])
    for n, url in enumerate(expected_urls(query), 1):
        assert url in text and f"{query} - result {n}" in text
        assert f"Snippet {n} about {query}." in text
    return message


@pytest.mark.parametrize("kind", TOOL_TYPES)
def test_buffered_reply_carries_the_search_and_its_results(
    client: anthropic.Anthropic, stub_url: str, searxng: str, kind: str
) -> None:
    query = "gateway release notes"
    raw = client.messages.with_raw_response.create(
        model="ws",
        max_tokens=200,
        messages=[{"role": "user", "content": query}],
        tools=[web_search(kind, max_uses=2)],
    )
    msg = raw.parse()  # strict: every block validated against the SDK's types
    use, _ = check_searched(msg, query)
    body = json.loads(raw.http_response.text)
    assert list(body["content"][0]) == ["type", "id", "name", "input"]
    assert list(body["content"][1]) == ["type", "tool_use_id", "content"]
    assert all(
        list(r) == ["type", "url", "title", "encrypted_content", "page_age"]
        for r in body["content"][1]["content"]
    )
    check_upstream_loop(stub_url, query, use.id)
    (asked,) = searches(searxng)
    assert asked["q"] == query and asked["format"] == "json"


def test_streamed_reply_equals_the_buffered_one(
    client: anthropic.Anthropic, gateway: str, stub_url: str, searxng: str
) -> None:
    query = "gateway release notes"
    ask = {
        "model": "ws",
        "max_tokens": 200,
        "messages": [{"role": "user", "content": query}],
        "tools": [web_search(max_uses=2)],
    }
    buffered = client.messages.create(**ask)
    clear_stub(stub_url)
    with client.messages.stream(**ask) as stream:
        streamed = stream.get_final_message()
    check_searched(streamed, query)
    check_upstream_loop(stub_url, query, streamed.content[0].id)
    # the same search seals the same results: the whole content matches but the ids
    for b, s in zip(buffered.content, streamed.content, strict=True):
        assert b.model_dump(exclude={"id", "tool_use_id"}) == s.model_dump(
            exclude={"id", "tool_use_id"}
        )
    assert streamed.usage.server_tool_use == buffered.usage.server_tool_use
    Message.model_validate(streamed.model_dump(), strict=False)

    events = raw_stream(gateway, ask)
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert [s["type"] for s in starts] == ["server_tool_use", "web_search_tool_result", "text"]
    assert starts[0]["input"] == {}  # the query comes as input_json_delta
    pieces = [
        e["delta"]["partial_json"]
        for e in events
        if e["type"] == "content_block_delta" and e["index"] == 0
    ]
    assert json.loads("".join(pieces)) == {"query": query}
    assert [r["url"] for r in starts[1]["content"]] == expected_urls(query)
    assert not [e for e in events if e["type"] == "content_block_delta" and e["index"] == 1]
    (final,) = [e for e in events if e["type"] == "message_delta"]
    assert final["usage"]["server_tool_use"]["web_search_requests"] == 1
    assert final["delta"]["stop_reason"] == "end_turn"


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
def test_a_quoted_snippet_is_cited(client: anthropic.Anthropic, gateway: str, stream: bool) -> None:
    """The model's answer holds the first result's snippet verbatim: that passage is a text
    block of its own with a ``web_search_result_location`` citation of that result (streamed:
    its ``citations_delta`` before its text); the text around it has no citation."""
    query = "gateway release notes"
    snippet = f"Snippet 1 about {query}."
    ask = {
        "model": "ws-quote",
        "max_tokens": 200,
        "tools": [web_search()],
        "messages": [{"role": "user", "content": query}],
    }
    if stream:
        events = raw_stream(gateway, ask)
        cited = [
            e
            for e in events
            if e["type"] == "content_block_delta" and e["delta"]["type"] == "citations_delta"
        ]
        assert len(cited) == 1
        texts = [
            e
            for e in events
            if e["type"] == "content_block_delta"
            and e["index"] == cited[0]["index"]
            and e["delta"]["type"] == "text_delta"
        ]
        assert events.index(cited[0]) < events.index(texts[0])
        assert "".join(e["delta"]["text"] for e in texts) == snippet
        with client.messages.stream(**ask) as s:
            msg = s.get_final_message()
    else:
        msg = client.messages.create(**ask)
    result = msg.content[1]
    assert isinstance(result, WebSearchToolResultBlock) and isinstance(result.content, list)
    texts = [b for b in msg.content if isinstance(b, TextBlock)]
    assert "".join(b.text for b in texts) == (
        f"According to {expected_urls(query)[0]}: {snippet} That is all."
    )
    quoted = [b for b in texts if b.citations]
    assert len(quoted) == 1 and quoted[0].text == snippet, texts
    (citation,) = quoted[0].citations or []
    assert isinstance(citation, CitationsWebSearchResultLocation)
    assert citation.url == result.content[0].url and citation.title == result.content[0].title
    assert citation.cited_text == snippet and citation.encrypted_index


def test_a_cited_answer_sent_back_reaches_the_model_whole(
    client: anthropic.Anthropic, stub_url: str
) -> None:
    """The reply of :func:`test_a_quoted_snippet_is_cited` sent back, cited blocks and all:
    the upstream gets the answer's text as the model wrote it, in one piece."""
    ask = [{"role": "user", "content": "gateway release notes"}]
    msg = client.messages.create(
        model="ws-quote", max_tokens=200, tools=[web_search()], messages=ask
    )
    wrote = "".join(b.text for b in msg.content if isinstance(b, TextBlock))
    assert any(isinstance(b, TextBlock) and b.citations for b in msg.content)
    history = [
        *ask,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]},
        {"role": "user", "content": "thanks"},
    ]
    clear_stub(stub_url)
    client.messages.create(model="ws-quote", max_tokens=200, tools=[web_search()], messages=history)
    body = stub_requests(stub_url)[0]["body"]
    said = [
        _text(m["content"])
        for m in body["messages"]
        if m["role"] == "assistant" and m.get("content")
    ]
    assert said == [wrote]


# --- history: the search replayed -------------------------------------------------------


def test_replayed_search_reaches_the_upstream_as_the_model_saw_it(
    client: anthropic.Anthropic, stub_url: str, searxng: str
) -> None:
    """The client sends the blocks back (as Claude Code and the SDK tool runners do): the
    upstream gets the same tool call and the same tool message again, opened from
    ``encrypted_content``; a result sealed by someone else is shown by title and URL."""
    query = "gateway release notes"
    ask = [{"role": "user", "content": query}]
    tools = [web_search(max_uses=2)]
    first = client.messages.create(model="ws", max_tokens=200, messages=ask, tools=tools)
    use, _ = check_searched(first, query)
    seen = check_upstream_loop(stub_url, query, use.id)
    history = [
        *ask,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": "And the one before?"},
    ]
    clear_stub(stub_url)
    second = client.messages.create(model="ws", max_tokens=200, messages=history, tools=tools)
    check_searched(second, "And the one before?")
    body = stub_requests(stub_url)[0]["body"]
    call = next(m for m in body["messages"] if m.get("tool_calls"))["tool_calls"][0]
    assert call["function"]["name"] == "web_search"
    assert json.loads(call["function"]["arguments"]) == {"query": query}
    replayed = _tool_messages(body)[0]
    assert replayed["tool_call_id"] == call["id"]
    assert _text(replayed["content"]) == _text(seen["content"])  # as the model saw it
    assert body["messages"][-1] == {"role": "user", "content": "And the one before?"}

    # a result this gateway did not seal: kept by its title and URL, never refused
    forged = json.loads(json.dumps(history))
    for r in forged[1]["content"][1]["content"]:
        r["encrypted_content"] = "Eo8BCioIAhgBIiQ" + "A" * 40
    clear_stub(stub_url)
    third = client.messages.create(model="ws", max_tokens=200, messages=forged, tools=tools)
    assert third.stop_reason == "end_turn"
    text = _text(_tool_messages(stub_requests(stub_url)[0]["body"])[0]["content"])
    assert all(url in text for url in expected_urls(query))


@pytest.mark.parametrize("marker", ["#fail", "#empty"])
def test_replayed_failed_search_tells_the_upstream_again(
    client: anthropic.Anthropic, stub_url: str, marker: str
) -> None:
    """An error block (or an empty result list) sent back: the upstream gets the search's
    call and a tool message saying what the model was told then, never a dropped call (a
    tool call without its answer is refused by the engines)."""
    ask = [{"role": "user", "content": f"old news {marker}"}]
    first = client.messages.create(model="ws", max_tokens=200, messages=ask, tools=[web_search()])
    seen = _tool_messages(stub_requests(stub_url)[-1]["body"])[0]
    history = [
        *ask,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": "try again"},
    ]
    clear_stub(stub_url)
    client.messages.create(model="ws", max_tokens=200, messages=history, tools=[web_search()])
    body = stub_requests(stub_url)[0]["body"]
    (call,) = [c for m in body["messages"] for c in m.get("tool_calls") or ()]
    (replayed,) = _tool_messages(body)
    assert replayed["tool_call_id"] == call["id"]
    assert _text(replayed["content"]) == _text(seen["content"])


def test_search_then_client_tool_then_answer(client: anthropic.Anthropic, stub_url: str) -> None:
    """The model searches, then calls a client tool: the reply ends with stop_reason
    tool_use after the search blocks; the client's tool result, sent back with the search,
    gets the answer."""
    query = "weather where the gateway was released"
    ask = [{"role": "user", "content": query}]
    tools = [web_search(), WEATHER]
    with client.messages.stream(
        model="ws-tool", max_tokens=200, messages=ask, tools=tools
    ) as stream:  # type: ignore[arg-type]
        first = stream.get_final_message()
    assert [b.type for b in first.content] == [
        "server_tool_use",
        "web_search_tool_result",
        "tool_use",
    ], first.content
    assert first.stop_reason == "tool_use"
    call = first.content[2]
    assert isinstance(call, ToolUseBlock)
    assert call.name == "get_weather" and call.input == {"city": "Paris"}
    assert first.usage.server_tool_use and first.usage.server_tool_use.web_search_requests == 1
    history = [
        *ask,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"}],
        },
    ]
    clear_stub(stub_url)
    second = client.messages.create(model="ws-tool", max_tokens=200, messages=history, tools=tools)  # type: ignore[arg-type]
    assert [b.type for b in second.content] == ["text"]
    assert second.content[0].text == (  # type: ignore[union-attr]
        f"According to {expected_urls(query)[0]}, that is the answer."
    )
    (body,) = (r["body"] for r in stub_requests(stub_url))
    names = [c["function"]["name"] for m in body["messages"] for c in m.get("tool_calls") or ()]
    assert names == ["web_search", "get_weather"]
    assert _tool_messages(body)[-1]["content"] in (
        "Sunny, 21 C",
        [{"type": "text", "text": "Sunny, 21 C"}],
    )


# --- the tool's options ---------------------------------------------------------------


def test_max_uses_exceeded_is_a_result_block(
    client: anthropic.Anthropic, gateway: str, stub_url: str, searxng: str
) -> None:
    """The model searches twice under ``max_uses: 1``: the second search is not run; its
    result block is the error ``max_uses_exceeded``, and the model is told so."""
    query = "two searches please"
    ask = {
        "model": "ws-twice",
        "max_tokens": 200,
        "messages": [{"role": "user", "content": query}],
        "tools": [web_search(max_uses=1)],
    }
    msg = client.messages.create(**ask)
    assert [b.type for b in msg.content] == [
        "server_tool_use",
        "web_search_tool_result",
        "server_tool_use",
        "web_search_tool_result",
        "text",
    ], msg.content
    first, second = msg.content[1], msg.content[3]
    assert isinstance(first, WebSearchToolResultBlock) and isinstance(first.content, list)
    assert isinstance(second, WebSearchToolResultBlock)
    assert isinstance(second.content, WebSearchToolResultError)
    assert second.content.error_code == "max_uses_exceeded"
    assert second.tool_use_id == msg.content[2].id  # type: ignore[union-attr]
    assert msg.usage.server_tool_use and msg.usage.server_tool_use.web_search_requests == 1
    assert [s["q"] for s in searches(searxng)] == [query]  # one search ran
    last = stub_requests(stub_url)[-1]["body"]
    told = _tool_messages(last)
    assert len(told) == 2 and "max" in _text(told[1]["content"]).lower()
    events = raw_stream(gateway, ask)
    results = [
        e["content_block"]
        for e in events
        if e["type"] == "content_block_start"
        and e["content_block"]["type"] == "web_search_tool_result"
    ]
    assert results[1]["content"] == {
        "type": "web_search_tool_result_error",
        "error_code": "max_uses_exceeded",
    }


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
def test_parallel_searches_each_get_their_result(
    client: anthropic.Anthropic, gateway: str, stub_url: str, searxng: str, stream: bool
) -> None:
    """The model calls web_search twice in one turn (parallel tool calls, as vLLM emits
    them): both are run, each result block names its own search, after it."""
    query = "compare two releases"
    ask = {
        "model": "ws-parallel",
        "max_tokens": 200,
        "tools": [web_search(max_uses=5)],
        "messages": [{"role": "user", "content": query}],
    }
    if stream:
        raw_stream(gateway, ask)  # well-formed
        with client.messages.stream(**ask) as s:
            msg = s.get_final_message()
    else:
        msg = client.messages.create(**ask)
    kinds = [b.type for b in msg.content]
    assert sorted(kinds) == sorted(
        [
            "server_tool_use",
            "server_tool_use",
            "web_search_tool_result",
            "web_search_tool_result",
            "text",
        ]
    )
    assert kinds[-1] == "text", kinds
    uses = {b.id: i for i, b in enumerate(msg.content) if isinstance(b, ServerToolUseBlock)}
    results = [(i, b) for i, b in enumerate(msg.content) if isinstance(b, WebSearchToolResultBlock)]
    assert sorted(b.tool_use_id for _, b in results) == sorted(uses)
    assert all(uses[b.tool_use_id] < i for i, b in results)  # each after its search
    for _, b in results:
        (use,) = [
            u for u in msg.content if isinstance(u, ServerToolUseBlock) and u.id == b.tool_use_id
        ]
        assert isinstance(b.content, list)
        assert [r.url for r in b.content] == expected_urls(use.input["query"])[:MAX_RESULTS]
    assert sorted(u.input["query"] for u in msg.content if isinstance(u, ServerToolUseBlock)) == [
        f"{query} (part 1)",
        f"{query} (part 2)",
    ]
    assert msg.usage.server_tool_use and msg.usage.server_tool_use.web_search_requests == 2
    assert sorted(s["q"] for s in searches(searxng)) == sorted(
        [f"{query} (part 1)", f"{query} (part 2)"] * (2 if stream else 1)
    )
    last = stub_requests(stub_url)[-1]["body"]
    calls = [c for m in last["messages"] for c in m.get("tool_calls") or ()]
    told = _tool_messages(last)
    assert sorted(c["id"] for c in calls) == sorted(m["tool_call_id"] for m in told)
    assert sorted(c["id"] for c in calls) == sorted(uses)


@pytest.mark.parametrize("model", ["ws-no-query", "ws-bad-json"])
def test_a_search_call_without_a_query_is_invalid_tool_input(
    client: anthropic.Anthropic, searxng: str, model: str
) -> None:
    """The model's arguments have no ``query`` string (or are not JSON): no search is run;
    the result block is ``invalid_tool_input`` and the reply is still whole."""
    msg = client.messages.create(
        model=model,
        max_tokens=200,
        tools=[web_search()],
        messages=[{"role": "user", "content": "anything"}],
    )
    assert [b.type for b in msg.content] == ["server_tool_use", "web_search_tool_result", "text"], (
        msg.content
    )
    result = msg.content[1]
    assert isinstance(result, WebSearchToolResultBlock)
    assert isinstance(result.content, WebSearchToolResultError)
    assert result.content.error_code == "invalid_tool_input"
    assert isinstance(msg.content[0], ServerToolUseBlock)
    assert isinstance(msg.content[0].input, dict)  # always an object, as the SDKs expect
    assert searches(searxng) == []


def test_searching_on_past_max_uses_pauses_the_turn(
    client: anthropic.Anthropic, gateway: str, searxng: str
) -> None:
    """A model that keeps searching past ``max_uses`` is told ``max_uses_exceeded`` each
    time; two rounds past the limit the reply ends with ``stop_reason: pause_turn`` (the
    API's stop for a turn the client resumes), whole and well-formed."""
    ask = {
        "model": "ws-4",
        "max_tokens": 200,
        "tools": [web_search(max_uses=1)],
        "messages": [{"role": "user", "content": "keep searching"}],
    }
    msg = client.messages.create(**ask)
    assert msg.stop_reason == "pause_turn"
    assert [b.type for b in msg.content] == ["server_tool_use", "web_search_tool_result"] * 3
    errors = [
        b.content.error_code
        for b in msg.content
        if isinstance(b, WebSearchToolResultBlock)
        and isinstance(b.content, WebSearchToolResultError)
    ]
    assert errors == ["max_uses_exceeded", "max_uses_exceeded"]
    assert msg.usage.server_tool_use and msg.usage.server_tool_use.web_search_requests == 1
    assert len(searches(searxng)) == 1
    events = raw_stream(gateway, ask)
    (final,) = [e for e in events if e["type"] == "message_delta"]
    assert final["delta"]["stop_reason"] == "pause_turn"


@pytest.fixture(scope="module")
def tight_gateway(
    stub_url: str, searxng: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A gateway whose searches may show the model 400 characters per request."""
    proc, url = start_gateway(
        config(stub_url, searxng, "max_request_chars = 400\n"), tmp_path_factory.mktemp("ws-tight")
    )
    try:
        yield url + "/llm"
    finally:
        proc.stop()


def test_result_text_is_capped_per_request(tight_gateway: str, stub_url: str, searxng: str) -> None:
    """Three searches under a 400-character budget: the results shown shrink as it runs
    out (a search's first result always fits), and a search past it is not run:
    ``request_too_large``. The client's blocks match what the model was shown."""
    clear_stub(stub_url)
    searches(searxng)
    client = sdk.client(tight_gateway, api_key="k", max_retries=0, _strict_response_validation=True)
    msg = client.messages.create(
        model="ws-3",
        max_tokens=200,
        tools=[web_search(max_uses=5)],
        messages=[{"role": "user", "content": "a long query about many things"}],
    )
    results = [b.content for b in msg.content if isinstance(b, WebSearchToolResultBlock)]
    assert len(results) == 3 and msg.stop_reason == "end_turn"
    first, second, third = results
    assert isinstance(first, list) and isinstance(second, list)
    assert 1 <= len(second) <= len(first) < 3
    assert isinstance(third, WebSearchToolResultError)
    assert third.error_code == "request_too_large"
    assert msg.usage.server_tool_use and msg.usage.server_tool_use.web_search_requests == 2
    assert len(searches(searxng)) == 2  # the third was not run
    told = [_text(m["content"]) for m in _tool_messages(stub_requests(stub_url)[-1]["body"])]
    assert len(told) == 3
    for shown, block in zip(told, (first, second), strict=False):
        assert all(r.url in shown for r in block)
    kept = sum(len(b) for b in (first, second))
    assert sum(shown.count("https://") for shown in told[:2]) == kept


@pytest.mark.parametrize(
    ("option", "keep"),
    [
        ({"allowed_domains": ["news.example.com"]}, lambda host: host == "news.example.com"),
        ({"blocked_domains": ["docs.example.org"]}, lambda host: host != "docs.example.org"),
    ],
)
def test_domain_lists_are_honoured(
    client: anthropic.Anthropic, searxng: str, option: dict, keep: Any
) -> None:
    msg = client.messages.create(
        model="ws",
        max_tokens=200,
        messages=[{"role": "user", "content": "release notes"}],
        tools=[web_search(**option)],
    )
    result = msg.content[1]
    assert isinstance(result, WebSearchToolResultBlock) and isinstance(result.content, list)
    hosts = [urlsplit(r.url).hostname for r in result.content]
    assert hosts and all(keep(h) for h in hosts), hosts
    assert searches(searxng)  # the backend was asked


@pytest.mark.parametrize(
    ("location", "language"),
    [
        (
            {"type": "approximate", "city": "Berlin", "country": "DE", "timezone": "Europe/Berlin"},
            "de-DE",
        ),
        ({"type": "approximate", "country": "US"}, "en-US"),
        ({"type": "approximate", "city": "Zurich"}, None),  # no country: the instance's default
        (None, None),
    ],
)
def test_user_location_picks_the_search_language(
    client: anthropic.Anthropic, searxng: str, location: dict | None, language: str | None
) -> None:
    tool = web_search(**({"user_location": location} if location else {}))
    msg = client.messages.create(
        model="ws",
        max_tokens=200,
        tools=[tool],
        messages=[{"role": "user", "content": "local news"}],
    )
    assert msg.content[1].type == "web_search_tool_result"
    (asked,) = searches(searxng)
    assert asked.get("language") == language, asked


def test_results_are_capped_per_search(client: anthropic.Anthropic, stub_url: str) -> None:
    """The backend returns ten results; ``max_results`` of them reach the client and the
    model, the first ones, in the backend's order."""
    query = "everything #many"
    msg = client.messages.create(
        model="ws",
        max_tokens=200,
        tools=[web_search()],
        messages=[{"role": "user", "content": query}],
    )
    result = msg.content[1]
    assert isinstance(result, WebSearchToolResultBlock) and isinstance(result.content, list)
    assert [r.url for r in result.content] == [
        f"https://{HOSTS[i % 3]}/everything/{i + 1}" for i in range(MAX_RESULTS)
    ]
    told = _text(_tool_messages(stub_requests(stub_url)[-1]["body"])[0]["content"])
    assert f"/everything/{MAX_RESULTS}" in told and f"/everything/{MAX_RESULTS + 1}" not in told


def test_awkward_results_still_make_valid_blocks(
    client: anthropic.Anthropic, stub_url: str
) -> None:
    """SearXNG results with an empty title, a URL with a query string and non-ASCII path, a
    date with a UTC offset, a long multi-line snippet and an ftp:// URL: the client gets
    blocks the SDK validates (a title always, URLs verbatim, only http(s)), the model one
    bounded line per snippet."""
    query = "awkward #odd"
    msg = client.messages.create(
        model="ws",
        max_tokens=200,
        tools=[web_search()],
        messages=[{"role": "user", "content": query}],
    )
    result = msg.content[1]
    assert isinstance(result, WebSearchToolResultBlock) and isinstance(result.content, list)
    urls = [r.url for r in result.content]
    assert ODD_URL in urls and not any(u.startswith("ftp:") for u in urls), urls
    assert len(urls) == MAX_RESULTS and urls[1] == ODD_URL  # the 2nd (ftp://) skipped
    assert all(r.title for r in result.content)
    assert result.content[2].page_age and "2026" in result.content[2].page_age
    told = _text(_tool_messages(stub_requests(stub_url)[-1]["body"])[0]["content"])
    assert ODD_URL in told and "ftp://" not in told
    long = next(line for line in told.splitlines() if "A long line of page text." in line)
    assert "\t" not in long and len(long) < 200 * len("A long line of page text.")


def test_count_tokens_takes_the_tool_and_its_history(client: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "gateway release notes"}]
    reply = client.messages.create(model="ws", max_tokens=200, messages=ask, tools=[web_search()])
    history = [
        *ask,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
        {"role": "user", "content": "more?"},
    ]
    bare = client.messages.count_tokens(model="ws", messages=ask)
    tool = client.messages.count_tokens(model="ws", messages=ask, tools=[web_search()])
    replay = client.messages.count_tokens(model="ws", messages=history, tools=[web_search()])
    assert bare.input_tokens < tool.input_tokens < replay.input_tokens


def _metric(gateway: str, name: str, **labels: str) -> float:
    """A sample of the gateway's /metrics (0 when absent)."""
    with urllib.request.urlopen(gateway.removesuffix("/llm") + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            got = line[len(name) :].split(" ")[0].strip("{}")
            if ",".join(sorted(got.split(","))) == want:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_searches_are_counted_per_backend(client: anthropic.Anthropic, gateway: str) -> None:
    names = (
        "llm_gateway_web_searches_total",
        "llm_gateway_web_search_errors_total",
        "llm_gateway_web_search_duration_seconds_count",
    )
    labels = (
        {"backend": "searxng", "outcome": "ok"},
        {"backend": "searxng", "outcome": "error"},
        {"backend": "searxng", "error_code": "unavailable"},
        {"backend": "searxng"},
    )
    keys = [
        (names[0], labels[0]),
        (names[0], labels[1]),
        (names[1], labels[2]),
        (names[2], labels[3]),
    ]
    before = [_metric(gateway, n, **lab) for n, lab in keys]
    for query in ("counted", "counted #fail"):
        client.messages.create(
            model="ws",
            max_tokens=200,
            tools=[web_search()],
            messages=[{"role": "user", "content": query}],
        )
    after = [_metric(gateway, n, **lab) for n, lab in keys]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 1, 2]


# --- a backend that fails ---------------------------------------------------------------

# query marker -> what the result block must be (an error code, or no results)
FAILURES = {
    "#fail": "unavailable",
    "#slow": "unavailable",
    "#garbage": "unavailable",
    "#html": "unavailable",
    "#busy": "too_many_requests",
    "#empty": [],
}


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
@pytest.mark.parametrize("marker", list(FAILURES))
def test_backend_failure_is_a_result_block(
    client: anthropic.Anthropic,
    gateway: str,
    stub_url: str,
    searxng: str,
    marker: str,
    stream: bool,
) -> None:
    query = f"gateway release notes {marker}"
    ask = {
        "model": "ws",
        "max_tokens": 200,
        "messages": [{"role": "user", "content": query}],
        "tools": [web_search(max_uses=2)],
    }
    if stream:
        events = raw_stream(gateway, ask)
        with client.messages.stream(**ask) as s:
            msg = s.get_final_message()
        assert [
            e["content_block"]["type"] for e in events if e["type"] == "content_block_start"
        ] == [b.type for b in msg.content]
    else:
        msg = client.messages.create(**ask)
    assert [b.type for b in msg.content] == ["server_tool_use", "web_search_tool_result", "text"], (
        msg.content
    )
    result = msg.content[1]
    assert isinstance(result, WebSearchToolResultBlock)
    want = FAILURES[marker]
    if isinstance(want, str):
        assert isinstance(result.content, WebSearchToolResultError), result.content
        assert result.content.error_code == want
    else:
        assert result.content == want
    assert msg.stop_reason == "end_turn"
    # the model was told (a tool message, never a dropped result) and answered
    last = stub_requests(stub_url)[-1]["body"]
    (told,) = _tool_messages(last)
    said = _text(told["content"])
    assert (
        said
        and msg.content[2].text
        == (  # type: ignore[union-attr]
            "The search found nothing: " + said[:300]
        )
    )
    for leak in (urlsplit(searxng).netloc, "Traceback"):
        assert leak not in said and leak not in msg.model_dump_json()
    assert searches(searxng)[0]["q"] == query


def test_a_slow_search_does_not_hold_up_other_requests(
    client: anthropic.Anthropic, searxng: str
) -> None:
    """While a search waits on a slow backend, another request is served to the end."""
    done: list[str] = []

    def slow() -> None:
        client.messages.create(
            model="ws",
            max_tokens=200,
            tools=[web_search()],
            messages=[{"role": "user", "content": "wait #slow"}],
        )
        done.append("slow")

    worker = threading.Thread(target=slow)
    worker.start()
    try:
        for _ in range(200):  # until the search waits on the backend
            if any("#slow" in s["q"] for s in searches(searxng, clear=False)):
                break
            time.sleep(0.05)
        quick = client.messages.create(
            model="ws", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
        )
        done.append("quick")
        assert quick.content[0].text == "Hello from the stub."  # type: ignore[union-attr]
    finally:
        worker.join(30)
    assert done == ["quick", "slow"]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "buffered"])
def test_a_client_leaving_mid_search_cancels_it(
    stub_url: str, searxng: str, gateway_factory: Any, stream: bool
) -> None:
    """The client closes its connection while the search waits on a slow backend (its
    timeout far off): streamed, once the search's server_tool_use block has arrived;
    buffered, once the backend has the search. The search is cancelled and its connection
    to the backend closed at once (the backend sees it go, long before it would answer), no
    next round is asked for; a stream counts as ``client_disconnect`` with none left in
    flight (as any stream the client leaves), a buffered reply's access line says 499; and
    nothing is logged at error level or leaks, to the process's end (no pending task,
    unclosed session or never-retrieved exception)."""
    proc, url = gateway_factory(
        config(stub_url, searxng).replace(f"timeout = {SEARCH_TIMEOUT}", "timeout = 60")
    )  # the stub's #slow sleeps 30 s
    base = url + "/llm"
    clear_stub(stub_url)
    searches(searxng)
    left = _metric(
        base,
        "llm_gateway_stream_terminations_total",
        api="messages",
        model="ws",
        reason="client_disconnect",
    )
    body = json.dumps(
        {
            "model": "ws",
            "max_tokens": 200,
            "stream": stream,
            "messages": [{"role": "user", "content": "wait for it #slow"}],
            "tools": [web_search()],
        }
    ).encode()
    where = urlsplit(base)
    head = (
        f"POST {where.path}/v1/messages HTTP/1.1\r\nHost: {where.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock = socket.create_connection((where.hostname, where.port), timeout=20)
    try:
        sock.sendall(head.encode() + body)
        got = b""
        while stream and b'"type":"content_block_stop","index":0' not in got:
            chunk = sock.recv(65536)
            assert chunk, got
            got += chunk
        assert not stream or b'"type":"server_tool_use"' in got
        wait_until(
            lambda: any("#slow" in s["params"].get("q", "") for s in _searched(searxng)),
            "the search reached the backend",
        )
    finally:
        sock.close()
    wait_until(
        lambda: any(s.get("cancelled") for s in _searched(searxng)),
        "the backend saw the search's connection close",
    )
    # a stream's head was sent: it keeps that status, as any stream's
    code = "200" if stream else "499"
    wait_until(
        lambda: (
            _metric(
                base,
                "llm_gateway_requests_total",
                api="messages",
                model="ws",
                code=code,
                stream=str(stream).lower(),
            )
            == 1
        ),
        "the request counted",
    )
    assert (
        _metric(
            base,
            "llm_gateway_stream_terminations_total",
            api="messages",
            model="ws",
            reason="client_disconnect",
        )
        == left + stream
    )
    assert _metric(base, "llm_gateway_streams_in_flight", api="messages", model="ws") == 0
    assert len(stub_requests(stub_url)) == 1  # no second round was asked for
    assert proc.stop() == 0  # then what the process said, to its end
    out = proc.output()
    (access,) = access_lines(out, route="messages")
    assert access["stream"] is stream and access["status"] == int(code)
    for leak in ("Task was destroyed", "Unclosed", "never retrieved", "Traceback"):
        assert leak not in out, out
    assert not [line for line in log_lines(out) if line.get("level") in ("error", "critical")]


def _searched(searxng: str) -> list[dict]:
    with urllib.request.urlopen(searxng + "/_requests", timeout=5) as resp:
        return json.loads(resp.read())


# --- without [web_search] ---------------------------------------------------------------


@pytest.mark.parametrize("kind", TOOL_TYPES)
def test_without_the_table_web_search_is_still_refused(
    stub_url: str, gateway_factory: Any, kind: str
) -> None:
    """No ``[web_search]`` table: every dated version is the 400 naming ``tools.0`` it was
    before, and nothing reaches the upstream."""
    _, url = gateway_factory(config(stub_url, None))
    clear_stub(stub_url)
    plain = sdk.client(url + "/llm", api_key="k", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as info:
        plain.messages.create(
            model="ws",
            max_tokens=50,
            tools=[web_search(kind)],
            messages=[{"role": "user", "content": "search"}],
        )
    assert info.value.status_code == 400 and isinstance(info.value.body, dict)
    assert info.value.body["error"]["message"].startswith(
        f"tools.0.type: '{kind}' is an Anthropic server tool"
    )
    assert stub_requests(stub_url) == []


# --- the TypeScript SDK -----------------------------------------------------------------


@pytest.mark.clients
@pytest.mark.parametrize(
    ("query", "max_uses"), [("gateway release notes", 2), ("gateway release notes #fail", 2)]
)
def test_ts_sdk_parses_every_block(gateway: str, query: str, max_uses: int) -> None:
    """MessageStream.finalMessage() and messages.create() give the same blocks with the
    API's fields; the stream's server_tool_use input is rebuilt from its input_json_delta."""
    ts_sdk_ready()
    proc = subprocess.run(
        ["node", str(CLIENTS / "ts_web_search.mjs"), gateway, "ws", query, str(max_uses)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=CLIENTS,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout + proc.stderr
    out = json.loads(lines[-1])
    assert "fatal" not in out, out
    assert out["createdKind"] == "object"  # parsed JSON, not a body string
    for reply in (out["stream"], out["created"]):
        use, result, text = reply["content"]
        assert list(use) == ["type", "id", "name", "input"] and use["type"] == "server_tool_use"
        assert use["id"].startswith("srvtoolu_") and use["input"] == {"query": query}
        assert result["type"] == "web_search_tool_result"
        assert result["tool_use_id"] == use["id"]
        if "#fail" in query:
            assert result["content"] == {
                "type": "web_search_tool_result_error",
                "error_code": "unavailable",
            }
            assert text["text"].startswith("The search found nothing: ")
        else:
            assert [r["url"] for r in result["content"]] == expected_urls(query)
            assert all(
                list(r) == ["type", "url", "title", "encrypted_content", "page_age"]
                for r in result["content"]
            )
            assert text["text"] == f"According to {expected_urls(query)[0]}, that is the answer."
        assert text["type"] == "text" and reply["stop_reason"] == "end_turn"
        searched = reply["usage"]["server_tool_use"]["web_search_requests"]
        assert searched == 1 or ("#fail" in query and searched == 0)
    assert out["streamBlocks"] == ["server_tool_use", "web_search_tool_result", "text"]
    assert out["finalText"] == out["stream"]["content"][2]["text"]
    kinds = [e["type"] for e in out["events"]]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    starts = [e["content_block"] for e in out["events"] if e["type"] == "content_block_start"]
    assert starts[0]["input"] == {} and starts[1] == out["stream"]["content"][1]


@pytest.mark.clients
def test_ts_sdk_folds_a_citation(gateway: str) -> None:
    """The TypeScript MessageStream folds ``citations_delta`` into the quoted text block:
    finalMessage() equals messages.create()."""
    ts_sdk_ready()
    query = "gateway release notes"
    proc = subprocess.run(
        ["node", str(CLIENTS / "ts_web_search.mjs"), gateway, "ws-quote", query, "2"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=CLIENTS,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout + proc.stderr
    out = json.loads(lines[-1])
    assert "fatal" not in out, out
    for reply in (out["stream"], out["created"]):
        quoted = [b for b in reply["content"] if b["type"] == "text" and b.get("citations")]
        assert [b["text"] for b in quoted] == [f"Snippet 1 about {query}."], reply["content"]
        (citation,) = quoted[0]["citations"]
        assert citation["type"] == "web_search_result_location"
        assert citation["url"] == expected_urls(query)[0]
        assert citation["cited_text"] == quoted[0]["text"] and citation["encrypted_index"]
    strip = [
        {k: v for k, v in b.items() if k not in ("id", "tool_use_id")}
        for b in out["stream"]["content"]
    ]
    assert strip == [
        {k: v for k, v in b.items() if k not in ("id", "tool_use_id")}
        for b in out["created"]["content"]
    ]
