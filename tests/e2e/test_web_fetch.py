"""The ``web_fetch`` server tool run by the gateway (#36), end to end.

Three real processes: the gateway with ``[web_fetch] enabled`` and ``allowed_networks =
["127.0.0.0/8"]``, the scripted upstream (tests/stub_upstream.py: a model whose name starts
with ``fetch`` calls ``web_fetch`` with the first URL of the user's text, then answers with
the first line of the document it was shown), and a page server on 127.0.0.1 (a thread
here: an HTML page, a text file, a PDF, a binary, and a page no one may fetch, each request
counted).

What the client must see (Anthropic's web fetch tool docs; SDK 2.15 types): ONE message
holding a ``server_tool_use`` block (``srvtoolu_`` id, name ``web_fetch``, input ``{"url"}``),
then a ``web_fetch_tool_result`` block (``tool_use_id`` = that id; content a
``web_fetch_result`` {url, retrieved_at, content: a ``document``} or a
``web_fetch_tool_result_error``), then the model's text; ``usage.server_tool_use.
web_fetch_requests``. Buffered and streamed alike, parsed by the Python SDK with strict
response validation; later turns carry the fetched document upstream unchanged.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anthropic
import pydantic
import pytest
from anthropic.types import (
    CitationCharLocation,
    Message,
    RawMessageStreamEvent,
    ServerToolUseBlock,
    TextBlock,
    WebFetchBlock,
    WebFetchToolResultBlock,
    WebFetchToolResultErrorBlock,
)

from tests import sdk
from tests.anthropic_stream_check import check_stream
from tests.conftest import clear_stub, stub_requests
from tests.logs import wait_for_line
from tests.node import CLIENTS, ts_sdk_ready
from tests.pdfs import make_pdf
from tests.procs import Proc, free_port, start_gateway, wait_http
from tests.searxng_stub import HOSTS, slug

pytestmark = pytest.mark.e2e

TOOL_TYPES = (
    "web_fetch_20250910",
    "web_fetch_20260209",
    "web_fetch_20260309",
    "web_fetch_20260318",
)
EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)
FIRST_LINE = "Gateways translate one protocol into another for local models."
HTML = (
    "<html><head><title>The gateway page</title></head><body>"
    f"<h1>Local models</h1><p>{FIRST_LINE}</p><p>Second paragraph here.</p></body></html>"
)
PLAIN = "Plain text line one is long enough to quote.\nline two\n"
PDF_LINE = "A fetched PDF holds this sentence."
PAGES: dict[str, tuple[str, bytes]] = {
    "/page.html": ("text/html; charset=utf-8", HTML.encode()),
    "/notes.txt": ("text/plain; charset=utf-8", PLAIN.encode()),
    "/paper.pdf": ("application/pdf", make_pdf([[PDF_LINE]])),
    "/blob.bin": ("application/octet-stream", b"\x00\x01\x02" * 100),
    "/secret": ("text/plain", b"nobody may read this"),
}
ROUTES = {
    "wf": "fetch",
    "wf-quote": "fetch-quote",
    "wf-chat": "chat",
    "wf-search": "fetch-search",
}


class _Pages(BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.path)
        if self.path.startswith("/hop?to="):  # a redirect to the URL after "to="
            self.send_response(302)
            self.send_header("Location", self.path.removeprefix("/hop?to="))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        page = PAGES.get(self.path)
        if page is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", page[0])
        self.send_header("Content-Length", str(len(page[1])))
        self.end_headers()
        self.wfile.write(page[1])

    def log_message(self, *args: Any) -> None:
        pass


class _OtherPages(_Pages):
    seen: list[str] = []


def _serve(host: str, handler: type[_Pages]) -> Iterator[str]:
    server = ThreadingHTTPServer((host, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture(scope="module")
def pages() -> Iterator[str]:
    """The page server: its base URL; ``_Pages.seen`` lists the paths it was asked for."""
    yield from _serve("127.0.0.1", _Pages)


@pytest.fixture(scope="module")
def other_pages() -> Iterator[str]:
    """A second page server, another host (127.0.0.2); ``_OtherPages.seen`` its requests."""
    yield from _serve("127.0.0.2", _OtherPages)


@pytest.fixture(scope="module")
def searxng() -> Iterator[str]:
    """The SearXNG stand-in (tests/searxng_stub.py): its base URL."""
    port = free_port()
    proc = Proc(
        [sys.executable, str(Path(__file__).resolve().parents[1] / "searxng_stub.py"), str(port)]
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc.popen)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


def config(stub_url: str, pages: str, searxng: str) -> str:
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

[web_fetch]
enabled = true
allowed_networks = ["127.0.0.0/8"]
fetch_timeout = 5
fetch_connect_timeout = 2

[web_search]
searxng_url = "{searxng}"
"""
    routes = {**ROUTES, "wf-secret": f"fetch-url:{pages}/secret"}
    for name, scenario in routes.items():
        text += (
            f'\n[[models]]\nname = {json.dumps(name)}\nupstream = "stub"\n'
            f"upstream_model = {json.dumps(scenario)}\n"
        )
    return text


