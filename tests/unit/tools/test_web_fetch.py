"""The web_fetch tool's pure parts: its validation (per dated version, as strict as the SDK's
types), the URL context (which URLs may be fetched, in one normal form), its blocks' replay
into chat turns, and the sentences a citation may quote."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.messages import fetch_blocks
from gateway.messages.request.validate import validate_messages
from gateway.messages.to_chat.translate import to_chat
from gateway.ops import config
from gateway.tools.web_fetch.context import UrlContext, url_key, urls_in_text
from gateway.tools.web_fetch.fetches import sentences

V1, V2, V3, V4 = sorted(fetch_blocks.TOOL_TYPES)
ROUTE = config.parse(
    {
        "upstreams": {"u": {"base_url": "http://127.0.0.1:9/v1"}},
        "models": [{"name": "m", "upstream": "u", "upstream_model": "up"}],
    },
    "t.toml",
    {},
).models["m"]


def _req(tools: list[dict[str, Any]], messages: list[dict[str, Any]] | None = None) -> dict:
    return {
        "model": "m",
        "max_tokens": 10,
        "messages": messages or [{"role": "user", "content": "hi"}],
        "tools": tools,
    }


def _tool(kind: str = V1, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "name": "web_fetch", **fields}


def _refs(kind: str, *names: str) -> dict[str, Any]:
    """A ``url_sources`` tool filter naming ``names``."""
    return {"type": kind, "tools": [{"type": "tool_reference", "name": n} for n in names]}


# --- the tool's definition ------------------------------------------------------------------

VALID = [
    _tool(V1),
    _tool(V2, max_uses=3, allowed_domains=["example.com"], citations={"enabled": True}),
    _tool(V3, use_cache=False, blocked_domains=["a.com/x"], max_content_tokens=100),
    _tool(V4, response_inclusion="excluded", use_cache=True, strict=True, defer_loading=False),
    _tool(
        V1,
        url_sources={
            "user_input": {"type": "none"},
            "client_tool_results": {
                "type": "only",
                "tools": [{"type": "tool_reference", "name": "t"}],
            },
            "server_tool_results": {"type": "except", "tools": []},
        },
    ),
    _tool(V1, cache_control={"type": "ephemeral"}, allowed_callers=["direct"]),
]


@pytest.mark.parametrize("tool", VALID)
def test_each_version_takes_its_own_fields(tool: dict[str, Any]) -> None:
    client = {"name": "t", "input_schema": {"type": "object"}}
    validate_messages(_req([tool, client]), web_fetch=True)


REFUSED = [
    (_tool(V1, bogus=1), "tools.0.bogus"),
    (_tool(V1, use_cache=True), "tools.0.use_cache"),  # 20260309 and later only
    (_tool(V3, response_inclusion="full"), "tools.0.response_inclusion"),  # 20260318 only
    (_tool(V4, response_inclusion="some"), "tools.0.response_inclusion"),
    ({"type": V1, "name": "fetch"}, "tools.0.name"),
    ({"type": V1}, "tools.0.name"),
    (_tool(V1, max_uses=0), "tools.0.max_uses"),
    (_tool(V1, max_uses="2"), "tools.0.max_uses"),
    (_tool(V1, max_content_tokens=0), "tools.0.max_content_tokens"),
    (_tool(V1, citations=True), "tools.0.citations"),
    (_tool(V1, citations={"enabled": 1}), "tools.0.citations.enabled"),
    (_tool(V1, citations={"enabled": True, "x": 1}), "tools.0.citations.x"),
    (_tool(V3, use_cache="no"), "tools.0.use_cache"),
    (_tool(V1, allowed_domains="a.com"), "tools.0.allowed_domains"),
    (_tool(V1, allowed_domains=["https://a.com"]), "tools.0.allowed_domains.0"),
    (_tool(V1, allowed_domains=["a.com"], blocked_domains=["b.com"]), "tools.0.blocked_domains"),
    (_tool(V1, url_sources=[]), "tools.0.url_sources"),
    (_tool(V1, url_sources={"other": {}}), "tools.0.url_sources.other"),
    (
        _tool(V1, url_sources={"user_input": {"type": "only", "tools": []}}),
        "tools.0.url_sources.user_input.type",
    ),
    (
        _tool(V1, url_sources={"client_tool_results": {"type": "only"}}),
        "tools.0.url_sources.client_tool_results.tools",
    ),
    (
        _tool(V1, url_sources={"server_tool_results": {"type": "all", "tools": []}}),
        "tools.0.url_sources.server_tool_results.tools",
    ),
    (
        _tool(
            V1,
            url_sources={
                "server_tool_results": {"type": "only", "tools": [{"type": "x", "name": "a"}]}
            },
        ),
        "tools.0.url_sources.server_tool_results.tools.0.type",
    ),
    (  # a named tool must be one of the request's
        _tool(
            V1,
            url_sources={
                "server_tool_results": {
                    "type": "only",
                    "tools": [{"type": "tool_reference", "name": "web_search"}],
                }
            },
        ),
        "tools.0.url_sources.server_tool_results.tools.0.name",
    ),
]


@pytest.mark.parametrize(("tool", "path"), REFUSED)
def test_a_tool_defined_wrongly_is_refused_naming_the_field(tool: dict, path: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        validate_messages(_req([tool]), web_fetch=True)
    assert caught.value.path == path


@pytest.mark.parametrize("kind", sorted(fetch_blocks.TOOL_TYPES))
def test_without_the_table_every_version_is_refused_as_before(kind: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        validate_messages(_req([_tool(kind)]))
    assert caught.value.path == "tools.0.type"


# --- replayed blocks ------------------------------------------------------------------------

USE = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_fetch", "input": {"url": "u"}}
DOC = {
    "type": "document",
    "source": {"type": "text", "media_type": "text/plain", "data": "The page.\nLine two."},
    "title": "T",
    "citations": {"enabled": False},
}
RESULT = {
    "type": "web_fetch_tool_result",
    "tool_use_id": "srvtoolu_1",
    "content": {
        "type": "web_fetch_result",
        "url": "https://a.com/p",
        "retrieved_at": "2026-01-01T00:00:00Z",
        "content": DOC,
    },
}
ERROR = {
    "type": "web_fetch_tool_result",
    "tool_use_id": "srvtoolu_1",
    "content": {"type": "web_fetch_tool_result_error", "error_code": "url_not_accessible"},
}


def _history(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "read https://a.com/p"},
        {"role": "assistant", "content": list(blocks)},
        {"role": "user", "content": "and?"},
    ]


def _set(block: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(block)
    *head, last = path.split(".")
    at = out
    for key in head:
        at = at[key]
    at[last] = value
    return out


A = "messages.1.content.1"
HISTORY_REFUSED = [
    (_set(RESULT, "extra", 1), f"{A}.extra"),
    (_set(RESULT, "_opened", "what the model saw"), f"{A}._opened"),  # never from a client
    (_set(RESULT, "content.type", "web_search_result"), f"{A}.content.type"),
    (_set(RESULT, "content.url", None), f"{A}.content.url"),
    (_set(RESULT, "content.retrieved_at", 5), f"{A}.content.retrieved_at"),
    (_set(RESULT, "content.content.type", "text"), f"{A}.content.content.type"),
    (_set(RESULT, "content.content.source.type", "url"), f"{A}.content.content.source.type"),
    (
        _set(RESULT, "content.content.source.media_type", "text/html"),
        f"{A}.content.content.source.media_type",
    ),
    (_set(RESULT, "content.content.source.data", None), f"{A}.content.content.source.data"),
    (_set(ERROR, "content.error_code", "query_too_long"), f"{A}.content.error_code"),
    (_set(RESULT, "tool_use_id", "srvtoolu_2"), f"{A}.tool_use_id"),  # answers no call
]


@pytest.mark.parametrize(("block", "path"), HISTORY_REFUSED)
def test_a_replayed_fetch_block_defined_wrongly_is_refused(block: dict, path: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        validate_messages(_req([_tool()], _history(USE, block)), web_fetch=True)
    assert caught.value.path == path


def test_a_search_result_cannot_answer_a_fetch() -> None:
    block = {**RESULT, "type": "web_search_tool_result", "content": []}
    with pytest.raises(InvalidRequest) as caught:
        validate_messages(_req([_tool()], _history(USE, block)), web_fetch=True)
    assert caught.value.path == f"{A}.tool_use_id"


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (RESULT, "URL: https://a.com/p\nTitle: T\n\nThe page.\nLine two."),
        (ERROR, fetch_blocks.error_text("url_not_accessible")),
    ],
)
def test_a_replayed_fetch_is_the_call_and_the_document_unchanged(
    result: dict[str, Any], expected: str
) -> None:
    req = _req([_tool()], _history(USE, result))
    validate_messages(req, web_fetch=True)
    messages = to_chat(req, ROUTE)["messages"]
    call = next(m for m in messages if m.get("tool_calls"))["tool_calls"][0]
    assert call["id"] == "srvtoolu_1" and call["function"]["name"] == "web_fetch"
    (tool,) = [m for m in messages if m["role"] == "tool"]
    assert tool == {"role": "tool", "tool_call_id": "srvtoolu_1", "content": expected}
    assert messages[-1] == {"role": "user", "content": "and?"}


def test_the_model_is_offered_a_url_function() -> None:
    req = _req([_tool(V4)])
    validate_messages(req, web_fetch=True)
    out = to_chat(req, ROUTE)
    (fn,) = out["tools"]
    assert fn["function"]["name"] == "web_fetch"
    assert fn["function"]["parameters"]["required"] == ["url"]


# --- URLs in context ------------------------------------------------------------------------

SAME = [
    ("https://Example.COM/a", "https://example.com/a"),
    ("https://example.com", "https://example.com/"),
    ("https://example.com:443/a", "https://example.com/a"),
    ("http://example.com:80/a", "http://example.com/a"),
    ("https://example.com/a#frag", "https://example.com/a"),
    ("https://example.com/x/../a", "https://example.com/a"),
    ("https://example.com./a", "https://example.com/a"),
    ("https://EXAMPLE.com/%61", "https://example.com/a"),
    ("https://bücher.de/", "https://xn--bcher-kva.de/"),
    ("http://0x7f.1:8080/", "http://127.0.0.1:8080/"),
]
DIFFERENT = [
    ("https://example.com/a", "http://example.com/a"),
    ("https://example.com/a", "https://example.com:8443/a"),
    ("https://example.com/a?x=1", "https://example.com/a"),
    ("https://example.com/a?x=1", "https://example.com/a?x=2"),
    ("https://example.com/a", "https://example.com/A"),
    ("https://example.com/a", "https://www.example.com/a"),
    ("https://evil.com\\@example.com/", "https://example.com/"),
]


@pytest.mark.parametrize(("a", "b"), SAME)
def test_urls_a_browser_reads_alike_are_one(a: str, b: str) -> None:
    assert url_key(a) is not None and url_key(a) == url_key(b)


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_urls_that_differ_are_not_one(a: str, b: str) -> None:
    assert url_key(a) != url_key(b)


@pytest.mark.parametrize("url", ["ftp://a.com/", "file:///etc/passwd", "javascript:x", "a.com"])
def test_only_http_urls_have_a_key(url: str) -> None:
    assert url_key(url) is None


@pytest.mark.parametrize(
    ("text", "urls"),
    [
        ("see https://a.com/x.", ["https://a.com/x"]),
        ("(https://a.com/x)", ["https://a.com/x"]),
        ("https://en.wikipedia.org/wiki/A_(b), ok", ["https://en.wikipedia.org/wiki/A_(b)"]),
        ('<a href="http://a.com/?q=1&r=2">', ["http://a.com/?q=1&r=2"]),
        ("two: http://a.com and HTTPS://b.com/y!", ["http://a.com", "HTTPS://b.com/y"]),
        ("none here: a.com/x", []),
    ],
)
def test_urls_written_in_text_are_found(text: str, urls: list[str]) -> None:
    assert list(urls_in_text(text)) == urls


def _conversation() -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": "read https://user.example/page"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "links", "input": {}},
                    {"type": "tool_use", "id": "toolu_2", "name": "other", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": "https://links.example/1",
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "https://other.example/2"}],
                    },
                    {
                        "type": "document",
                        "source": {"type": "url", "url": "https://doc.example/a.pdf"},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "server_tool_use",
                        "id": "srvtoolu_s",
                        "name": "web_search",
                        "input": {},
                    },
                    {
                        "type": "web_search_tool_result",
                        "tool_use_id": "srvtoolu_s",
                        "content": [
                            {"type": "web_search_result", "url": "https://found.example/r"}
                        ],
                    },
                    USE,
                    _set(RESULT, "content.content.source.data", "see https://inpage.example/l"),
                ],
            },
            {"role": "user", "content": "go on; never the assistant's https://assistant.example/"},
        ]
    }


ALL = {
    "https://user.example/page",
    "https://links.example/1",
    "https://other.example/2",
    "https://doc.example/a.pdf",
    "https://found.example/r",
    "https://a.com/p",
    "https://inpage.example/l",
    "https://assistant.example/",  # written in the user's own last turn
}


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        (None, ALL),
        (
            {"user_input": {"type": "none"}},
            ALL
            - {
                "https://user.example/page",
                "https://doc.example/a.pdf",
                "https://assistant.example/",
            },
        ),
        (
            {
                "client_tool_results": {
                    "type": "only",
                    "tools": [{"type": "tool_reference", "name": "links"}],
                }
            },
            ALL - {"https://other.example/2"},
        ),
        (
            {
                "client_tool_results": {
                    "type": "except",
                    "tools": [{"type": "tool_reference", "name": "links"}],
                }
            },
            ALL - {"https://links.example/1"},
        ),
        (
            {"server_tool_results": {"type": "none"}},
            ALL - {"https://found.example/r", "https://a.com/p", "https://inpage.example/l"},
        ),
        (
            {
                "server_tool_results": {
                    "type": "only",
                    "tools": [{"type": "tool_reference", "name": "web_search"}],
                }
            },
            ALL - {"https://a.com/p", "https://inpage.example/l"},
        ),
    ],
)
def test_the_urls_in_context_are_those_the_sources_allow(
    sources: dict[str, Any] | None, expected: set[str]
) -> None:
    context = UrlContext(sources)
    context.add_request(_conversation())
    candidates = ALL | {"https://nowhere.example/", "https://user.example/other"}
    assert {url for url in candidates if url in context} == expected


def test_a_result_of_this_reply_adds_its_urls() -> None:
    context = UrlContext()
    context.add_request({"messages": [{"role": "user", "content": "hi"}]})
    assert "https://found.example/r" not in context
    context.add_result(
        {
            "type": "web_search_tool_result",
            "tool_use_id": "x",
            "content": [{"type": "web_search_result", "url": "https://found.example/r"}],
        }
    )
    assert "https://FOUND.example:443/r#top" in context


# --- citable sentences ----------------------------------------------------------------------


def test_sentences_long_enough_to_quote_are_offered_by_their_offsets() -> None:
    text = "Short one. This sentence is long enough to quote!\n  A second line that is long too"
    spans = sentences(text)
    assert [text[a:b] for a, b in spans] == [
        "This sentence is long enough to quote!",
        "A second line that is long too",
    ]
