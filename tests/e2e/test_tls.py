"""https on the API listener (``server.tls_cert_file``/``tls_key_file``), with the real gateway
process and a throwaway CA made by ``openssl`` (tests/certs.py).

The official Python SDK trusting that CA gets buffered and streamed answers; the fingerprint
logged at start is the leaf's (openssl's digest, and Claude Code's lower-case form); plain
HTTP to the https port, a client that does not trust the certificate and a connection that
never sends a ClientHello are each closed and counted, and the gateway serves on; SIGHUP
serves a renewed certificate to new connections while an open one keeps going;
``--health-check`` asks over https; with ``--workers 2`` each worker serves the certificate.
The metrics listener (``metrics_port``) stays plain: the tests wait on and read it.
"""

from __future__ import annotations

import hashlib
import http.client
import shutil
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import pytest

from tests import certs, sdk
from tests.conftest import stub_config
from tests.logs import log_lines, matching, wait_for_line
from tests.procs import Proc, free_port, get, metric, wait_http
from tests.waits import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

HEAD_TIMEOUT = 2  # server.request_head_timeout: the handshake's limit too
ERRORS = "llm_gateway_client_http_errors_total"


@dataclass
class Gateway:
    proc: Proc
    port: int
    ops: str  # the plain metrics listener
    ca: Path
    leaf: certs.Leaf
    config: Path

    @property
    def api(self) -> str:
        return f"https://127.0.0.1:{self.port}/llm"

    def errors(self, kind: str) -> float:
        return metric(self.ops, ERRORS, kind=kind)


def _start(stub_url: str, folder: Path, *extra: str) -> Gateway:
    ca = certs.make_ca(folder)
    leaf = certs.make_leaf(folder)
    port, ops_port = free_port(), free_port()
    cfg = folder / "gateway.toml"
    cfg.write_text(
        stub_config(
            stub_url,
            models=("ok",),
            extra_server=(
                f'tls_cert_file = "{leaf.cert}"\ntls_key_file = "{leaf.key}"\n'
                f"request_head_timeout = {HEAD_TIMEOUT}\nmetrics_port = {ops_port}\n"
            ),
        )
    )
    proc = Proc(
        [sys.executable, "-m", "gateway", "--config", str(cfg), "--port", str(port), *extra],
        env={"XDG_STATE_HOME": str(folder / "state")},
    )
    ops = f"http://127.0.0.1:{ops_port}"
    try:
        wait_http(ops + "/health", proc=proc.popen)
    except Exception:
        proc.stop()
        raise RuntimeError("gateway did not start:\n" + proc.output()) from None
    return Gateway(proc, port, ops, ca, leaf, cfg)


