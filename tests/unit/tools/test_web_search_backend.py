"""The SearXNG backend against a hostile or dead instance (gateway/tools/web_search/searxng.py):
what a result may carry to a client and to the model, bounded work, and the failure log's rate
limit. The HTTP cases run against a real aiohttp server answering fixed bodies."""

from __future__ import annotations

import json
import threading
import zlib
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from gateway.messages import search_blocks as blocks
from gateway.ops.config_schema import WebSearchConfig
from gateway.ops.metrics import Metrics
from gateway.text import jsonutil
from gateway.tools.web_search import searxng
from gateway.tools.web_search.searxng import SearchFailed, Searxng, parse_results
from tests import searxng_stub


def _answer(*results: Any) -> dict[str, Any]:
    return {
        "query": "q",
        "number_of_results": 0,
        "results": list(results),
        "answers": [],
        "corrections": [],
        "infoboxes": [],
        "suggestions": [],
        "unresponsive_engines": [],
    }


OK = {"url": "https://ok.example/", "title": "fine", "content": "fine text"}
HUGE = "A" * (2 * 1024 * 1024)

# (the backend's results, the URLs kept): a URL a client must never be given is dropped
URL_CASES = [
    ([{"url": "javascript:alert(1)"}, OK], ["https://ok.example/"]),
    ([{"url": "JavaScript:alert(1)//https://x"}, OK], ["https://ok.example/"]),
    (
        [
            {"url": "data:text/html,<script>"},
            {"url": "file:///etc/passwd"},
            {"url": "ftp://f.example/x"},
            {"url": "//evil.example/"},
            {"url": "mailto:a@b"},
        ],
        [],
    ),
    ([{"url": "https:evil.example"}, {"url": "https://"}, {"url": "http:///path"}], []),
    ([{"url": "https://[not-ipv6/"}, {"url": "https://x.example:99999999/"}], []),
    (
        [
            {"url": "https://a.example/x\nURL: https://evil.example"},  # a line injected
            {"url": "https://a.example/x y"},
            {"url": "https://a.example/\x00"},
            {"url": "https://a.example/\u202eevil"},
            {"url": "https://a.example/\ud800"},
            {"url": "https://a.example/\u2028"},
        ],
        [],
    ),
    ([{"url": "https://" + "a" * 2100 + ".example/"}, OK], ["https://ok.example/"]),
    (
        [
            {"url": 42},
            {"url": None},
            {"url": ["https://x.example/"]},
            {"url": {"u": 1}},
            {"title": "no url"},
        ],
        [],
    ),
    # verbatim: a query string, non-ASCII path, upper case host and a port are kept
    (
        [{"url": "https://Wiki.example:8443/Z\u00fcrich?x=1&y=%20#top"}],
        ["https://Wiki.example:8443/Z\u00fcrich?x=1&y=%20#top"],
    ),
]


@pytest.mark.parametrize(("results", "urls"), URL_CASES)
def test_only_urls_a_client_may_be_given_are_kept(results: list[Any], urls: list[str]) -> None:
    got = parse_results(_answer(*results), max_results=20, max_chars=100)
    assert [r["url"] for r in got] == urls


# (one result's fields, what the model and the client get from it)
FIELD_CASES = [
    # non-string fields are absent: the title falls back to the URL
    (
        {"title": 7, "content": ["x"], "publishedDate": 1700000000},
        {"title": "https://ok.example/", "snippet": "", "page_age": None},
    ),
    (
        {"title": {"a": 1}, "content": None, "publishedDate": {"y": 2026}},
        {"title": "https://ok.example/", "snippet": "", "page_age": None},
    ),
    (
        {"title": None, "content": True, "publishedDate": False},
        {"title": "https://ok.example/", "snippet": "", "page_age": None},
    ),
    # control characters, bidi overrides, a BOM and lone surrogates never reach anyone
    (
        {"title": "a\x00b\x1bc\x7fd\x85e\u202ef\u2066g\ufeffh\ud800i", "content": "x\x07y"},
        {"title": "abcd efghi", "snippet": "xy"},
    ),
    (
        {"title": "line\none\r\ttwo\u2028three", "content": "a\n\n\nb"},
        {"title": "line one two three", "snippet": "a b"},
    ),
    # a huge title and snippet: cut to their caps, marked
    ({"title": HUGE, "content": HUGE}, {"title": "A" * 511 + "…", "snippet": "A" * 99 + "…"}),
    (
        {"title": " " * 100_000 + "late", "content": "\n" * 10_000},
        {"title": "https://ok.example/", "snippet": ""},
    ),
    # dates: ISO (with a zone, a Z) as the API writes page_age; other text one short line
    ({"publishedDate": "2026-03-13T09:26:53+02:00"}, {"page_age": "March 13, 2026"}),
    ({"publishedDate": "2026-01-02T00:00:00Z"}, {"page_age": "January 2, 2026"}),
    ({"publishedDate": "2 days ago"}, {"page_age": "2 days ago"}),
    ({"publishedDate": "x\n\x00y" + "9" * 10_000}, {"page_age": "x y" + "9" * 60}),
    ({"publishedDate": ""}, {"page_age": None}),
    ({"publishedDate": "\x00\x01"}, {"page_age": None}),
]


