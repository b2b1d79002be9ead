"""gateway/upstream/reuse.py, and the pool under ``keepalive = "auto"`` over loopback sockets.

The protocol fact: on a keep-alive HTTP/1.1 connection the next reply to arrive is taken as
the answer to the request sent last. A reply that names its request (the echoed
``X-Request-Id``) is the only proof it is that request's; without the proof, a connection
carries one request (``Connection: close``) and whatever else arrives on it answers nobody.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from typing import Any

import pytest

from gateway.upstream import UpstreamClient
from gateway.upstream import reuse as reuse_module
from gateway.upstream.exceptions import ProtocolError
from gateway.upstream.reuse import MAX_PROOF, PROOF, TRANSITIONS, Event, Reuse, ReuseState
from tests.upstream_wire import Upstream, echo_handler, http_reply, settle, upstream_config

E, N, A = Event.ECHO, Event.NO_ECHO, Event.ANOMALY


# --- the state machine -----------------------------------------------------------------------


def test_every_state_has_a_transition_for_every_event() -> None:
    assert set(TRANSITIONS) == {(s, e) for s in ReuseState for e in Event}


def test_auto_starts_without_keepalive_and_turns_it_on_after_proof_echoes() -> None:
    reuse = Reuse("auto")
    assert (reuse.keepalive, reuse.must_echo, reuse.state) == (False, True, ReuseState.PROBING)
    flips = [reuse.observe(E) for _ in range(PROOF)]
    assert flips == [False] * (PROOF - 1) + [True]
    assert reuse.keepalive and reuse.state is ReuseState.TRUSTED
    assert reuse.observe(E) is False  # staying trusted is no change


@pytest.mark.parametrize(
    ("events", "state", "streak", "proof"),
    [
        ([E] * (PROOF - 1) + [N], ReuseState.PROBING, 0, PROOF),  # no echo: start over
        ([E] * (PROOF - 1) + [N] + [E] * (PROOF - 1), ReuseState.PROBING, PROOF - 1, PROOF),
        (
            [E] * 3 + [A],
            ReuseState.PROBING,
            0,
            2 * PROOF,
        ),  # an anomaly while probing: twice the proof
        (
            [E] * PROOF + [N],
            ReuseState.PROBING,
            0,
            PROOF,
        ),  # it stopped echoing (restarted without it?)
        ([E] * PROOF + [A], ReuseState.PROBING, 0, 2 * PROOF),
        ([E] * PROOF + [A] + [E] * (2 * PROOF), ReuseState.TRUSTED, 2 * PROOF, 2 * PROOF),
        ([A] * 20, ReuseState.PROBING, 0, MAX_PROOF),  # the proof asked for is bounded
    ],
    ids=[
        "no-echo-resets",
        "streak-after-reset",
        "anomaly-probing",
        "trusted-no-echo",
        "trusted-anomaly",
        "earned-again",
        "proof-capped",
    ],
)
def test_transitions(events: list[Event], state: ReuseState, streak: int, proof: int) -> None:
    reuse = Reuse("auto")
    for event in events:
        reuse.observe(event)
    assert (reuse.state, reuse.streak, reuse.proof) == (state, streak, proof), repr(reuse)
    assert reuse.keepalive is (state is ReuseState.TRUSTED)


@pytest.mark.parametrize(("mode", "keepalive"), [("always", True), ("never", False)])
def test_always_and_never_are_fixed(mode: str, keepalive: bool) -> None:
    reuse = Reuse(mode)
    for event in [E] * 50 + [A, N] * 5:
        assert reuse.observe(event) is False
        assert reuse.keepalive is keepalive
    assert not reuse.must_echo


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError):
        Reuse("sometimes")


# --- the pool under auto ---------------------------------------------------------------------


def _silent() -> Any:
    """Replies with the request's path, echoing nothing (llama.cpp, SGLang, Ollama)."""

    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            try:
                request = await srv.read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(http_reply(request.split(b" ")[1]))

    return handler


async def pool_get(pool: Any, path: str, rid: str) -> bytes:
    resp = await pool.request(
        "GET", path, None, head_timeout=1, body_timeout=1, request_id=rid.encode()
    )
    body: bytes = await resp.read()
    resp.release()
    return body


def _closes(srv: Upstream) -> list[bool]:
    return [b"\r\nConnection: close\r\n" in r for r in srv.requests]


async def test_an_upstream_that_never_echoes_gets_a_connection_per_request(pools: Any) -> None:
    async with Upstream(_silent()) as srv:
        switched: list[bool] = []
        pool = pools(srv.url, keepalive="auto", on_keepalive=switched.append)
        for i in range(3 * PROOF):
            assert await pool_get(pool, f"/{i}", f"req_{i}") == f"/{i}".encode()
        assert srv.connections == 3 * PROOF
        assert all(_closes(srv))
        assert switched == [] and not pool.reuse.keepalive
        await settle(lambda: pool.open_connections == 0)


async def test_an_echoing_upstream_earns_keepalive_after_proof_replies(pools: Any) -> None:
    async with Upstream(echo_handler()) as srv:
        switched: list[bool] = []
        pool = pools(srv.url, keepalive="auto", on_keepalive=switched.append)
        for i in range(PROOF + 5):
            assert await pool_get(pool, f"/{i}", f"req_{i}") == f"/{i}".encode()
        # PROOF fresh connections (Connection: close), then one kept for the rest
        assert srv.connections == PROOF + 1
        assert _closes(srv) == [True] * PROOF + [False] * 5
        assert switched == [True]
        assert pool.idle_connections == 1


