"""gateway/upstream/proof.py (a completion id that names its request), and the pool under
``keepalive = "auto"`` with an upstream that names replies in their body only (vLLM without
``--enable-request-id-headers``, SGLang given ``rid``), over loopback sockets."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from gateway.upstream.exceptions import ProtocolError
from gateway.upstream.proof import BODY_PROOF, verdict, with_rid
from gateway.upstream.reuse import PROOF
from tests.upstream_wire import Upstream

E = b"chatcmpl-gw-a-12"
VERDICTS = [
    # (body's first bytes, final, verdict)
    (b'{"id":"chatcmpl-gw-a-12","object":"chat.completion"}', True, True),
    (b'data: {"id":"chatcmpl-gw-a-12","object":"chat.completion.chunk"}\n\n', False, True),
    (b': keep-alive\n\ndata: {"id":"chatcmpl-gw-a-12"', False, True),
    (b'{ "id" : "chatcmpl-gw-a-12_0","choices":[]}', True, True),  # SGLang's n > 1
    (b'{"id":"chatcmpl-gw-a-123","object":"chat.completion"}', True, False),  # another id
    (b'{"id":"chatcmpl-gw-a-1","object":"chat.completion"}', True, False),
    (b'{"id":"chatcmpl-Vv3IxOaiez1Xk89fjuhtfEtHgM3e3ye"}', True, False),  # llama-server
    (b'{"choices":[],"id":"chatcmpl-gw-a-12"}', True, False),  # not first: not trusted
    (b'{"object":"error","message":"x"}', True, False),
    (b"", True, False),
    (b'data: {"id":"chatcmpl-gw', False, None),  # more bytes needed
    (b"data: ", False, None),
    (b"x" * 9000, False, False),  # nothing within the window
]


@pytest.mark.parametrize(("data", "final", "expected"), VERDICTS)
def test_verdict_reads_the_first_objects_id(
    data: bytes, final: bool, expected: bool | None
) -> None:
    assert verdict(data, E, final=final) is expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"model":"m","messages":[]}', b'{"rid":"gw-1","model":"m","messages":[]}'),
        (b'{"model":"m","rid":"mine"}', None),  # the client's own would win
        (b' {"model":"m"}', None),
        (b"[]", None),
    ],
)
def test_with_rid_puts_the_attempts_id_first(body: bytes, expected: bytes | None) -> None:
    out = with_rid(body, b"gw-1")
    assert out == expected
    if out is not None:
        assert json.loads(out)["rid"] == "gw-1"


# --- the pool under auto, the proof in the body ---------------------------------------------


def _engine(kind: str, *, wrong_after: int = -1, error_at: int = -1) -> Any:
    """An engine naming each chat completion as ``kind`` does (never echoing the header); the
    ``wrong_after``-th request onwards is answered with another id, the ``error_at``-th with
    a 400."""
    count = [0]

    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            try:
                request = await srv.read_request(reader)
            except asyncio.IncompleteReadError:
                return
            n = count[0]
            count[0] += 1
            if kind == "vllm":
                name = b"chatcmpl-" + re.search(rb"(?im)^x-request-id: *(\S+)\r$", request)[1]
            else:
                name = json.loads(request.partition(b"\r\n\r\n")[2])["rid"].encode()
            if 0 <= wrong_after <= n:
                name = b"chatcmpl-someone-else"
            if n == error_at:
                body = b'{"object":"error","message":"bad"}'
                status = b"400 Bad Request"
            else:
                body = b'{"id":"' + name + b'","object":"chat.completion","choices":[]}'
                status = b"200 OK"
            writer.write(
                b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )

    return handler


async def _call(pool: Any, n: int, *, stream: bool = False) -> bytes:
    resp = await pool.request(
        "POST",
        "/v1/chat/completions",
        b'{"model":"m"}',
        head_timeout=2,
        body_timeout=2,
        stream=stream,
        request_id=b"gw-t-%d" % n,
        provable=True,
    )
    try:
        if stream:
            data = b""
            while chunk := await resp.readany():
                data += chunk
        else:
            data = await resp.read()
    except BaseException:
        resp.close()
        raise
    resp.release()
    return data


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
async def test_a_body_that_names_its_request_proves_the_upstream(
    pools: Any,
    kind: str,
    stream: bool,
) -> None:
    async with Upstream(_engine(kind)) as srv:
        pool = pools(srv.url, keepalive="auto", body_proof=BODY_PROOF[kind])
        for n in range(PROOF):
            await _call(pool, n, stream=stream)
        assert srv.connections == PROOF  # a fresh connection each until proved
        assert pool.reuse.keepalive
        for n in range(PROOF, PROOF + 5):
            await _call(pool, n, stream=stream)
        assert srv.connections == PROOF + 1  # then one reused
        if kind == "sglang":
            assert srv.requests[-1].endswith(b'{"rid":"gw-t-12","model":"m"}')


async def test_without_body_proof_every_request_gets_a_fresh_connection(pools: Any) -> None:
    async with Upstream(_engine("vllm")) as srv:
        pool = pools(srv.url, keepalive="auto")  # kind llamacpp, ollama, openai
        for n in range(PROOF + 3):
            await _call(pool, n)
        assert srv.connections == PROOF + 3
        assert not pool.reuse.keepalive


async def test_a_reply_naming_another_request_on_a_reused_connection_is_refused(
    pools: Any,
) -> None:
    async with Upstream(_engine("vllm", wrong_after=PROOF + 1)) as srv:
        pool = pools(srv.url, keepalive="auto", body_proof=BODY_PROOF["vllm"])
        for n in range(PROOF + 1):
            await _call(pool, n)
        assert pool.reuse.keepalive
        with pytest.raises(ProtocolError, match="request_id_mismatch"):
            await _call(pool, 99)  # the body is never handed on
        assert not pool.reuse.keepalive  # and the upstream must prove itself again


async def test_an_error_reply_on_a_reused_connection_is_refused_without_an_anomaly(
    pools: Any,
) -> None:
    """An error names no request: on a reused connection it could be a stray; it is refused
    (the client sends the request again on a fresh connection), keep-alive stays on."""
    async with Upstream(_engine("vllm", error_at=PROOF + 1)) as srv:
        pool = pools(srv.url, keepalive="auto", body_proof=BODY_PROOF["vllm"])
        for n in range(PROOF + 1):
            await _call(pool, n)
        with pytest.raises(ProtocolError, match="request_id_missing") as info:
            await pool.request(
                "POST",
                "/v1/chat/completions",
                b'{"model":"m"}',
                head_timeout=2,
                body_timeout=2,
                request_id=b"gw-t-e",
                provable=True,
            )
        assert info.value.cause == "misrouted"
        assert pool.reuse.keepalive
        resp = await pool.request(
            "POST",
            "/v1/chat/completions",
            b'{"model":"m"}',
            head_timeout=2,
            body_timeout=2,
            request_id=b"gw-t-f",
            provable=True,
            fresh=True,
        )
        assert b"Connection: close" in srv.requests[-1]
        assert resp.status == 200
        resp.close()