@pytest.fixture(scope="module")
def gateway(stub_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = _start(stub_url, tmp_path_factory.mktemp("tls"))
    yield gw
    gw.proc.stop()


def _client(gw: Gateway) -> anthropic.Anthropic:
    return sdk.client(
        gw.api,
        api_key="k",
        max_retries=0,
        http_client=anthropic.DefaultHttpxClient(verify=ssl.create_default_context(cafile=gw.ca)),
    )


def _presented(gw: Gateway) -> str:
    """SHA-256 of the leaf the gateway presents now (a new connection, the CA trusted)."""
    ctx = ssl.create_default_context(cafile=str(gw.ca))
    with (
        socket.create_connection(("127.0.0.1", gw.port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        assert tls.selected_alpn_protocol() in (None, "http/1.1")
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


def test_the_sdk_over_https_buffered_and_streamed(gateway: Gateway) -> None:
    client = _client(gateway)
    msg = client.messages.create(
        model="m-ok", max_tokens=32, messages=[{"role": "user", "content": "hi"}]
    )
    assert msg.content[0].type == "text" and msg.content[0].text
    with client.messages.stream(
        model="m-ok", max_tokens=32, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.stop_reason == "end_turn"


def test_every_https_answer_carries_hsts(gateway: Gateway) -> None:
    """``Strict-Transport-Security`` (``server.hsts_max_age``, a year by default) on a
    buffered reply, a stream, an error and the sign-in-free routes alike; the plain metrics
    listener has none."""
    hsts = "max-age=31536000"
    client = _client(gateway)
    ask = {"model": "m-ok", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    raw = client.messages.with_raw_response.create(**ask)  # type: ignore[arg-type]
    assert raw.headers["strict-transport-security"] == hsts
    with client.messages.with_streaming_response.create(**ask, stream=True) as resp:  # type: ignore[arg-type]
        assert resp.headers["strict-transport-security"] == hsts
        resp.read()
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(**{**ask, "model": "nope"})  # type: ignore[arg-type]
    assert caught.value.response.headers["strict-transport-security"] == hsts
    ctx = ssl.create_default_context(cafile=str(gateway.ca))
    conn = http.client.HTTPSConnection("127.0.0.1", gateway.port, context=ctx, timeout=10)
    try:
        conn.request("GET", "/health", headers={"Host": "localhost"})
        health = conn.getresponse()
        health.read()
    except ssl.SSLCertVerificationError:
        pytest.skip("the leaf names localhost only")
    finally:
        conn.close()
    assert health.getheader("strict-transport-security") == hsts
    status, headers, _ = get(gateway.ops + "/health")
    assert status == 200 and "strict-transport-security" not in headers


def test_the_logged_fingerprint_is_the_presented_leaf(gateway: Gateway) -> None:
    openssl_form = certs.fingerprint(gateway.leaf.cert)
    (line,) = matching(log_lines(gateway.proc.output()), "tls_certificate")
    assert line["fingerprint_sha256_colons"] == openssl_form
    assert line["fingerprint_sha256"] == openssl_form.replace(":", "").lower()
    assert _presented(gateway) == line["fingerprint_sha256"]
    (listening,) = matching(log_lines(gateway.proc.output()), "listening")
    assert listening["scheme"] == "https"


def test_plain_http_to_the_https_port_is_closed_and_counted(gateway: Gateway) -> None:
    before = gateway.errors("http_on_tls")
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
        conn.request("GET", "/health")
        conn.getresponse()
    conn.close()
    wait_until(lambda: gateway.errors("http_on_tls") == before + 1, "http_on_tls counted")
    assert _presented(gateway)  # still serving


def test_a_client_not_trusting_the_certificate_is_refused_and_counted(gateway: Gateway) -> None:
    before = gateway.errors("tls_handshake")
    ctx = ssl.create_default_context()  # the system's CAs only
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            ctx.wrap_socket(raw, server_hostname="localhost")
    wait_until(lambda: gateway.errors("tls_handshake") == before + 1, "tls_handshake counted")


def test_a_client_that_never_sends_a_client_hello_is_dropped(gateway: Gateway) -> None:
    before = gateway.errors("tls_handshake_timeout")
    silent = [socket.create_connection(("127.0.0.1", gateway.port), timeout=20) for _ in range(3)]
    try:
        for sock in silent:  # closed by the gateway, well before this socket's own timeout
            try:
                assert sock.recv(1) == b""
            except ConnectionResetError:
                pass
    finally:
        for sock in silent:
            sock.close()
    wait_until(
        lambda: gateway.errors("tls_handshake_timeout") == before + 3, "three timeouts counted"
    )
    (line, *_) = matching(log_lines(gateway.proc.output()), "tls_handshake_failed")
    assert set(line) >= {"kind", "reason", "listener"}
    assert _presented(gateway)


def test_health_check_asks_over_https(gateway: Gateway) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "gateway", "--config", str(gateway.config), "--port",
         str(gateway.port), "--health-check"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr


def test_sighup_serves_a_renewed_certificate(stub_url: str, tmp_path: Path) -> None:
    gw = _start(stub_url, tmp_path)
    try:
        first = _presented(gw)
        # a connection opened before the renewal keeps going on the old certificate
        ctx = ssl.create_default_context(cafile=str(gw.ca))
        kept = http.client.HTTPSConnection("127.0.0.1", gw.port, timeout=10, context=ctx)
        kept.request("GET", "/health")
        assert kept.getresponse().read()
        renewed = certs.make_leaf(tmp_path, "renewed")
        shutil.copy(renewed.cert, gw.leaf.cert)
        shutil.copy(renewed.key, gw.leaf.key)
        gw.proc.signal(signal.SIGHUP)
        line = wait_for_line(
            gw.proc.output, lambda ln: ln.get("event") == "tls_certificate_reloaded"
        )
        assert line["changed"] is True
        assert line["fingerprint_sha256_colons"] == certs.fingerprint(renewed.cert)
        assert _presented(gw) == line["fingerprint_sha256"] != first
        kept.request("GET", "/health")
        assert kept.getresponse().status == 200
        kept.close()
        msg = _client(gw).messages.create(
            model="m-ok", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
        assert msg.content
        # a key that is not the certificate's: the reload is refused, the pair kept
        certs.make_leaf(tmp_path, "third")
        shutil.copy(tmp_path / "third.key", gw.leaf.key)
        gw.proc.signal(signal.SIGHUP)
        bad = wait_for_line(gw.proc.output, lambda ln: ln.get("event") == "config_reload_failed")
        assert "server.tls_key_file" in bad["detail"]
        assert "PRIVATE" not in bad["detail"]
        assert _presented(gw) == line["fingerprint_sha256"]
    finally:
        gw.proc.stop()


def test_two_workers_serve_https(stub_url: str, tmp_path: Path) -> None:
    gw = _start(stub_url, tmp_path, "--workers", "2")
    try:
        wait_until(
            lambda: (
                len({ln["pid"] for ln in matching(log_lines(gw.proc.output()), "listening")}) >= 2
            ),
            "both workers listening",
            timeout=30,
        )
        fingerprints = {
            ln["fingerprint_sha256"]
            for ln in matching(log_lines(gw.proc.output()), "tls_certificate")
        }
        assert len(fingerprints) == 1
        for _ in range(12):  # a new connection each time: the kernel spreads them
            client = _client(gw)
            msg = client.messages.create(
                model="m-ok", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
            assert msg.content
            client.close()
            assert _presented(gw) in fingerprints
    finally:
        gw.proc.stop()


def test_no_failure_above_reached_the_error_log(gateway: Gateway) -> None:
    """The refused handshakes of this module are info lines, not loop exceptions."""
    lines = log_lines(gateway.proc.output(), strict=True)
    assert [ln for ln in lines if ln.get("level") in ("error", "critical")] == []
    kinds = {ln["kind"] for ln in matching(lines, "tls_handshake_failed")}
    assert kinds == {"http_on_tls", "tls_handshake", "tls_handshake_timeout"}
