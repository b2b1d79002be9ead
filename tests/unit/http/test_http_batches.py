"""gateway/http/batches.py, the Message Batches routes: creation is validated as /v1/messages
is, the batch object follows the API's rules (counts move at the end, results_url once ended)."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from gateway import errors
from gateway.batches.store import BatchRow
from gateway.http import batch_create
from gateway.http import batches as api
from gateway.http.keys import CONFIG
from gateway.ops import config
from gateway.ops.budget import Budget
from gateway.text import json_items, jsonutil

CFG = config.parse(
    {
        "upstreams": {"u": {"base_url": "http://127.0.0.1:9/v1"}},
        "models": [
            {"name": "m", "upstream": "u", "upstream_model": "x"},
            {"name": "claude-*", "upstream": "u", "upstream_model": "x"},
        ],
        "batches": {"max_requests": 3, "database": "sqlite:////tmp/unused.sqlite3"},
    },
    "test.toml",
    {"HOME": "/nonexistent"},
)


def _params(**kw: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **kw}


def _item(custom_id: Any = "a", **params: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "params": _params(**params)}


# (name, body, path named by the 400)
BAD = [
    ("not an object", [], ""),
    ("no requests", {}, "requests"),
    ("requests not a list", {"requests": {}}, "requests"),
    ("empty", {"requests": []}, "requests"),
    ("too many", {"requests": [_item(str(i)) for i in range(4)]}, "requests"),
    ("extra top-level key", {"requests": [_item()], "x": 1}, "x"),
    ("item not an object", {"requests": ["a"]}, "requests.0"),
    ("extra item key", {"requests": [{**_item(), "y": 1}]}, "requests.0.y"),
    ("custom_id missing", {"requests": [{"params": _params()}]}, "requests.0.custom_id"),
    ("custom_id empty", {"requests": [_item("")]}, "requests.0.custom_id"),
    ("custom_id 65 chars", {"requests": [_item("a" * 65)]}, "requests.0.custom_id"),
    ("custom_id bad char", {"requests": [_item("a b")]}, "requests.0.custom_id"),
    ("custom_id not a string", {"requests": [_item(7)]}, "requests.0.custom_id"),
    ("duplicate custom_id", {"requests": [_item("a"), _item("a")]}, "requests.1.custom_id"),
    ("params missing", {"requests": [{"custom_id": "a"}]}, "requests.0.params"),
    ("params stream", {"requests": [_item(stream=True)]}, "requests.0.params.stream"),
    ("params invalid", {"requests": [_item(max_tokens=0)]}, "requests.0.params.max_tokens"),
    (
        "params nested invalid",
        {"requests": [_item(), _item("b", messages=[{"role": "x", "content": "c"}])]},
        "requests.1.params.messages.0.role",
    ),
    ("unknown model", {"requests": [_item(model="nope")]}, "requests.0.params.model"),
    (
        "web search",
        {
            "requests": [
                _item(
                    tools=[
                        {"type": "custom", "name": "t", "input_schema": {}},
                        {"type": "web_search_20250305", "name": "web_search"},
                    ]
                )
            ]
        },
        "requests.0.params.tools.1.type",
    ),  # interactive only (gateway/tools/)
]


@pytest.mark.parametrize(("body", "path"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_bad_create_is_a_400_naming_the_field(body: Any, path: str) -> None:
    with pytest.raises(errors.InvalidRequest) as caught:
        batch_create.parse_create(CFG, copy.deepcopy(body))  # it drops each request it reads
    assert caught.value.path == path
    assert caught.value.status == 400 and caught.value.message.startswith(path)


def test_a_good_create_keeps_each_request_under_its_route() -> None:
    body = {
        "requests": [
            _item("a-1"),
            _item("B_2", model="claude-opus-5", stream=False),
            _item("c" * 64),
        ]
    }
    out = batch_create.parse_create(CFG, body)
    assert [(c, m) for c, m, _ in out] == [("a-1", "m"), ("B_2", "claude-*"), ("c" * 64, "m")]
    assert jsonutil.loads(out[1][2])["model"] == "claude-opus-5"  # the client's name is kept


def _row(**kw: Any) -> BatchRow:
    base = {
        "id": "msgbatch_x",
        "owner": "",
        "created_at": 1_700_000_000.0,
        "expires_at": 1_700_086_400.0,
        "ended_at": None,
        "cancel_initiated_at": None,
        "total": 5,
        "succeeded": 2,
        "errored": 1,
        "canceled": 0,
        "expired": 0,
    }
    return BatchRow(**{**base, **kw})


def test_counts_move_out_of_processing_only_when_the_batch_ends() -> None:
    running = api.render(_row(), "https://gw.example/llm/v1/messages/batches")
    assert running["processing_status"] == "in_progress"
    assert running["request_counts"] == {
        "processing": 5,
        "succeeded": 0,
        "errored": 0,
        "canceled": 0,
        "expired": 0,
    }
    assert running["results_url"] is None and running["ended_at"] is None
    ended = api.render(
        _row(ended_at=1_700_000_100.5, canceled=1, expired=1),
        "https://gw.example/llm/v1/messages/batches",
    )
    assert ended["processing_status"] == "ended"
    assert ended["request_counts"] == {
        "processing": 0,
        "succeeded": 2,
        "errored": 1,
        "canceled": 1,
        "expired": 1,
    }
    assert ended["results_url"] == "https://gw.example/llm/v1/messages/batches/msgbatch_x/results"
    assert ended["created_at"] == "2023-11-14T22:13:20Z"
    assert ended["ended_at"] == "2023-11-14T22:15:00.500000Z"
    assert set(ended) == {
        "id",
        "type",
        "processing_status",
        "request_counts",
        "ended_at",
        "created_at",
        "expires_at",
        "archived_at",
        "cancel_initiated_at",
        "results_url",
    }
    canceling = api.render(_row(cancel_initiated_at=1_700_000_050.0), "b")
    assert canceling["processing_status"] == "canceling"


async def test_a_large_create_gives_the_event_loop_a_turn_between_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 20,000-request create was parsed in one go (0.74 s with the loop held; 100,000:
    /health waited 19 s). Parsed in slices of PARSE_SLICE with a turn between, a ticker
    task runs while the requests are validated; each request's objects are dropped once it
    is encoded."""
    import asyncio

    cfg = config.parse(
        {
            "upstreams": {"u": {"base_url": "http://127.0.0.1:9/v1"}},
            "models": [{"name": "m", "upstream": "u", "upstream_model": "x"}],
            "batches": {"max_requests": 10_000, "database": "sqlite:////tmp/unused.sqlite3"},
        },
        "test.toml",
        {"HOME": "/nonexistent"},
    )
    ticks = 0
    seen: list[int] = []
    real = batch_create.validate_messages

    def spy(params: Any) -> Any:
        seen.append(ticks)
        return real(params)

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    monkeypatch.setattr(batch_create, "validate_messages", spy)
    n = 4 * batch_create.PARSE_SLICE
    body = {"requests": [_item(str(i)) for i in range(n)]}
    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    out = await batch_create.parse_create_async(cfg, body)
    task.cancel()
    assert len(out) == n and out[-1][0] == str(n - 1)
    assert len(set(seen)) >= 4  # the ticker ran between slices
    assert body["requests"] == [None] * n


