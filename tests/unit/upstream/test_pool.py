"""gateway/upstream/pool.py over real loopback sockets: keep-alive and exact request bytes,
FIFO slots, deadlines, reuse and its limits, TLS, and the desync defence (a stray reply never
reaches the next request). The protocol facts are listed in test_connection.py."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway import errors
from gateway.ops.config import UpstreamConfig
from gateway.upstream import UpstreamClient
from gateway.upstream import pool as pool_module
from gateway.upstream.exceptions import (
    BrokenResponse,
    ConnectFailed,
    Disconnected,
    PoolTimeout,
    ProtocolError,
)
from gateway.upstream.pool import Pool, Response
from tests.upstream_wire import (
    CHUNKED_HEAD,
    LATE,
    Upstream,
    chunked_body,
    drip_handler,
    echo_handler,
    http_reply,
    keep_serving,
    partial_body_handler,
    pool_get,
    settle,
)
from tests.waits import eventually

# --- the pool over real sockets --------------------------------------------------------------


async def test_keep_alive_reuses_one_connection_and_sends_exact_request_bytes(pools: Any) -> None:
    async with Upstream(keep_serving) as srv:
        pool = pools(
            srv.url, extra_headers={"Content-Type": "application/json", "Authorization": "Bearer k"}
        )
        big = b"x" * 20000  # past 16 KiB the head and body go out as two buffers
        assert await pool_get(pool, "/v1/chat/completions", b'{"a":1}', method="POST") == b"ok"
        assert await pool_get(pool, "/v1/chat/completions", big, method="POST") == b"ok"
        assert await pool_get(pool) == b"ok"
        assert srv.connections == 1
        assert pool.open_connections == 1
        fixed = (
            b"Host: " + srv.host.encode() + b"\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer k\r\n"
        )
        assert srv.requests == [
            b"POST /v1/chat/completions HTTP/1.1\r\n" + fixed + b'Content-Length: 7\r\n\r\n{"a":1}',
            b"POST /v1/chat/completions HTTP/1.1\r\n"
            + fixed
            + b"Content-Length: 20000\r\n\r\n"
            + big,
            b"GET /v1/models HTTP/1.1\r\n" + fixed + b"\r\n",
        ]


async def test_userinfo_never_reaches_the_host_header(pools: Any) -> None:
    async with Upstream(keep_serving) as srv:
        pool = pools(srv.url.replace("//", "//user:secret@"))
        assert await pool_get(pool) == b"ok"
        assert srv.requests == [
            b"GET /v1/models HTTP/1.1\r\nHost: " + srv.host.encode() + b"\r\n\r\n"
        ]


async def test_pool_limit_makes_the_second_request_wait_for_the_first(pools: Any) -> None:
    async with Upstream(keep_serving) as srv:
        pool = pools(srv.url, limit=1)
        first = await pool.request("GET", "/a", None, head_timeout=1, body_timeout=1)
        second = asyncio.create_task(pool_get(pool, "/b"))
        await eventually(lambda: len(pool._waiters) == 1, "the second request queued")
        assert not second.done()
        assert len(srv.requests) == 1  # the second has not been sent
        assert await first.read() == b"ok"
        first.release()
        assert await asyncio.wait_for(second, 1.0) == b"ok"
        assert [r.split(b" ")[1] for r in srv.requests] == [b"/a", b"/b"]
        assert srv.connections == 1  # the waiter took the released connection


async def test_a_freed_slot_goes_to_the_oldest_waiter_not_a_newcomer(pools: Any) -> None:
    async with Upstream(keep_serving) as srv:
        pool = pools(srv.url, limit=1)
        first = await pool.request("GET", "/first", None, head_timeout=1, body_timeout=1)
        waiting = asyncio.create_task(pool_get(pool, "/waiting"))
        await eventually(lambda: len(pool._waiters) == 1, "the waiter queued")
        assert await first.read() == b"ok"
        first.release()  # the waiter is woken holding the slot...
        async with asyncio.timeout(1.0):  # in this task, before the waiter's turn comes
            newcomer = await pool_get(pool, "/newcomer")  # ...so this one queues behind it
        assert newcomer == b"ok" and await waiting == b"ok"
        assert [r.split(b" ")[1] for r in srv.requests] == [b"/first", b"/waiting", b"/newcomer"]


async def test_waiting_for_a_pool_slot_counts_against_the_head_timeout(pools: Any) -> None:
    async with Upstream(keep_serving) as srv:
        pool = pools(srv.url, limit=1)
        first = await pool.request("GET", "/a", None, head_timeout=1, body_timeout=1)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(PoolTimeout):
            await pool.request("GET", "/b", None, head_timeout=0.2, body_timeout=1)
        assert 0.19 <= loop.time() - start < 0.2 + LATE
        assert len(srv.requests) == 1  # the second was never sent
        assert await first.read() == b"ok"
        first.release()
        assert await asyncio.wait_for(pool_get(pool, "/c"), 1.0) == b"ok"  # no slot leaked


async def test_failed_request_gives_its_pool_slot_back(pools: Any) -> None:
    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        if index == 0:
            writer.write(b"NOT HTTP\r\n\r\n")
            await srv.wait_client_close(reader)
        else:
            writer.write(http_reply())
            await srv.stop.wait()

    async with Upstream(handler) as srv:
        pool = pools(srv.url, limit=1)
        with pytest.raises(BrokenResponse):
            await pool_get(pool)
        assert await asyncio.wait_for(pool_get(pool), 1.0) == b"ok"
        assert srv.connections == 2
        assert srv.eofs == 1  # the broken connection was closed


async def test_connect_refused_is_connect_failed_and_frees_the_slot(pools: Any) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed at once: nothing listens there
    pool = pools(f"http://127.0.0.1:{port}", limit=1, connect_timeout=1.0)
    for _ in range(2):  # a leaked slot would make the second wait forever
        with pytest.raises(ConnectFailed) as caught:
            await asyncio.wait_for(pool_get(pool), 1.0)
        assert caught.value.cause == "refused"
    assert pool.open_connections == 0


async def test_no_reply_times_out_after_head_timeout(pools: Any) -> None:
    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        await srv.wait_client_close(reader)  # never replies

    async with Upstream(handler) as srv:
        pool = pools(srv.url)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):
            await pool.request("GET", "/", None, head_timeout=0.2, body_timeout=5.0)
        assert 0.19 <= loop.time() - start < 0.2 + LATE
        await asyncio.wait_for(srv.eof.wait(), 1.0)  # the connection was dropped
        assert pool.open_connections == 0


async def test_a_stalled_buffered_body_times_out_at_its_deadline_from_the_send(
    pools: Any,
) -> None:
    async with Upstream(partial_body_handler(10, b"hello")) as srv:
        pool = pools(srv.url)
        loop = asyncio.get_running_loop()
        start = loop.time()
        resp = await pool.request("GET", "/", None, head_timeout=0.2, body_timeout=0.3)
        assert await resp.readany() == b"hello"
        with pytest.raises(TimeoutError):
            await resp.readany()
        assert 0.29 <= loop.time() - start < 0.3 + LATE
        resp.close()
        await asyncio.wait_for(srv.eof.wait(), 1.0)


async def test_a_slow_steady_stream_is_not_a_timeout(pools: Any) -> None:
    """A stream's timeout bounds the gap between events, not the whole body."""
    events = [chunked_body(b"data: %d\n\n" % i)[:-5] for i in range(6)]  # without the last chunk
    async with Upstream(drip_handler(CHUNKED_HEAD, events, 0.1)) as srv:
        pool = pools(srv.url)
        resp = await pool.request("GET", "/", None, head_timeout=0.5, body_timeout=0.5, stream=True)
        got = b""
        while chunk := await resp.readany():
            got += chunk
            resp.progress()
        assert got.count(b"data:") == 6  # 0.6 s in all, never 0.5 s without an event
        resp.release()