async def _trusted(pool: Any) -> None:
    for i in range(PROOF):
        await pool_get(pool, "/warm", f"warm_{i}")
    assert pool.reuse.keepalive


def _echoing_while(echo: list[bool]) -> Any:
    """Replies with the request's path, echoing its X-Request-Id while ``echo[0]``."""

    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            try:
                request = await srv.read_request(reader)
            except asyncio.IncompleteReadError:
                return
            rid = re.search(rb"(?im)^x-request-id: *(\S+)\r$", request)
            extra = (b"X-Request-Id: " + rid[1],) if rid and echo[0] else ()
            writer.write(http_reply(request.split(b" ")[1], *extra))

    return handler


async def test_a_reply_without_the_echo_on_a_trusted_connection_is_refused(pools: Any) -> None:
    """The upstream stops echoing (restarted without --enable-request-id-headers): the reply
    is refused, its connection closed, and keep-alive is off until it proves itself again."""
    echo = [True]
    async with Upstream(_echoing_while(echo)) as srv:
        switched: list[bool] = []
        seen: list[tuple[str, str, str | None, str | None]] = []
        pool = pools(
            srv.url,
            keepalive="auto",
            on_keepalive=switched.append,
            on_protocol_error=lambda *a: seen.append(a),
        )
        await _trusted(pool)
        await pool_get(pool, "/kept", "req_kept")
        echo[0] = False
        with pytest.raises(ProtocolError, match="request_id_missing"):
            await pool_get(pool, "/stray", "req_stray")
        assert seen == [("request_id_missing", "head", None, "req_stray")]
        assert switched == [True, False] and not pool.reuse.keepalive
        assert pool.open_connections == 0
        before = srv.connections
        assert await pool_get(pool, "/next", "req_next") == b"/next"  # a fresh one, to close
        assert srv.connections == before + 1 and _closes(srv)[-1]


async def test_a_reply_without_the_echo_on_a_new_trusted_connection_is_taken(pools: Any) -> None:
    """A new connection's first reply cannot be another request's: without the echo (a
    router's own 404, an upstream restarted without the echo) it is this request's answer,
    and keep-alive goes off until the upstream proves itself again."""
    echo = [True]
    async with Upstream(_echoing_while(echo)) as srv:
        switched: list[bool] = []
        seen: list[Any] = []
        pool = pools(
            srv.url,
            keepalive="auto",
            on_keepalive=switched.append,
            on_protocol_error=lambda *a: seen.append(a),
        )
        await _trusted(pool)
        pool._close_idle()  # the kept connection gone: the next request opens a new one
        await settle(lambda: pool.open_connections == 0)
        echo[0] = False
        before = srv.connections
        assert await pool_get(pool, "/fresh", "req_fresh") == b"/fresh"
        assert srv.connections == before + 1
        assert seen == []
        assert switched == [True, False] and not pool.reuse.keepalive


async def test_a_stray_reply_on_a_trusted_idle_connection_turns_keepalive_off(pools: Any) -> None:
    async with Upstream(echo_handler(stray_after=0.02)) as srv:
        switched: list[bool] = []
        pool = pools(srv.url, keepalive="auto", on_keepalive=switched.append)
        await _trusted(pool)
        assert await pool_get(pool, "/double", "req_double") == b"/double"
        await settle(lambda: switched == [True, False])
        assert pool.open_connections == 0 and pool.reuse.proof == 2 * PROOF


async def test_a_stray_reply_not_yet_read_is_found_before_reuse(pools: Any) -> None:
    """The stray bytes sit in the kernel's buffer, not yet handed to the connection: the
    check before reuse finds them, and the request goes out on a fresh connection."""
    writers: list[asyncio.StreamWriter] = []

    async def handler(
        srv: Upstream, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        writers.append(writer)
        await echo_handler()(srv, index, reader, writer)

    async with Upstream(handler) as srv:
        seen: list[tuple[str, str, str | None, str | None]] = []
        pool = pools(srv.url, on_protocol_error=lambda *a: seen.append(a))  # always
        assert await pool_get(pool, "/a", "req_a") == b"/a"
        assert pool.idle_connections == 1
        writers[0].write(http_reply(b"/stray", b"X-Request-Id: req_a"))  # sent now, not yet read
        await asyncio.get_running_loop().run_in_executor(None, lambda: None)  # no read between
        assert await pool_get(pool, "/b", "req_b") == b"/b"
        assert seen == [("extra_bytes", "idle", None, None)]
        assert srv.connections == 2


async def test_a_misrouted_reply_is_sent_again_on_a_fresh_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A late copy of one reply is read by the next request on the reused connection: the
    id tells, the client never sees it, and the request gets its own reply from a fresh
    connection."""
    monkeypatch.setattr(reuse_module, "PROOF", 2)
    async with Upstream(echo_handler(stray_after=0.1)) as srv:
        client = UpstreamClient(replace(upstream_config(srv), keepalive="auto"))
        await client.start()
        try:

            async def get(path: str, rid: str) -> bytes:
                async with await client.request(
                    path, b"{}", stream=False, at_root=True, request_id=rid
                ) as resp:
                    return await resp.read()

            for i in range(2):
                await get("/warm", f"warm_{i}")
            assert client.keepalive
            assert await get("/double", "req_A") == b"/double"
            assert await get("/b", "req_B") == b"/b"  # read the stray copy first: retried
            assert not client.keepalive
            # /double, /b, /b again: each attempt with an id of its own, none the client's
            sent = [re.search(rb"\r\nX-Request-Id: (gw-\S+)\r\n", r) for r in srv.requests[-3:]]
            assert all(sent) and len({m[1] for m in sent if m}) == 3, srv.requests[-3:]
        finally:
            await client.close()