# --- a create read one request at a time (gateway/text/json_items.py) ----------------------


async def _parse_raw(
    cfg: Any, raw: bytes, budget: Budget | None = None
) -> tuple[list[tuple[str, str, bytes]], int]:
    """The create parsed from its bytes as the route does (the whole decode as the fallback,
    on the loop: no child process); -> (requests, bytes the lease held after parsing)."""
    request = make_mocked_request("POST", "/", app=_app(cfg))
    with (budget or Budget(1 << 30)).lease() as lease:
        assert lease.take(len(raw))  # the body, as read_bytes counts it
        out = await batch_create.parse_body(request, cfg, bytearray(raw), lease)
        return out, lease.held - len(raw)


def _app(cfg: Any) -> web.Application:
    app = web.Application()
    app[CONFIG] = dataclasses.replace(
        cfg, server=dataclasses.replace(cfg.server, decode_offload_bytes=0)
    )
    return app


@pytest.mark.parametrize(("body", "path"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
async def test_a_bad_create_read_from_its_bytes_is_the_same_400(body: Any, path: str) -> None:
    with pytest.raises(errors.InvalidRequest) as caught:
        await _parse_raw(CFG, json.dumps(body).encode())
    assert caught.value.path == path
    assert caught.value.status == 400 and caught.value.message.startswith(path)


# (name, body bytes): shapes read whole (json_items.NotPlain), answered as before
ODD = [
    ("spaces and newlines", b' \n{ "requests" :\n[ %s ,\r\n\t%s ] }\n'),
    ("key escaped", b'{"requ\\u0065sts": [%s, %s]}'),
    ("item with NaN", b'{"requests": [%s, %s, {"custom_id": "z", "params": NaN}]}'),
    ("not JSON", b'{"requests": [%s, %s, {"custom_id": "z",]}'),
    ("trailing bytes", b'{"requests": [%s, %s]} x'),
    ("repeated key", b'{"requests": [], "requests": [%s, %s]}'),
    ("non-ASCII and an emoji", b'{"requests": [%s, %s]}'),
]


@pytest.mark.parametrize(("template",), [c[1:] for c in ODD], ids=[c[0] for c in ODD])
async def test_any_create_is_answered_as_its_whole_decode_is(template: bytes) -> None:
    items = (
        json.dumps(_item("a")).encode(),
        json.dumps(
            _item("b", messages=[{"role": "user", "content": "é ✓ 😀"}]), ensure_ascii=False
        ).encode(),
    )
    raw = template % items
    try:
        expected: Any = batch_create.parse_create(CFG, jsonutil.loads(raw))
    except jsonutil.JSONInputError as exc:
        expected = ("400", exc.path)
    except ValueError:
        expected = ("400", "")
    try:
        got: Any = (await _parse_raw(CFG, raw))[0]
    except errors.InvalidRequest as exc:
        got = ("400", exc.path)
    assert got == expected


async def test_a_create_holds_its_requests_in_the_memory_budget() -> None:
    """Each request counts in the create's lease as it is encoded (its JSON and a fixed
    overhead); past the budget, with another request holding some, a 529."""
    body = {"requests": [_item(str(i)) for i in range(3)]}
    raw = json.dumps(body).encode()
    out, held = await _parse_raw(CFG, raw)
    assert len(out) == 3 and held == sum(len(p) for _, _, p in out) + 3 * batch_create._ENTRY_BYTES
    budget = Budget(len(raw) + held - 1)
    with budget.lease() as other:
        assert other.take(1)
        with pytest.raises(errors.Overloaded) as caught:
            await _parse_raw(CFG, raw, budget)
        assert caught.value.status == 529 and budget.held == 1
    assert budget.held == 0


@pytest.mark.parametrize("size", [10, 3000])
def test_items_are_found_across_window_edges(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    """Items, whitespace and separators cut anywhere by a small window, multi-byte
    characters cut by a chunk included: each item's text is exactly its JSON."""
    monkeypatch.setattr(json_items, "WINDOW", 7)
    items = [
        {"custom_id": f"r{i}", "params": {"t": 'é😀 ]}\\"' * (i % 5), "n": [i, {}]}}
        for i in range(size // 10)
    ]
    raw = (
        ' { "requests" : [ '
        + " ,\n ".join(json.dumps(x, ensure_ascii=False) for x in items)
        + " ] } "
    ).encode()
    reader = json_items.ArrayItems(raw, "requests", max_values=1 << 20, max_item_values=1 << 19)
    got = []
    while not reader.done:
        got.append(json.loads(reader.next()))
    assert got == items


def test_an_item_with_too_many_values_is_not_scanned(monkeypatch: pytest.MonkeyPatch) -> None:
    """An item past the window holding more separators than max_item_values, or a body
    past max_values, is left to the whole decode (which bounds values before decoding)."""
    monkeypatch.setattr(json_items, "WINDOW", 64)
    big = b'{"requests": [{"x": [' + b"0," * 200 + b"0]}]}"
    with pytest.raises(json_items.NotPlain):
        json_items.ArrayItems(big, "requests", max_values=1 << 20, max_item_values=100).next()
    many = b'{"requests": [' + b",".join([b'{"x": 1}'] * 100) + b"]}"
    reader = json_items.ArrayItems(many, "requests", max_values=150, max_item_values=100)
    with pytest.raises(json_items.NotPlain):
        while not reader.done:
            reader.next()


# (case, requests, characters of content in each, max_requests, fewest turns of the loop)
TURNS = [
    ("many small requests: a turn every PARSE_SLICE", 200, 2, 10_000, 200 // 32 - 1),
    ("large requests: a turn every PARSE_SLICE_BYTES", 12, 100_000, 10_000, 12 // 3 - 1),
    ("past max_requests, the rest only counted", 200, 2, 10, 190 // 32 - 1),
]


@pytest.mark.parametrize(
    ("requests", "size", "limit", "turns"), [c[1:] for c in TURNS], ids=[c[0] for c in TURNS]
)
async def test_a_create_read_from_its_bytes_gives_the_loop_turns(
    requests: int, size: int, limit: int, turns: int
) -> None:
    """Slices of 256 requests still held the loop 25-50 ms each (a small request beside a
    20,000-request create waited 0.27 s); a slice now ends after PARSE_SLICE requests or
    PARSE_SLICE_BYTES of their JSON. Counted: how often a concurrent task got a turn."""
    import asyncio

    cfg = dataclasses.replace(CFG, batches=dataclasses.replace(CFG.batches, max_requests=limit))
    raw = json.dumps(
        {
            "requests": [
                _item(str(i), messages=[{"role": "user", "content": "x" * size}])
                for i in range(requests)
            ]
        }
    ).encode()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    try:
        out, _ = await _parse_raw(cfg, raw)
        assert len(out) == requests
    except errors.InvalidRequest as exc:
        assert limit < requests and exc.message.endswith(f"not {requests}")
    task.cancel()
    assert ticks - before >= turns