async def test_a_slow_steady_buffered_body_is_due_at_its_deadline(pools: Any) -> None:
    """A buffered reply dripping a byte at a time still ends at response_timeout."""
    async with Upstream(drip_handler(CHUNKED_HEAD, [b"1\r\nx\r\n"] * 200, 0.02)) as srv:
        pool = pools(srv.url)
        loop = asyncio.get_running_loop()
        start = loop.time()
        resp = await pool.request("GET", "/", None, head_timeout=0.2, body_timeout=0.3)
        with pytest.raises(TimeoutError):
            await resp.read()
        assert 0.29 <= loop.time() - start < 0.3 + LATE
        resp.close()


async def test_upstream_closing_a_reused_connection_before_replying_is_disconnected(
    pools: Any,
) -> None:
    """The keep-alive race: the server closed the idle socket as the request went out."""

    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(http_reply())
        await srv.read_request(reader)  # the second request on this connection: dropped

    async with Upstream(handler) as srv:
        pool = pools(srv.url)
        assert await pool_get(pool) == b"ok"
        with pytest.raises(Disconnected):
            await pool_get(pool)
        assert srv.connections == 1
        assert pool.open_connections == 0


async def test_an_idle_connection_closed_by_the_upstream_is_not_reused(pools: Any) -> None:
    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(http_reply())  # then closes, though the reply allowed keep-alive

    async with Upstream(handler) as srv:
        pool = pools(srv.url)
        assert await pool_get(pool) == b"ok"
        await settle(lambda: pool.open_connections == 0)
        assert await pool_get(pool) == b"ok"
        assert srv.connections == 2