@pytest.fixture(scope="module")
def gateway_proc(
    stub_url: str, pages: str, searxng: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Proc, str]]:
    proc, url = start_gateway(config(stub_url, pages, searxng), tmp_path_factory.mktemp("wf"))
    try:
        yield proc, url + "/llm"
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def gateway(gateway_proc: tuple[Proc, str]) -> str:
    return gateway_proc[1]


@pytest.fixture
def client(gateway: str, stub_url: str) -> anthropic.Anthropic:
    clear_stub(stub_url)
    _Pages.seen.clear()
    _OtherPages.seen.clear()
    return sdk.client(gateway, api_key="k", max_retries=0, _strict_response_validation=True)


def tool(kind: str = "web_fetch_20250910", **fields: Any) -> dict[str, Any]:
    return {"type": kind, "name": "web_fetch", **fields}


def ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _create(client: anthropic.Anthropic, stream: bool, **body: Any) -> Message:
    if stream:
        with client.messages.stream(max_tokens=400, **body) as events:
            return events.get_final_message()
    return client.messages.create(max_tokens=400, **body)


def check_fetched(msg: Message, url: str) -> tuple[ServerToolUseBlock, WebFetchBlock]:
    assert [b.type for b in msg.content] == ["server_tool_use", "web_fetch_tool_result", "text"]
    use, result, text = msg.content
    assert isinstance(use, ServerToolUseBlock) and isinstance(result, WebFetchToolResultBlock)
    assert use.id.startswith("srvtoolu_") and use.name == "web_fetch"
    assert use.input == {"url": url}
    assert result.tool_use_id == use.id
    assert isinstance(result.content, WebFetchBlock), result.content
    assert result.content.url == url and result.content.retrieved_at
    assert isinstance(text, TextBlock)
    assert msg.usage.server_tool_use is not None
    assert msg.usage.server_tool_use.web_fetch_requests == 1
    assert msg.usage.server_tool_use.web_search_requests == 0
    return use, result.content


