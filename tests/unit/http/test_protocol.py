"""The HTTP-layer shell (gateway/http/protocol.py, gateway/http/listener.py) and log scrubbing.

The first tests pin what ``GatewayProtocol`` relies on in aiohttp (see the module
docstring of gateway/http/protocol.py): they fail loudly on an aiohttp release that changes it.
The rest run the real app in process on an ephemeral loopback port, or are pure.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import random
import re
import tomllib
from collections.abc import AsyncIterator
from typing import Any
from unittest import mock

import aiohttp
import pytest
from aiohttp import http_exceptions as hx
from aiohttp import web, web_protocol
from aiohttp.http_parser import HttpRequestParserC, HttpRequestParserPy
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from gateway.app import build_app
from gateway.http.keys import METRICS
from gateway.http.middleware import _query_names
from gateway.http.protocol import (
    RequestBodyTimeout,
    classify,
    listen,
    message_for,
    request_path,
)
from gateway.http.writer import ClientGone
from gateway.ops import config, log
from gateway.ops.metrics import CLIENT_HTTP_ERRORS

# --- what aiohttp must keep doing -----------------------------------------------------------


def test_aiohttp_still_builds_parser_errors_through_handle_error() -> None:
    params = list(inspect.signature(web.RequestHandler.handle_error).parameters)
    assert params == ["self", "request", "status", "exc", "message"]
    source = inspect.getsource(web.RequestHandler._make_error_handler)
    assert "self.handle_error(" in source and "err_info.status" in source
    assert "_ErrInfo(" in inspect.getsource(web.RequestHandler.data_received)
    assert "self._messages.append" in inspect.getsource(web.RequestHandler.data_received)
    assert hasattr(web_protocol, "_ErrInfo")
    assert "self.log_access(" in inspect.getsource(web.RequestHandler.finish_response)
    assert "self._request_factory(" in inspect.getsource(web.RequestHandler.start)
    assert "request_factory" in inspect.signature(web.Server).parameters
    # lingering is skipped once force_close() was called (a failed body closes then)
    assert "not self._force_close and lingering_time" in inspect.getsource(web.RequestHandler.start)


def test_aiohttp_version_is_one_the_shell_was_checked_against() -> None:
    major, minor = (int(x) for x in aiohttp.__version__.split(".")[:2])
    assert (3, 9) <= (major, minor) < (4, 0), (
        f"aiohttp {aiohttp.__version__}: check gateway/http/protocol.py's protocol facts, then this"
    )


# --- the parser's refusals, classified ---------------------------------------------------------

REFUSED = {
    b"POST /x HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n": "line_too_long",
    b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n": "line_too_long",
    b"GET / HTTP/1.1\r\n\r\n": "bad_header",  # HTTP/1.1 without Host
    b"POST /x HTTP/1.1\r\nHost: x\r\n"
    + b"".join(b"X-%d: 1\r\n" % i for i in range(200))
    + b"\r\n": "too_many_headers",
    b"POST /x HTTP/1.1\r\nHost: x\r\nX-Api-Key: sk-\x00k\r\n\r\n": "bad_header",
    b"POST /x HTTP/1.1\r\nHost: x\r\nX-Api-Key: sk-\x01k\r\n\r\n": "bad_header",
    b"POST /x HTTP/1.1\r\nHost: x\r\nX Y: 1\r\n\r\n": "bad_header",
    b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n": "length_and_chunked",  # noqa: E501
    b"GARBAGE\r\n\r\n": "bad_request_line",
    b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n": "bad_body",
    b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab": "bad_content_length",  # noqa: E501
    b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n": "bad_transfer_encoding",
}


@pytest.mark.parametrize(
    "parser", [HttpRequestParserC, HttpRequestParserPy], ids=["llhttp", "python"]
)
def test_every_refusal_has_a_kind_and_a_message_without_its_bytes(parser: Any) -> None:
    loop = asyncio.new_event_loop()
    try:
        for raw, want in REFUSED.items():
            p = parser(
                mock.Mock(), loop, 2**16, max_line_size=8190, max_field_size=8190, max_headers=128
            )
            with pytest.raises(hx.HttpProcessingError) as caught:
                p.feed_data(raw)
            kind = classify(caught.value)
            assert kind in CLIENT_HTTP_ERRORS
            if parser is HttpRequestParserC:  # the kinds are read from llhttp's wording
                assert kind == want, (raw[:60], caught.value.message[:60])
            assert "sk-" not in message_for(kind) and "\\x" not in message_for(kind)
    finally:
        loop.close()


def test_kinds_of_what_is_not_a_parser_error() -> None:
    assert classify(None) == "malformed"
    assert classify(ValueError("x")) == "malformed"
    assert classify(hx.BadHttpMethod("G@T")) == "bad_request_line"
    assert classify(hx.BadHttpMethod("\x16\x03\x01")) == "tls"  # a TLS ClientHello
    assert message_for("no such kind") == message_for("malformed")


# --- scrubbing what libraries log --------------------------------------------------------------


@pytest.mark.parametrize(
    "text,secret",
    [
        ("Invalid header value char:\n\n  b'X-Api-Key: sk-\\x01SECRET'\n   ^", "SECRET"),
        ("Got more than 8190 bytes when reading: b'Bearer SECRET" + "K" * 100 + "...'.", "SECRET"),
        ("future: <Task exception=BadHttpMessage(\"400, message: b'sk-SECRET'\")>", "SECRET"),
        ("GET /llm/v1/messages?api_key=SECRET&beta=true HTTP/1.1", "SECRET"),
        ("Transfer-Encoding can't be present: b'sk-SECRET'", "SECRET"),
        ("token " + "S" * 500, "S" * 129),
        ("<CIMultiDictProxy('X-Api-Key': 'SECRET')>", "SECRET"),
    ],
)
def test_scrub_removes_what_a_client_sent(text: str, secret: str) -> None:
    out = log.scrub(text)
    assert secret not in out
    assert len(out) <= 1000


def test_scrub_keeps_plain_words_and_query_names() -> None:
    assert (
        log.scrub("Error handling request from 127.0.0.1")
        == "Error handling request from 127.0.0.1"
    )
    assert log.scrub("GET /p?api_key=x&beta=true") == "GET /p?api_key&beta"


def test_library_records_become_scrubbed_lines_with_frames_not_messages() -> None:
    try:
        raise hx.BadHttpMessage("Invalid header value char:\n\n  b'sk-\\x01SECRET'")
    except hx.BadHttpMessage as exc:
        record = logging.LogRecord(
            "aiohttp.server",
            logging.ERROR,
            __file__,
            1,
            "Error handling request from %s",
            ("127.0.0.1",),
            (type(exc), exc, exc.__traceback__),
        )
    with capture_logs() as logs:
        log._Bridge().emit(record)
    [line] = logs
    assert line["event"] == "library_log" and line["log_level"] == "error"
    assert line["detail"] == "Error handling request from 127.0.0.1"
    assert line["exc_type"] == "BadHttpMessage" and "test_protocol.py" in line["traceback"]
    assert "SECRET" not in json.dumps(line)


def test_the_loop_exception_handler_logs_type_and_frames_only() -> None:
    exc = OSError(24, "Too many open files: 'sk-SECRET'")
    with capture_logs() as logs:
        log.loop_exception_handler(
            mock.Mock(),
            {
                "message": "Task exception was never retrieved",
                "exception": exc,
                "future": "<Task exception=ValueError('sk-SECRET')>",
            },
        )
    [line] = logs
    assert line["event"] == "event_loop_error" and line["errno"] == 24
    assert "SECRET" not in json.dumps(line)


def test_query_names_only() -> None:
    assert _query_names("beta=true&api_key=sk-1&x") == "beta&api_key&x"
    assert _query_names("=v&&a=") == "a"
    assert _query_names("&".join(f"k{i}=v" for i in range(100))).count("&") == 31


# --- the real app on a loopback port ---------------------------------------------------------

_TOML = """
[server]
host = "127.0.0.1"
port = 0
prefix = "/llm"
request_head_timeout = 0.5
request_body_timeout = 0.5
idle_timeout = 5
{extra}

