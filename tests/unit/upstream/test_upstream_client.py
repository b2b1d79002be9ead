"""gateway/upstream/client.py over loopback sockets: request ids, keep-alive, caps, deadlines,
how each failure is classified, counted and logged, and one retry of a disconnect."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from gateway import errors
from gateway.ops.config import UpstreamConfig
from gateway.ops.metrics import PROTOCOL_ERRORS, Metrics
from gateway.text.redact import secrets_of
from gateway.upstream import UpstreamClient
from gateway.upstream import failures as failures_module
from tests.upstream_wire import (
    ANOMALIES,
    CHUNKED_HEAD,
    RID,
    Handler,
    Row,
    Upstream,
    chunked_body,
    drip_handler,
    echo_handler,
    http_reply,
    settle,
    table_params,
    upstream_config,
)

# --- the client: deadlines, caps, classification, logs -------------------------------------------


def _client(srv: Upstream, **cfg: Any) -> UpstreamClient:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.add_upstream("u")
    client = UpstreamClient(
        replace(upstream_config(srv), **cfg), protocol_errors=metrics.upstream_protocol_errors
    )
    client.registry = registry  # type: ignore[attr-defined]
    return client


def _protocol_errors(client: UpstreamClient, kind: str) -> float | None:
    return client.registry.get_sample_value(  # type: ignore[attr-defined]
        "llm_gateway_upstream_protocol_errors_total", {"upstream": "u", "kind": kind}
    )


async def test_upstream_client_retries_a_disconnect_once_and_succeeds() -> None:
    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(http_reply(b'{"n":%d}' % len(srv.requests)))
        if index == 0:
            await srv.read_request(reader)  # dropped unanswered
        else:
            await srv.wait_client_close(reader)

    async with Upstream(handler) as srv:
        client = UpstreamClient(upstream_config(srv))
        await client.start()
        try:
            bodies = []
            for _ in range(2):
                resp = await client.request("/chat/completions", b"{}", stream=False)
                async with resp:
                    bodies.append(await resp.read())
        finally:
            await client.close()
        assert bodies == [b'{"n":1}', b'{"n":3}']
        assert len(srv.requests) == 3
        assert all(r.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") for r in srv.requests)
        assert srv.connections == 2


async def test_upstream_client_retries_only_once() -> None:
    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)  # every request dropped unanswered

    async with Upstream(handler) as srv:
        client = UpstreamClient(upstream_config(srv))
        await client.start()
        try:
            with pytest.raises(errors.UpstreamUnavailable):
                await client.request("/chat/completions", b"{}", stream=False)
        finally:
            await client.close()
        assert srv.connections == 2


async def test_the_attempts_own_id_goes_upstream_and_a_mismatch_is_a_500() -> None:
    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(http_reply(b"{}", b"X-Request-Id: req_someone_else"))
        await srv.wait_client_close(reader)

    async with Upstream(handler) as srv:
        client = _client(srv)
        await client.start()
        try:
            with capture_logs() as logs, pytest.raises(errors.UpstreamError) as caught:
                await client.request(
                    "/chat/completions", b"{}", stream=False, request_id="req_mine"
                )
        finally:
            await client.close()
        assert (caught.value.status, caught.value.error_type) == (500, "api_error")
        sent = _sent_ids(srv)
        assert len(sent) == 1 and _ATTEMPT_ID.fullmatch(sent[0]), srv.requests
        await asyncio.wait_for(srv.eof.wait(), 1.0)  # the connection was closed
        assert _protocol_errors(client, "request_id_mismatch") == 1
        assert all(
            _protocol_errors(client, k) == 0 for k in PROTOCOL_ERRORS if k != "request_id_mismatch"
        )
        assert logs == [
            {
                "event": "upstream_failure",
                "log_level": "warning",
                "upstream": "u",
                "phase": "head",
                "cause": "protocol_error",
                "kind": "request_id_mismatch",
                "request_id": "req_mine",
                "upstream_request_id": sent[0].decode(),
            }
        ]


# --- the X-Request-Id sent upstream: the attempt's own, whatever the client sent ----------------

_ATTEMPT_ID = re.compile(rb"gw-[A-Za-z0-9]{12}-[0-9a-f]+")


def _sent_ids(srv: Upstream) -> list[bytes]:
    """The X-Request-Id of each request the upstream read, in order (b"" for none)."""
    return [
        m[1] if (m := re.search(rb"\r\nX-Request-Id: ([^\r]*)\r\n", r)) else b""
        for r in srv.requests
    ]


def _503_first() -> Handler:
    """The first request of all answered 503, every other as echo_handler does."""
    echoing = echo_handler()

    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if index == 0:
            await srv.read_request(reader)
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
            await srv.wait_client_close(reader)
            return
        await echoing(srv, index, reader, writer)

    return handler


def _drops_the_second() -> Handler:
    """Each connection answers its first request and drops its second unanswered (as a
    server closing an idle keep-alive connection the moment a request arrives)."""

    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(http_reply(srv.requests[-1].split(b" ")[1]))
        try:
            await srv.read_request(reader)
        except asyncio.IncompleteReadError:
            return

    return handler


@dataclass(frozen=True)
class IdRow:
    name: str
    handler: Callable[[], Handler]
    paths: tuple[str, ...]  # requested in turn, each with the same client x-request-id
    sends: int  # requests the upstream read: one per attempt
    replicas: int = 1  # of the one server


ID_ROWS = [
    IdRow("one client id on two requests", echo_handler, ("/a", "/b"), 2),
    # the copy of /double arrives while /b waits on the reused connection: with one id for
    # both, the copy would pass for /b's reply; it is refused and /b sent again, fresh
    IdRow("a stray copy read by the next request", echo_handler, ("/double", "/b"), 3),
    IdRow("a 503, then the next replica", _503_first, ("/a",), 2, replicas=2),
    IdRow("a reused connection dropped, sent again on it", _drops_the_second, ("/a", "/b"), 3),
]


@pytest.mark.parametrize("row", ID_ROWS, ids=[r.name for r in ID_ROWS])
async def test_every_attempt_goes_upstream_with_an_id_of_its_own(row: IdRow) -> None:
    """The client sends one x-request-id every time (a proxy that sets a fixed one): each
    attempt, retries included, still carries a new id, never the client's."""
    async with Upstream(row.handler()) as srv:
        client = _client(srv, base_urls=(srv.url + "/v1",) * row.replicas)
        await client.start()
        try:
            bodies = []
            for path in row.paths:
                async with await client.request(
                    path, b"{}", stream=False, at_root=True, request_id="req_fixed"
                ) as resp:
                    bodies.append(await resp.read())
        finally:
            await client.close()
    assert bodies == [p.encode() for p in row.paths]  # each its own reply
    sent = _sent_ids(srv)
    assert len(sent) == row.sends, srv.requests
    assert all(_ATTEMPT_ID.fullmatch(rid) for rid in sent), sent
    assert len(set(sent)) == len(sent), sent