def _tool_message(body: dict[str, Any]) -> dict[str, Any]:
    (message,) = [m for m in body["messages"] if m["role"] == "tool"]
    return message


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", TOOL_TYPES)
def test_a_page_fetched_is_one_message_and_its_text_reaches_the_model(
    client: anthropic.Anthropic, stub_url: str, pages: str, kind: str, stream: bool
) -> None:
    url = f"{pages}/page.html"
    msg = _create(
        client, stream, model="wf", messages=ask(f"Read {url} please"), tools=[tool(kind)]
    )
    use, fetched = check_fetched(msg, url)
    doc = fetched.content
    assert doc.title == "The gateway page"
    assert doc.source.type == "text" and doc.source.media_type == "text/plain"
    assert FIRST_LINE in doc.source.data and "<p>" not in doc.source.data
    assert doc.citations is not None and doc.citations.enabled is False
    text = msg.content[2]
    assert isinstance(text, TextBlock) and text.text.startswith("Fetched: ")
    assert _Pages.seen == ["/page.html"]
    first, second = (r["body"] for r in stub_requests(stub_url))
    (function,) = first["tools"]
    assert function["function"]["name"] == "web_fetch"
    assert function["function"]["parameters"]["required"] == ["url"]
    call = next(m for m in second["messages"] if m.get("tool_calls"))["tool_calls"][0]
    assert call["id"] == use.id and json.loads(call["function"]["arguments"]) == {"url": url}
    message = _tool_message(second)
    assert message["tool_call_id"] == use.id
    assert doc.source.data in message["content"] and url in message["content"]


def test_the_stream_is_well_formed_and_each_event_typed(
    gateway: str, client: anthropic.Anthropic, pages: str
) -> None:
    body = {
        "model": "wf",
        "max_tokens": 300,
        "stream": True,
        "messages": ask(f"see {pages}/notes.txt."),
        "tools": [tool()],
    }
    req = urllib.request.Request(
        gateway + "/v1/messages",
        method="POST",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "x-api-key": "k"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        events = check_stream(resp.read())
    for event in events:
        if event["type"] != "ping":
            EVENT.validate_python(event)
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert [b["type"] for b in starts] == ["server_tool_use", "web_fetch_tool_result", "text"]
    result = starts[1]["content"]
    assert result["type"] == "web_fetch_result" and result["url"] == f"{pages}/notes.txt"
    assert result["content"]["source"]["data"] == PLAIN  # text is passed on as it is


def test_two_more_turns_carry_the_fetched_document_upstream_unchanged(
    client: anthropic.Anthropic, stub_url: str, pages: str
) -> None:
    url = f"{pages}/page.html"
    messages = ask(f"Read {url}")
    first = client.messages.create(model="wf", max_tokens=300, messages=messages, tools=[tool()])
    check_fetched(first, url)
    shown = _tool_message(stub_requests(stub_url)[-1]["body"])
    for n, stream in ((2, False), (3, True)):
        messages = [
            *messages,
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in first.content],
            }
            if n == 2
            else {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": f"turn {n}"},
        ]
        clear_stub(stub_url)
        reply = _create(client, stream, model="wf-chat", messages=messages, tools=[tool()])
        assert reply.content and reply.content[0].type == "text"
        (upstream,) = stub_requests(stub_url)
        assert _tool_message(upstream["body"]) == shown
    assert _Pages.seen == ["/page.html"]  # replayed, never fetched again


def test_a_url_the_conversation_does_not_hold_is_never_fetched(
    client: anthropic.Anthropic, pages: str
) -> None:
    msg = client.messages.create(
        model="wf-secret", max_tokens=300, messages=ask("Read the secret page"), tools=[tool()]
    )
    assert [b.type for b in msg.content] == ["server_tool_use", "web_fetch_tool_result", "text"]
    result = msg.content[1]
    assert isinstance(result, WebFetchToolResultBlock)
    assert isinstance(result.content, WebFetchToolResultErrorBlock)
    assert result.content.error_code == "url_not_in_prior_context"
    assert msg.usage.server_tool_use is not None
    assert msg.usage.server_tool_use.web_fetch_requests == 0
    assert _Pages.seen == []