async def test_response_close_mid_body_closes_the_upstream_socket(pools: Any) -> None:
    async with Upstream(partial_body_handler(1000, b"first")) as srv:
        pool = pools(srv.url)
        resp = await pool.request("GET", "/", None, head_timeout=1, body_timeout=1)
        assert await resp.readany() == b"first"
        assert not resp.at_eof
        resp.close()
        await asyncio.wait_for(srv.eof.wait(), 1.0)
        assert pool.open_connections == 0


async def test_release_before_the_end_of_the_body_closes_instead_of_pooling(pools: Any) -> None:
    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        writer.write(
            http_reply(b"0123456789")
            if index
            else b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234"
        )
        await srv.wait_client_close(reader)

    async with Upstream(handler) as srv:
        pool = pools(srv.url)
        resp = await pool.request("GET", "/", None, head_timeout=1, body_timeout=1)
        assert await resp.readany() == b"01234"
        resp.release()
        await asyncio.wait_for(srv.eof.wait(), 1.0)
        assert await pool_get(pool) == b"0123456789"
        assert srv.connections == 2


async def test_read_with_a_limit_stops_there() -> None:
    async with Upstream(keep_serving) as srv:
        pool = Pool(srv.url)
        try:
            resp = await pool.request("GET", "/", None, head_timeout=1, body_timeout=1)
            assert isinstance(resp, Response)
            assert (resp.status, resp.headers) == (200, {b"content-length": b"2"})
            assert await resp.read(1) == b"o"
            resp.close()
        finally:
            await pool.close()


async def test_pool_close_closes_every_connection_and_fails_waiters(pools: Any) -> None:
    async with Upstream(keep_serving) as srv:
        pool = pools(srv.url, limit=2)
        assert await pool_get(pool) == b"ok"  # back in the pool, idle
        busy1 = await pool.request("GET", "/", None, head_timeout=1, body_timeout=1)
        busy2 = await pool.request("GET", "/", None, head_timeout=1, body_timeout=1)
        waiter = asyncio.create_task(pool_get(pool))
        await eventually(lambda: len(pool._waiters) == 1, "the third request queued")
        assert not waiter.done()
        assert pool.open_connections == 2 and srv.connections == 2
        await pool.close()
        assert pool.open_connections == 0
        await settle(lambda: srv.eofs == 2)
        with pytest.raises(Disconnected):
            await asyncio.wait_for(waiter, 1.0)
        with pytest.raises(Disconnected):
            await pool_get(pool)
        busy1.release()
        busy2.close()
        assert pool.open_connections == 0