async def test_keepalive_false_sends_connection_close_and_never_reuses() -> None:
    async with Upstream(echo_handler()) as srv:
        client = _client(srv, keepalive=False)
        await client.start()
        try:
            for _ in range(3):
                resp = await client.request("/chat/completions", b"{}", stream=False)
                async with resp:
                    assert await resp.read() == b"/v1/chat/completions"
            await settle(lambda: client.open_connections == 0)
        finally:
            await client.close()
        assert srv.connections == 3
        assert all(b"\r\nConnection: close\r\n" in r for r in srv.requests)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_buffered_reply_over_max_response_bytes_is_a_500_and_closes(
    framing: str,
) -> None:
    body = b"x" * 5000

    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        if framing == "chunked":
            pieces = [body[i : i + 100] for i in range(0, 5000, 100)]
            writer.write(CHUNKED_HEAD + chunked_body(*pieces))
        else:
            writer.write(http_reply(body))
        await srv.wait_client_close(reader)

    async with Upstream(handler) as srv:
        client = _client(srv, max_response_bytes=4096)
        await client.start()
        try:
            resp = await client.request("/chat/completions", b"{}", stream=False)
            with capture_logs() as logs, pytest.raises(errors.UpstreamError) as caught:
                async with resp:
                    await resp.read()
            await asyncio.wait_for(srv.eof.wait(), 1.0)
        finally:
            await client.close()
        assert (caught.value.status, caught.value.error_type) == (500, "api_error")
        assert [(e["phase"], e["cause"]) for e in logs] == [("body", "too_large")]


async def test_a_malformed_head_is_a_500_not_an_overload_and_is_not_retried() -> None:
    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok")
        await srv.wait_client_close(reader)

    async with Upstream(handler) as srv:
        client = _client(srv)
        await client.start()
        try:
            with pytest.raises(errors.UpstreamError) as caught:
                await client.request("/chat/completions", b"{}", stream=False)
        finally:
            await client.close()
        err = caught.value
        assert (err.status, err.error_type, err.retry_after) == (500, "api_error", None)
        assert srv.connections == 1
        assert _protocol_errors(client, "malformed") == 1