@pytest.mark.parametrize("stream", [False, True])
def test_a_pdf_goes_to_the_client_whole_and_to_the_model_as_text(
    client: anthropic.Anthropic, stub_url: str, pages: str, stream: bool
) -> None:
    url = f"{pages}/paper.pdf"
    msg = _create(client, stream, model="wf", messages=ask(f"Read {url}"), tools=[tool()])
    _, fetched = check_fetched(msg, url)
    source = fetched.content.source
    assert source.type == "base64" and source.media_type == "application/pdf"
    assert source.data == base64.b64encode(PAGES["/paper.pdf"][1]).decode()
    assert PDF_LINE in _tool_message(stub_requests(stub_url)[-1]["body"])["content"]
    # the next turn: the PDF replayed, read again by the PDF workers for the model
    clear_stub(stub_url)
    history = [b.model_dump(exclude_none=True) for b in msg.content]
    messages = [
        *ask(f"Read {url}"),
        {"role": "assistant", "content": history},
        {"role": "user", "content": "and?"},
    ]
    _create(client, stream, model="wf-chat", messages=messages, tools=[tool()])
    (upstream,) = stub_requests(stub_url)
    assert PDF_LINE in _tool_message(upstream["body"])["content"]
    assert _Pages.seen == ["/paper.pdf"]


def test_an_unreadable_content_type_is_an_error_result(
    client: anthropic.Anthropic, pages: str
) -> None:
    msg = client.messages.create(
        model="wf", max_tokens=300, messages=ask(f"get {pages}/blob.bin"), tools=[tool()]
    )
    result = msg.content[1]
    assert isinstance(result, WebFetchToolResultBlock)
    assert isinstance(result.content, WebFetchToolResultErrorBlock)
    assert result.content.error_code == "unsupported_content_type"


@pytest.mark.parametrize("stream", [False, True])
def test_a_verbatim_quote_of_the_document_is_cited_by_char_location(
    client: anthropic.Anthropic, pages: str, stream: bool
) -> None:
    url = f"{pages}/notes.txt"
    msg = _create(
        client,
        stream,
        model="wf-quote",
        messages=ask(f"Read {url}"),
        tools=[tool(citations={"enabled": True})],
    )
    cited = [b for b in msg.content if isinstance(b, TextBlock) and b.citations]
    assert len(cited) == 1
    (citation,) = cited[0].citations or []
    assert isinstance(citation, CitationCharLocation)
    line = PLAIN.splitlines()[0]
    assert cited[0].text == line == citation.cited_text
    assert PLAIN[citation.start_char_index : citation.end_char_index] == line
    assert citation.document_index == 0
    assert "".join(b.text for b in msg.content if isinstance(b, TextBlock)) == (
        f"The page says: {line} That is all."
    )


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("bogus", 1, "tools.0.bogus"),
        ("max_uses", 0, "tools.0.max_uses"),
        ("citations", {"enabled": "yes"}, "tools.0.citations.enabled"),
        ("use_cache", False, "tools.0.use_cache"),  # not a field of web_fetch_20250910
        ("url_sources", {"user_input": {"type": "only"}}, "tools.0.url_sources.user_input.type"),
    ],
)
def test_a_tool_defined_wrongly_is_a_400_naming_the_field(
    client: anthropic.Anthropic, field: str, value: Any, path: str
) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="wf",
            max_tokens=10,
            messages=ask("hi"),
            tools=[tool(**{field: value})],  # type: ignore[list-item]
        )
    assert path in caught.value.message


@pytest.mark.parametrize(
    "where",
    [
        "http://169.254.169.254/latest/meta-data/",  # a cloud metadata service
        "http://10.0.0.1/",  # a private network not in allowed_networks
        "GATEWAY/health",  # the gateway's own port, inside allowed_networks
        "STUB/models",  # the upstream's port, inside allowed_networks
    ],
)
def test_an_address_the_policy_refuses_is_not_accessible(
    client: anthropic.Anthropic, gateway: str, stub_url: str, where: str
) -> None:
    url = where.replace("GATEWAY", gateway.removesuffix("/llm")).replace(
        "STUB", stub_url.removesuffix("/v1")
    )
    msg = client.messages.create(
        model="wf", max_tokens=300, messages=ask(f"Read {url} now"), tools=[tool()]
    )
    result = msg.content[1]
    assert isinstance(result, WebFetchToolResultBlock)
    assert isinstance(result.content, WebFetchToolResultErrorBlock), result.content
    assert result.content.error_code == "url_not_accessible"
    assert msg.usage.server_tool_use is not None
    assert msg.usage.server_tool_use.web_fetch_requests == 0