@pytest.mark.parametrize(("fields", "want"), FIELD_CASES)
def test_a_results_fields_are_one_bounded_printable_line(
    fields: dict[str, Any], want: dict[str, Any]
) -> None:
    (got,) = parse_results(_answer({**OK, **fields}), max_results=5, max_chars=100)
    assert {k: got[k] for k in want} == want
    # what a client gets encodes, and the sealed result opens to it again
    assert blocks.open_result((b"k",), blocks.seal_result(b"k", got)) == got
    jsonutil.dumpb(got)
    assert "\n" not in blocks.result_lines(got).replace("\nURL: ", " ").replace(
        "\nPublished: ", " "
    ).replace("\nSnippet: ", " ")


def test_a_long_result_list_is_looked_at_only_so_far() -> None:
    """10,000 results none of which may be kept, then good ones: the scan stops at its cap
    (bounded work on the event loop), so nothing past it is kept."""
    bad = [{"url": "javascript:void(0)", "title": "x"}] * 10_000
    assert parse_results(_answer(*bad, OK), max_results=5, max_chars=100) == []
    many = [{"url": f"https://r{n}.example/", "title": str(n)} for n in range(10_000)]
    got = parse_results(_answer(*many), max_results=5, max_chars=100)
    assert [r["title"] for r in got] == ["0", "1", "2", "3", "4"]


# --- over HTTP: size, nesting, decoding off the loop, the failure log ------------------

_NESTED = ("[" * 5000 + "]" * 5000).encode()