[upstreams.dead]
base_url = "http://127.0.0.1:9/v1"

[[models]]
name = "m"
upstream = "dead"
upstream_model = "m"
"""


async def _gone(request: web.Request) -> web.StreamResponse:
    raise ClientGone()


@pytest.fixture
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[int, Any]]:
    extra = getattr(request, "param", "")
    cfg = config.parse(tomllib.loads(_TOML.format(extra=extra)), "t.toml", {"K": "sk-unit"})
    app = build_app(cfg, CollectorRegistry())
    app.router.add_get("/_gone", _gone)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    assert runner.server is not None
    listeners = listen(runner.server, cfg.server, app[METRICS])
    try:
        yield listeners[0].addresses[0][1], app[METRICS]
    finally:
        for listener in listeners:
            listener.close()
        await runner.cleanup()


async def _exchange(port: int, *parts: bytes, pause: float = 0.1) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for i, part in enumerate(parts):
            if i:
                await asyncio.sleep(pause)
            writer.write(part)
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


def _split(reply: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body) if body else None


async def test_a_refused_request_is_an_envelope_in_the_shape_of_its_path(served) -> None:
    port, metrics = served
    for path, openai in (
        ("/llm/v1/messages", False),
        ("/llm/v1/embeddings", True),
        ("/elsewhere", False),
    ):
        raw = f"POST {path} HTTP/1.1\r\nHost: x\r\nX-Api-Key: sk-\x01SECRET\r\n\r\n".encode()
        status, headers, body = _split(await _exchange(port, raw))
        assert status == 400 and headers["request-id"].startswith("req_")
        assert headers["content-type"].startswith("application/json")
        if openai:
            assert body["error"]["type"] == "invalid_request_error"
        else:
            assert body["request_id"] == headers["request-id"]
        assert "SECRET" not in json.dumps(body)
    value = metrics.registry.get_sample_value(
        "llm_gateway_client_http_errors_total", {"kind": "bad_header"}
    )
    assert value == 3


async def test_every_refusal_is_answered_with_an_http_1_1_status_line(served) -> None:
    """aiohttp's placeholder request for a parser refusal is HTTP/1.0, and the answer took
    its version: a non-numeric Content-Length was answered ``HTTP/1.0 400``."""
    port, _ = served
    for raw in (
        b"POST /llm/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        *REFUSED,
    ):
        reply = await _exchange(port, raw)
        assert reply.startswith(b"HTTP/1.1 400 "), (raw[:60], reply[:40])


async def test_a_body_that_breaks_after_its_head_is_a_400_at_once(served) -> None:
    """llhttp drops the payload and aiohttp queues the error as the next request: without
    the shell the handler waits for the body deadline (a 408)."""
    port, _ = served
    head = (
        b"POST /llm/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"a":\r\n'
    )
    status, headers, body = _split(await _exchange(port, head, b"zz\r\nxx\r\n", pause=0.1))
    assert status == 400  # not the 408 of the body deadline
    assert body["error"]["message"] == "Malformed request body framing"
    assert body["request_id"] == headers["request-id"]


async def test_a_stalled_body_is_a_408_and_the_connection_closes(served) -> None:
    port, _ = served
    head = (
        b"POST /llm/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 50\r\n\r\n{"
    )
    status, _, body = _split(await _exchange(port, head))  # read() returns: it closed
    assert status == 408 and body["error"]["code"] == 408
    assert issubclass(RequestBodyTimeout, Exception)


async def test_a_head_that_drips_is_closed_at_its_deadline(served) -> None:
    port, metrics = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    dripping = True
    for i in range(30):  # 3 s of lines, each well inside the deadline of the one before
        await asyncio.sleep(0.1)
        if reader.at_eof() or writer.is_closing():
            break
        writer.write(b"X-%d: 1\r\n" % i)
    else:
        dripping = False
    assert await asyncio.wait_for(reader.read(), 3) == b""
    assert dripping  # closed while lines were still coming: a deadline, not a silence
    assert 0.45 <= loop.time() - t0 <= 0.5 + 2
    writer.close()
    assert (
        metrics.registry.get_sample_value(
            "llm_gateway_client_http_errors_total", {"kind": "head_timeout"}
        )
        == 1
    )


async def test_keep_alive_requests_each_get_a_fresh_head_deadline(served) -> None:
    """Three requests 0.3 s apart on one connection, each head sent at once: the 0.5 s head
    deadline counts from each head's first byte, not from the connection's."""
    port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(3):
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(15)
        await asyncio.sleep(0.3)
    writer.close()


async def test_a_client_gone_is_a_499_not_an_error(served) -> None:
    port, _ = served
    with capture_logs() as logs:
        reply = await _exchange(
            port, b"GET /_gone HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
    assert not [line for line in logs if line["log_level"] == "error"]
    assert b" 499 " in reply.split(b"\r\n", 1)[0]


@pytest.mark.parametrize("served", ['api_keys_env = "K"'], indirect=True)
async def test_metrics_on_the_api_listener_needs_a_key_when_keys_are_set(served) -> None:
    port, _ = served
    plain = await _exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert plain.startswith(b"HTTP/1.1 401")
    keyed = await _exchange(
        port,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Authorization: Bearer sk-unit\r\n\r\n",
    )
    assert keyed.startswith(b"HTTP/1.1 200") and b"llm_gateway_build_info" in keyed


# what request_path replaced, kept as the reference it must agree with
_REQUEST_LINE = re.compile(rb"[A-Z]{1,16} ([^ ?#\r\n]{1,512})")

REQUEST_LINES = [
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /llm/v1/messages?beta=true HTTP/1.1\r\n",
    b"GET /v1/models#frag HTTP/1.1\r\n",
    b"GET /v1/models\r\n",
    b"GET /a\nb",
    b"POST /v1/chat/comp",  # the line cut short: what has arrived
    b"PROPPATCHPROPPATC /x HTTP/1.1",  # a 17-letter method
    b"PROPPATCHPROPPATH /x HTTP/1.1",  # 16 letters... and 17 again
    b"MKCALENDARMKCALE /x HTTP/1.1",  # 16
    b"post /v1/messages HTTP/1.1",
    b"P0ST /v1/messages HTTP/1.1",
    b" /v1/messages HTTP/1.1",
    b"GET  /double-space HTTP/1.1",
    b"GET ?only-query HTTP/1.1",
    b"GET /" + b"x" * 600 + b" HTTP/1.1",
    b"GET /caf\xc3\xa9 HTTP/1.1",
    b"",
    b"GET",
    b"GET ",
]


@pytest.mark.parametrize("data", REQUEST_LINES)
def test_request_path_is_what_the_request_line_pattern_matched(data: bytes) -> None:
    line = _REQUEST_LINE.match(data)
    assert request_path(data) == (line[1] if line is not None else None)


def test_request_path_agrees_on_random_lines() -> None:
    rng = random.Random(7)
    alphabet = b"GETPOSgetp /?#\r\n\x00\xff-v1"
    for _ in range(20_000):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 24)))
        line = _REQUEST_LINE.match(data)
        assert request_path(data) == (line[1] if line is not None else None), data