@pytest.mark.parametrize("stream", [False, True])
def test_one_loop_runs_a_search_then_a_fetch_of_its_result(
    client: anthropic.Anthropic, stub_url: str, stream: bool
) -> None:
    """Both tools in one request: the search's result URL is in context for the fetch (it
    names a host that is not reachable here, so the fetch itself fails, but never as
    ``url_not_in_prior_context``)."""
    query = "local gateways"
    msg = _create(
        client,
        stream,
        model="wf-search",
        messages=ask(query),
        tools=[{"type": "web_search_20250305", "name": "web_search"}, tool()],
    )
    kinds = [b.type for b in msg.content]
    assert kinds == [
        "server_tool_use",
        "web_search_tool_result",
        "server_tool_use",
        "web_fetch_tool_result",
        "text",
    ], kinds
    search, fetch = msg.content[0], msg.content[2]
    assert isinstance(search, ServerToolUseBlock) and search.name == "web_search"
    assert isinstance(fetch, ServerToolUseBlock) and fetch.name == "web_fetch"
    assert fetch.input == {"url": f"https://{HOSTS[0]}/{slug(query)}/1"}
    result = msg.content[3]
    assert isinstance(result, WebFetchToolResultBlock)
    if isinstance(result.content, WebFetchToolResultErrorBlock):
        assert result.content.error_code != "url_not_in_prior_context"
    assert msg.usage.server_tool_use is not None
    assert msg.usage.server_tool_use.web_search_requests == 1
    assert len(stub_requests(stub_url)) == 3  # one loop: search round, fetch round, answer