@pytest.mark.parametrize(
    ("idle", "connections"),
    [(0.0, 1), (0.15, 2)],
    ids=["fresh: reused", "older than KEEPALIVE: replaced"],
)
async def test_idle_connection_older_than_keepalive_is_not_reused(
    pools: Any, monkeypatch: pytest.MonkeyPatch, idle: float, connections: int
) -> None:
    monkeypatch.setattr(pool_module, "KEEPALIVE", 0.05)
    async with Upstream(keep_serving) as srv:
        pool = pools(srv.url)
        assert await pool_get(pool) == b"ok"
        await asyncio.sleep(idle)
        assert await pool_get(pool) == b"ok"
        assert srv.connections == connections
        await settle(lambda: srv.eofs == connections - 1)  # the stale one was closed
        assert pool.open_connections == 1


async def test_a_quiet_pool_closes_its_idle_connections(
    pools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No request comes after: the sweep timer still closes the idle sockets."""
    monkeypatch.setattr(pool_module, "KEEPALIVE", 0.05)
    async with Upstream(keep_serving) as srv:
        pool = pools(srv.url)
        assert await pool_get(pool) == b"ok"
        assert pool.open_connections == 1
        await settle(lambda: srv.eofs == 1)
        assert pool.open_connections == 0


async def test_close_after_the_whole_body_still_drops_the_connection(pools: Any) -> None:
    """close() is the error path (an error status read, then dropped): never pooled."""
    async with Upstream(keep_serving) as srv:
        pool = pools(srv.url)
        resp = await pool.request("GET", "/", None, head_timeout=1, body_timeout=1)
        assert await resp.read() == b"ok"
        assert resp.at_eof
        resp.close()
        await asyncio.wait_for(srv.eof.wait(), 1.0)
        assert pool.open_connections == 0
        assert await pool_get(pool) == b"ok"
        assert srv.connections == 2


@pytest.mark.parametrize("method", ["HEAD", "PUT"])
async def test_methods_the_gateway_never_sends_are_refused(pools: Any, method: str) -> None:
    """A reply to HEAD has a Content-Length and no body: the client does not frame it."""
    pool = pools("http://127.0.0.1:1")
    with pytest.raises(ValueError):
        await pool.request(method, "/", None, head_timeout=1, body_timeout=1)


async def test_until_close_body_over_a_socket_ends_at_the_servers_close(pools: Any) -> None:
    body = b"streamed until the server closes " * 50

    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await srv.read_request(reader)
        payload = body
        writer.write(b"HTTP/1.0 200 OK\r\n\r\n" + payload[:100])
        await asyncio.sleep(0.02)
        writer.write(payload[100:])
        writer.write_eof()
        await srv.wait_client_close(reader)

    async with Upstream(handler) as srv:
        pool = pools(srv.url)
        resp = await pool.request("GET", "/", None, head_timeout=1, body_timeout=1)
        assert await resp.read() == body
        assert resp.at_eof
        resp.release()
        await asyncio.wait_for(srv.eof.wait(), 1.0)
        assert pool.open_connections == 0


# --- TLS upstreams ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, made in process (cryptography): (cert, key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    d = tmp_path_factory.mktemp("tls")
    cert_path, key_path = d / "cert.pem", d / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def _server_tls(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return ctx


async def test_https_upstream_is_verified_and_kept_alive(
    pools: Any, tls_cert: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_cert[0]))  # trusted as a CA would be
    async with Upstream(keep_serving, tls=_server_tls(*tls_cert)) as srv:
        pool = pools(srv.url)
        assert await pool_get(pool) == b"ok"
        assert await pool_get(pool, "/v1/chat/completions", b"{}", method="POST") == b"ok"
        assert srv.connections == 1
        assert srv.requests[1].startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: ")


async def test_https_upstream_with_an_untrusted_certificate_is_unavailable(
    tls_cert: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    async with Upstream(keep_serving, tls=_server_tls(*tls_cert)) as srv:
        client = UpstreamClient(UpstreamConfig(name="tls", base_url=srv.url + "/v1"))
        await client.start()
        try:
            with pytest.raises(errors.UpstreamUnavailable):
                await client.request("/chat/completions", b"{}", stream=False)
        finally:
            await client.close()
        assert not srv.requests  # nothing was sent over an unverified connection


# --- desync defence over sockets ----------------------------------------------------------------


class Anomalies:
    """An on_protocol_error callback that records what it is told."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None, str | None]] = []

    def __call__(self, kind: str, phase: str, log_id: str | None, sent_id: str | None) -> None:
        self.seen.append((kind, phase, log_id, sent_id))


async def test_a_stray_reply_on_an_idle_connection_closes_every_idle_connection(
    pools: Any,
) -> None:
    async with Upstream(echo_handler()) as srv:
        seen = Anomalies()
        pool = pools(srv.url, on_protocol_error=seen)
        first, second = await asyncio.gather(pool_get(pool, "/a"), pool_get(pool, "/double"))
        assert (first, second) == (b"/a", b"/double")
        assert pool.idle_connections == 2
        await settle(lambda: pool.open_connections == 0)  # the stray came to an idle one
        assert seen.seen == [("extra_bytes", "idle", None, None)]
        assert await pool_get(pool, "/next") == b"/next"  # on a fresh connection
        assert srv.connections == 3


async def test_a_stray_reply_after_the_next_request_is_refused_by_its_request_id(
    pools: Any,
) -> None:
    """The connection was reused before the stray copy arrived: without the echoed id it
    would read as the next request's reply. The next request fails instead."""
    async with Upstream(echo_handler(stray_after=0.1)) as srv:
        seen = Anomalies()
        pool = pools(srv.url, on_protocol_error=seen)
        resp = await pool.request(
            "GET", "/double", None, head_timeout=1, body_timeout=1, request_id=b"req_A"
        )
        assert await resp.read() == b"/double"
        resp.release()
        with pytest.raises(ProtocolError, match="request_id_mismatch"):
            await pool.request(
                "GET",
                "/b",
                None,
                head_timeout=1,
                body_timeout=1,
                request_id=b"req_B",
                log_id="client_B",
            )
        assert seen.seen == [("request_id_mismatch", "head", "client_B", "req_B")]
        assert pool.open_connections == 0
        assert srv.requests[1].count(b"X-Request-Id: req_B\r\n") == 1


@pytest.mark.parametrize("gap", [0.0, 0.05], ids=["same read", "a later read"])
async def test_a_body_past_its_content_length_never_reaches_the_next_request(
    pools: Any,
    gap: float,
) -> None:
    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if index == 0:
            await srv.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            if gap:
                await asyncio.sleep(gap)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray")
        while True:
            await srv.read_request(reader)
            writer.write(http_reply(b"mine"))

    async with Upstream(handler) as srv:
        pool = pools(srv.url, on_protocol_error=Anomalies())
        try:
            first = await pool_get(pool)
        except ProtocolError:
            first = b"refused"
        await asyncio.sleep(gap + 0.05)
        assert first in (b"ok", b"refused")
        assert await pool_get(pool) == b"mine"  # a fresh connection, never the stray bytes
        assert srv.connections == 2


async def test_a_kept_connection_keeps_its_timer_and_an_earlier_deadline_re_arms_it(
    pools: Any,
) -> None:
    """A parked connection's timer stays armed (no timer made and cancelled per request); a
    later request whose deadline comes sooner than that timer's gets one of its own, so it
    times out on time, not at the earlier request's deadline."""

    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        for _ in range(2):
            await srv.read_request(reader)
            writer.write(http_reply())
        await srv.read_request(reader)
        await srv.wait_client_close(reader)  # the third is never answered

    async with Upstream(handler) as srv:
        pool = pools(srv.url)
        for _ in range(2):
            resp = await pool.request("GET", "/", None, head_timeout=30.0, body_timeout=30.0)
            assert await resp.read() == b"ok"
            resp.release()
            if _ == 0:
                (conn,) = pool._idle
                first = conn._timer
                assert first is not None  # left armed while the connection is parked
        assert pool._idle[0] is conn and conn._timer is first  # the same timer, kept
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                pool.request("GET", "/", None, head_timeout=0.2, body_timeout=5.0), 2.0
            )
        assert 0.19 <= loop.time() - start < 0.2 + LATE
        assert first.cancelled()
