"""``llm-gateway --demo`` fetching a page with the ``web_fetch`` server tool (#36).

The real demo: the tiny llama.cpp model, whose chat template writes its one tool call and
fills a required ``url`` string with the first URL of the user's last message
(gateway/demo/toolcall.py). The gateway runs ``--demo --config`` with ``[web_fetch] enabled``
and ``allowed_networks = ["127.0.0.0/8"]``; a page server on 127.0.0.1 counts its requests.

What the client must see, parsed by the Python SDK with strict response validation,
buffered and streamed: ONE message holding a ``server_tool_use`` (name ``web_fetch``, input
``{"url": the user's URL}``), its ``web_fetch_tool_result`` (a ``web_fetch_result`` whose
document is the page's text), then the model's answer (the demo's fixed sentence: with a tool
result in the turn its template writes no call), and ``usage.server_tool_use.
web_fetch_requests == 1``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import ServerToolUseBlock, WebFetchBlock, WebFetchToolResultBlock

from gateway.demo.tinymodel import ANSWER_TEXT
from tests import sdk
from tests.procs import Proc, free_port, require_demo_extra, wait_http

pytestmark = [pytest.mark.e2e, pytest.mark.llamacpp]

LINE = "The demo model read this page through the gateway."
HTML = f"<html><head><title>Demo page</title></head><body><p>{LINE}</p></body></html>"


class _Page(BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.path)
        if self.path != "/page.html":
            self.send_error(404)
            return
        body = HTML.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def page() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/page.html"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


CONFIG = """
[server]
host = "127.0.0.1"
prefix = "/llm"

[web_fetch]
enabled = true
allowed_networks = ["127.0.0.0/8"]
fetch_timeout = 10

# a config needs one route of its own; --demo adds "demo" (nothing listens on port 9)
[upstreams.unused]
base_url = "http://127.0.0.1:9/v1"

[[models]]
name = "unused"
upstream = "unused"
upstream_model = "unused"
"""


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``llm-gateway --demo --config`` with web fetch on (the model built into a fresh cache)."""
    require_demo_extra()
    folder = tmp_path_factory.mktemp("demo-fetch")
    config = Path(folder / "gateway.toml")
    config.write_text(CONFIG)
    port = free_port()
    proc = Proc(
        [sys.executable, "-m", "gateway", "--demo", "--config", str(config), "--port", str(port)],
        env={"XDG_CACHE_HOME": str(folder / "cache"), "XDG_STATE_HOME": str(folder / "state")},
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=120, proc=proc.popen)
        yield f"http://127.0.0.1:{port}/llm"
    finally:
        proc.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_the_demo_model_fetches_the_page_the_user_names(demo: str, page: str, stream: bool) -> None:
    _Page.seen.clear()
    client = sdk.client(demo, api_key="k", max_retries=0, _strict_response_validation=True)
    body: dict[str, Any] = {
        "model": "demo",
        "max_tokens": 400,
        "messages": [{"role": "user", "content": f"Please read {page} for me."}],
        "tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}],
    }
    if stream:
        with client.messages.stream(**body) as events:
            msg = events.get_final_message()
    else:
        msg = client.messages.create(**body)
    blocks = [b for b in msg.content if b.type != "thinking"]
    assert [b.type for b in blocks] == ["server_tool_use", "web_fetch_tool_result", "text"]
    use, result, text = blocks
    assert isinstance(use, ServerToolUseBlock) and use.name == "web_fetch"
    assert use.input == {"url": page}
    assert isinstance(result, WebFetchToolResultBlock) and result.tool_use_id == use.id
    assert isinstance(result.content, WebFetchBlock), result.content
    assert result.content.url == page
    assert LINE in result.content.content.source.data
    assert text.text == ANSWER_TEXT
    assert msg.stop_reason == "end_turn"
    assert msg.usage.server_tool_use is not None
    assert msg.usage.server_tool_use.web_fetch_requests == 1
    assert _Page.seen == ["/page.html"]


def test_without_a_url_in_the_message_nothing_is_fetched(demo: str) -> None:
    _Page.seen.clear()
    client = sdk.client(demo, api_key="k", max_retries=0, _strict_response_validation=True)
    msg = client.messages.create(
        model="demo",
        max_tokens=400,
        messages=[{"role": "user", "content": "Please read the page for me."}],
        tools=[{"type": "web_fetch_20250910", "name": "web_fetch"}],
    )
    blocks = [b for b in msg.content if b.type != "thinking"]
    assert [b.type for b in blocks][:2] == ["server_tool_use", "web_fetch_tool_result"]
    result = blocks[1]
    assert isinstance(result, WebFetchToolResultBlock)
    assert result.content.type == "web_fetch_tool_result_error"
    assert result.content.error_code == "invalid_tool_input"  # the call carried "demo"
    assert _Page.seen == []