@pytest.mark.parametrize("citations", [False, True])
def test_ts_sdk_parses_every_block(gateway: str, pages: str, citations: bool) -> None:
    """MessageStream.finalMessage() and messages.create() give the same blocks; the
    stream's server_tool_use input is rebuilt from its input_json_delta, a citation folded
    into its text block."""
    ts_sdk_ready()
    url = f"{pages}/notes.txt"
    spec = json.dumps(tool("web_fetch_20260318", citations={"enabled": citations}))
    proc = subprocess.run(
        ["node", str(CLIENTS / "ts_web_fetch.mjs"), gateway, "wf-quote", f"Read {url}", spec],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=CLIENTS,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout + proc.stderr
    out = json.loads(lines[-1])
    assert "fatal" not in out, out
    assert out["createdKind"] == "object"
    line = PLAIN.splitlines()[0]
    for reply in (out["stream"], out["created"]):
        use, result, *texts = reply["content"]
        assert use["type"] == "server_tool_use" and use["name"] == "web_fetch"
        assert use["input"] == {"url": url}
        assert result["type"] == "web_fetch_tool_result" and result["tool_use_id"] == use["id"]
        fetched = result["content"]
        assert fetched["type"] == "web_fetch_result" and fetched["url"] == url
        assert fetched["content"]["source"] == {
            "type": "text",
            "media_type": "text/plain",
            "data": PLAIN,
        }
        assert "".join(t["text"] for t in texts) == f"The page says: {line} That is all."
        cited = [t for t in texts if t.get("citations")]
        if citations:
            assert [t["text"] for t in cited] == [line]
            assert cited[0]["citations"][0]["type"] == "char_location"
        else:
            assert not cited
        assert reply["usage"]["server_tool_use"]["web_fetch_requests"] == 1
    assert _same_but_ids(out["stream"]["content"]) == _same_but_ids(out["created"]["content"])


def _same_but_ids(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Blocks without what differs between two replies: ids and the fetch's time."""
    out = []
    for block in content:
        block = {k: v for k, v in block.items() if k not in ("id", "tool_use_id")}
        if isinstance(block.get("content"), dict):
            block["content"] = {k: v for k, v in block["content"].items() if k != "retrieved_at"}
        out.append(block)
    return out


def test_a_failed_fetch_logs_its_host_never_its_path_or_query(
    client: anthropic.Anthropic, gateway_proc: tuple[Proc, str], pages: str
) -> None:
    """(The page server's 404: a cause no other test here has, so no line of it within the
    second before holds this one back.)"""
    proc = gateway_proc[0]
    url = f"{pages}/private/path?token=sekrit-value"
    msg = client.messages.create(
        model="wf", max_tokens=300, messages=ask(f"Read {url}"), tools=[tool()]
    )
    result = msg.content[1]
    assert isinstance(result, WebFetchToolResultBlock)
    assert isinstance(result.content, WebFetchToolResultErrorBlock)
    line = wait_for_line(
        proc.output,
        lambda ln: ln.get("event") == "web_fetch_failure" and ln.get("cause") == "http_4xx",
        "the fetch's failure line",
    )
    assert line["error_code"] == "url_not_accessible" and line["host"] == "127.0.0.1"
    assert _Pages.seen == ["/private/path?token=sekrit-value"]
    out = proc.output()
    assert "sekrit-value" not in out and "/private/path" not in out


def test_max_content_tokens_cuts_the_document(client: anthropic.Anthropic, pages: str) -> None:
    url = f"{pages}/notes.txt"
    msg = client.messages.create(
        model="wf", max_tokens=300, messages=ask(f"Read {url}"), tools=[tool(max_content_tokens=5)]
    )
    _, fetched = check_fetched(msg, url)
    assert fetched.content.source.data == PLAIN[:20]  # 4 characters a token


@pytest.mark.parametrize(
    "filters",
    [{"blocked_domains": ["127.0.0.1"]}, {"allowed_domains": ["example.com"]}],
)
def test_the_domain_filters_refuse_before_any_connection(
    client: anthropic.Anthropic, pages: str, filters: dict[str, Any]
) -> None:
    msg = client.messages.create(
        model="wf", max_tokens=300, messages=ask(f"Read {pages}/page.html"), tools=[tool(**filters)]
    )
    result = msg.content[1]
    assert isinstance(result, WebFetchToolResultBlock)
    assert isinstance(result.content, WebFetchToolResultErrorBlock)
    assert result.content.error_code == "url_not_allowed"
    assert _Pages.seen == []


@pytest.mark.parametrize(
    ("filters", "code"),
    [
        ({"allowed_domains": ["127.0.0.1"]}, "url_not_allowed"),
        ({"blocked_domains": ["127.0.0.2"]}, "url_not_allowed"),
        ({"allowed_domains": ["127.0.0.1", "127.0.0.2"]}, None),  # the control: it is fetched
    ],
)
def test_a_redirect_off_the_domain_filters_is_never_requested(
    client: anthropic.Anthropic,
    pages: str,
    other_pages: str,
    filters: dict[str, Any],
    code: str | None,
) -> None:
    url = f"{pages}/hop?to={other_pages}/page.html"
    msg = client.messages.create(
        model="wf", max_tokens=300, messages=ask(f"Read {url}"), tools=[tool(**filters)]
    )
    result = msg.content[1]
    assert isinstance(result, WebFetchToolResultBlock)
    assert _Pages.seen == ["/hop?to=" + other_pages + "/page.html"]
    if code is None:
        assert isinstance(result.content, WebFetchBlock)
        assert result.content.url == f"{other_pages}/page.html"
        assert _OtherPages.seen == ["/page.html"]
    else:
        assert isinstance(result.content, WebFetchToolResultErrorBlock)
        assert result.content.error_code == code
        assert _OtherPages.seen == []