async def test_a_cut_body_is_a_500() -> None:
    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhel")
        writer.close()

    async with Upstream(handler) as srv:
        client = _client(srv)
        await client.start()
        try:
            resp = await client.request("/chat/completions", b"{}", stream=True)
            with capture_logs() as logs, pytest.raises(errors.UpstreamError) as caught:
                async with resp:
                    async for _ in resp.chunks():
                        pass
        finally:
            await client.close()
        assert (caught.value.status, caught.value.message) == (500, "Upstream connection lost")
        assert [(e["phase"], e["cause"]) for e in logs] == [("body", "cut")]


@pytest.mark.parametrize(
    ("read", "how"),
    [("chunks", "close"), ("chunks", "abort"), ("read", "close"), ("read", "abort")],
)
async def test_a_body_cut_by_its_replica_ejects_it(read: str, how: str) -> None:
    """A connection lost in the body (cut or reset) is the replica's doing, as one lost
    before the head is: a replica that cuts every buffered reply was never ejected."""

    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhel")
        await writer.drain()
        if how == "abort":
            writer.transport.abort()
        else:
            writer.close()

    async with Upstream(handler) as srv:
        urls = (srv.url + "/v1", f"http://127.0.0.1:{_refused_port()}/v1")
        client = _client(srv, base_urls=urls)
        await client.start()
        cut = client.replicas.all[0]
        try:
            resp = await client.request("/chat/completions", b"{}", stream=read == "chunks")
            assert resp._replica is cut
            with pytest.raises(errors.UpstreamError) as caught:
                async with resp:
                    if read == "read":
                        await resp.read()
                    async for _ in resp.chunks():
                        pass
        finally:
            await client.close()
        assert caught.value.status == 500  # the client's error is as it was
        assert (cut.failures, cut.in_flight) == (1, 0)
        assert cut.state(cut.ejected_until - 0.1) == "ejected"


async def test_a_stream_without_events_ends_at_idle_timeout_with_504() -> None:
    blank = chunked_body(b"\n")[:-5]
    async with Upstream(drip_handler(CHUNKED_HEAD, [blank] * 50, 0.02)) as srv:
        client = _client(srv, idle_timeout=0.2)
        await client.start()
        try:
            resp = await client.request("/chat/completions", b"{}", stream=True)
            with pytest.raises(errors.UpstreamTimeout) as caught:
                async with resp:
                    async for chunk in resp.chunks():
                        if b"data:" in chunk:
                            resp.progress()
        finally:
            await client.close()
        assert caught.value.message == "Upstream stopped sending"


def _refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed at once: nothing listens there


async def test_a_refused_connection_is_a_retryable_529_logged_with_its_cause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(failures_module, "_LOG_EVERY", 0.2)
    cfg = UpstreamConfig(
        name="down", base_url=f"http://127.0.0.1:{_refused_port()}/v1", api_key="sk-very-secret"
    )
    client = UpstreamClient(cfg)
    await client.start()
    try:
        with capture_logs() as logs:
            for _ in range(3):
                with pytest.raises(errors.UpstreamUnavailable) as caught:
                    await client.request(
                        "/chat/completions", b"{}", stream=False, request_id="req_1"
                    )
                assert caught.value.status == 529
                assert caught.value.headers["retry-after"] == "1"
            await asyncio.sleep(0.25)
            with pytest.raises(errors.UpstreamUnavailable):
                await client.request("/chat/completions", b"{}", stream=False, request_id="req_2")
    finally:
        await client.close()
    # one line a cause per interval, the ones held back counted in the next
    assert logs == [
        {
            "event": "upstream_failure",
            "log_level": "warning",
            "upstream": "down",
            "phase": "connect",
            "cause": "refused",
            "request_id": "req_1",
        },
        {
            "event": "upstream_failure",
            "log_level": "warning",
            "upstream": "down",
            "phase": "connect",
            "cause": "refused",
            "request_id": "req_2",
            "suppressed": 2,
        },
    ]
    assert "sk-very-secret" not in repr(logs)


def test_the_client_exposes_its_secrets_in_every_form() -> None:
    cfg = UpstreamConfig(name="u", base_url="http://h:1/v1", api_key="k+y/=")
    # one list of forms for the client and the app-wide redactor (gateway/text/redact.py)
    assert UpstreamClient(cfg).secrets == secrets_of(cfg)
    assert {"k+y/=", "Bearer k+y/=", "k%2By%2F%3D"} <= set(UpstreamClient(cfg).secrets)
    plain = UpstreamConfig(name="u", base_url="http://h:1/v1", api_key="sk-abc")
    assert {"sk-abc", "Bearer sk-abc"} <= set(UpstreamClient(plain).secrets)
    assert UpstreamClient(UpstreamConfig(name="u", base_url="http://h:1/v1")).secrets == ()