def _gzip_bomb(mib: int) -> bytes:
    """``mib`` MiB of zeros, gzipped (about 1 KB a MiB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    return b"".join(packer.compress(zeros) for _ in range(mib)) + packer.flush()


def _body(results: list[Any]) -> bytes:
    return json.dumps(_answer(*results)).encode()


# (the body the backend answers, the error code or the number of results)
HTTP_CASES = {
    "past_max_response_bytes": (
        json.dumps(_answer({**OK, "content": HUGE})).encode(),
        "unavailable",
    ),
    "deeply_nested": (_NESTED, "unavailable"),
    "nested_inside_a_result": (
        b'{"results": [{"url": "https://ok.example/", "title": '
        + b"[" * 2000
        + b"]" * 2000
        + b"}]}",
        "unavailable",
    ),
    "not_json": (b'{"results": [', "unavailable"),
    "not_searxngs_shape": (b'{"results": {"url": "https://ok.example/"}}', "unavailable"),
    "a_json_string": (b'"results"', "unavailable"),
    "ten_thousand_results": (
        _body([{"url": f"https://r{n}.example/", "title": "t" * 50} for n in range(10_000)]),
        3,
    ),
    "big_but_under_the_cap": (_body([{**OK, "content": "y" * 1_500_000}]), 1),
    # 256 MiB once inflated, sent as 256 KB with Content-Encoding: gzip: the cap counts the
    # inflated bytes (aiohttp inflates a chunk at a time)
    "gzip_bomb": (_gzip_bomb(256), "unavailable"),
}


CAUSES = {
    "past_max_response_bytes": "response_too_large",
    "deeply_nested": "not_json",
    "nested_inside_a_result": "not_json",
    "not_json": "not_json",
    "not_searxngs_shape": "not_searxng",
    "a_json_string": "not_searxng",
    "gzip_bomb": "response_too_large",
}


@pytest.fixture
async def backend(aiohttp_server: Any) -> Any:
    served: dict[str, Any] = {"body": b"{}", "status": 200}

    async def search(request: web.Request) -> web.Response:
        body = served["body"]
        gzipped = body[:2] == b"\x1f\x8b"
        return web.Response(
            body=body,
            status=served["status"],
            content_type="application/json",
            headers={"Content-Encoding": "gzip"} if gzipped else None,
        )

    app = web.Application()
    app.router.add_get("/search", search)
    server = await aiohttp_server(app)
    config = WebSearchConfig(
        searxng_url=f"http://127.0.0.1:{server.port}",
        timeout=10,
        max_results=3,
        max_response_bytes=2 * 1024 * 1024,
    )
    search_backend = Searxng(config, Metrics(registry=CollectorRegistry()))
    await search_backend.start()
    try:
        yield search_backend, served
    finally:
        await search_backend.close()


@pytest.mark.parametrize("case", list(HTTP_CASES))
async def test_a_hostile_answer_is_bounded(
    backend: Any, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    search_backend, served = backend
    served["body"], want = HTTP_CASES[case]
    decoded_in: list[bool] = []
    loads = jsonutil.loads

    def watched(data: Any) -> Any:
        decoded_in.append(threading.current_thread() is threading.main_thread())
        return loads(data)

    monkeypatch.setattr(jsonutil, "loads", watched)
    if isinstance(want, str):
        with capture_logs() as logs, pytest.raises(SearchFailed) as caught:
            await search_backend.search("q")
        assert caught.value.code == want
        (line,) = logs
        assert line["cause"] == CAUSES[case], line
    else:
        got = await search_backend.search("q")
        assert len(got) == want
    # a body past the off-loop size is decoded in a thread, a small one on the loop
    size = len(served["body"])
    if size <= 2 * 1024 * 1024 and case != "gzip_bomb":
        assert decoded_in == [size <= searxng._OFF_LOOP_BYTES], decoded_in


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def time(self) -> float:
        return self.now


async def test_a_dead_backend_is_logged_once_a_second_per_cause(unused_tcp_port: int) -> None:
    """Searches of a backend nobody listens on: the first failure is logged, the next ones
    in the same second only counted, and the first line after it says how many were held
    back; another cause has its own line."""
    config = WebSearchConfig(searxng_url=f"http://127.0.0.1:{unused_tcp_port}", timeout=5)
    metrics = Metrics(registry=CollectorRegistry())
    dead = Searxng(config, metrics)
    await dead.start()
    clock = _Clock()
    dead._report._loop = clock  # type: ignore[assignment]  # the log's clock, held still
    try:
        with capture_logs() as logs:
            for _ in range(50):
                with pytest.raises(SearchFailed):
                    await dead.search("q", request_id="req_1")
            clock.now += 1.5
            with pytest.raises(SearchFailed):
                await dead.search("q", request_id="req_2")
            dead._report.warn("timeout", error_code="unavailable")  # another cause
    finally:
        await dead.close()
    failed = [entry for entry in logs if entry["event"] == "web_search_failed"]
    assert [
        (e["backend"], e["cause"], e.get("suppressed"), e.get("request_id")) for e in failed
    ] == [
        ("searxng", "ClientConnectorError", None, "req_1"),
        ("searxng", "ClientConnectorError", 49, "req_2"),
        ("searxng", "timeout", None, None),
    ]
    assert failed[0]["error_code"] == "unavailable" and str(unused_tcp_port) not in str(failed)
    # every failure is still counted
    assert (
        metrics.registry.get_sample_value(
            "llm_gateway_web_search_errors_total",
            {"backend": "searxng", "error_code": "unavailable"},
        )
        == 51
    )


async def test_a_redirect_to_another_host_is_not_followed(aiohttp_server: Any) -> None:
    """The instance answers 302 to another server that would answer the search: the gateway
    does not go there (a redirect could send the query, and the gateway's connection, to
    any host), and the search fails as unavailable."""
    front = await aiohttp_server(searxng_stub.make_app())
    elsewhere = await aiohttp_server(searxng_stub.make_app())
    metrics = Metrics(registry=CollectorRegistry())
    backends = [
        Searxng(WebSearchConfig(searxng_url=f"http://127.0.0.1:{server.port}", timeout=10), metrics)
        for server in (front, elsewhere)
    ]
    for one in backends:
        await one.start()
    try:
        assert len(await backends[1].search("oslo")) == 3  # the other server answers
        async with aiohttp.ClientSession() as http:
            await http.delete(f"http://127.0.0.1:{elsewhere.port}/_requests")
            with capture_logs() as logs, pytest.raises(SearchFailed) as caught:
                await backends[0].search(f"oslo #redirect{elsewhere.port}")
            async with http.get(f"http://127.0.0.1:{elsewhere.port}/_requests") as seen:
                assert await seen.json() == []
    finally:
        for one in backends:
            await one.close()
    assert caught.value.code == "unavailable"
    (line,) = logs
    assert line["cause"] == "http_3xx" and str(elsewhere.port) not in str(line)