def test_protocol_error_series_start_at_zero_for_each_upstream() -> None:
    registry = CollectorRegistry()
    Metrics(registry).add_upstream("a")
    for kind in PROTOCOL_ERRORS:
        assert (
            registry.get_sample_value(
                "llm_gateway_upstream_protocol_errors_total", {"upstream": "a", "kind": kind}
            )
            == 0
        )


@table_params(ANOMALIES)
async def test_each_anomaly_through_the_client_is_a_500_counted_and_clears_the_pool(
    row: Row,
) -> None:
    """Over a socket: the request that met the anomaly fails cleanly, the kind is counted,
    the upstream's idle connections are closed with it, and the next request gets its own
    reply on a fresh connection."""

    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            request = await srv.read_request(reader)
            path = request.split(b" ")[1]
            if path.endswith(b"/bad"):
                writer.write(row.wire)
                if row.eof:
                    writer.write_eof()
                await srv.stop.wait()
                return
            writer.write(http_reply(path))

    async with Upstream(handler) as srv:
        client = _client(srv)
        await client.start()
        try:

            async def get(path: str) -> bytes:
                resp = await client.request(path, b"{}", stream=False, request_id=RID.decode())
                async with resp:
                    return await resp.read()

            assert await asyncio.gather(get("/warm1"), get("/warm2")) == [
                b"/v1/warm1",
                b"/v1/warm2",
            ]
            assert client.members.pools and client.members.pools[0].idle_connections == 2
            with pytest.raises(errors.UpstreamError) as caught:
                await get("/bad")
            assert (caught.value.status, caught.value.error_type) == (500, "api_error")
            # a reply naming another request, read on a reused connection, never reached the
            # client: the request went out once more, on a fresh connection (refused again)
            sent = 2 if row.expected[1] == "request_id_mismatch" else 1
            assert _protocol_errors(client, row.expected[1]) == sent
            await settle(lambda: client.open_connections == 0)
            assert await get("/next") == b"/v1/next"
            assert srv.connections == 2 + sent
        finally:
            await client.close()


@pytest.mark.parametrize(
    "urls",
    [
        ("http://gpu-node-7:8000/v1",),
        ("http://user:pw@gpu-node-7:8000/v1",),  # the userinfo is no part of the host quoted
        ("http://other-node:1/v1", "http://user:pw@gpu-node-7:8000/v1"),
    ],
)
def test_a_replica_host_is_scrubbed_with_or_without_userinfo(urls: tuple[str, ...]) -> None:
    cfg = UpstreamConfig(name="u", base_url=urls[0], base_urls=urls if len(urls) > 1 else ())
    hosts = UpstreamClient(cfg).hosts
    assert "gpu-node-7" in hosts
    raw = b'{"error": {"message": "model not loaded on gpu-node-7, retry"}}'
    assert "gpu-node-7" not in errors.from_upstream(400, raw, hosts=hosts).message


@pytest.mark.parametrize(
    ("status", "retry_after", "sent"),
    [
        (429, b"7", "7"),  # the engine's own wait, passed on
        (503, b"12", "12"),  # an overloaded engine: the 529 carries it
        (429, b"0", "1"),  # 0 would mean "the SDK's default backoff": at least 1
        (429, b"86400", "300"),  # capped
        (429, b"Wed, 21 Oct 2026 07:28:00 GMT", "1"),  # a date: the default stands
        (429, b"-3", "1"),
        (429, None, "1"),
        (500, b"7", None),  # no retry-after on a 500
    ],
)
async def test_an_engines_retry_after_reaches_the_client(
    status: int, retry_after: bytes | None, sent: str | None
) -> None:
    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        extra = b"Retry-After: " + retry_after + b"\r\n" if retry_after is not None else b""
        body = b'{"error":{"message":"busy"}}'
        writer.write(
            b"HTTP/1.1 %d X\r\n%bContent-Length: %d\r\n\r\n%b" % (status, extra, len(body), body)
        )
        await srv.wait_client_close(reader)

    async with Upstream(handler) as srv:
        client = _client(srv)
        await client.start()
        try:
            with pytest.raises(errors.UpstreamError) as caught:
                await client.request("/chat/completions", b"{}", stream=False)
        finally:
            await client.close()
    assert caught.value.headers.get("retry-after") == sent
