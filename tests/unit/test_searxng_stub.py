"""The test suite's SearXNG stand-in (tests/searxng_stub.py) answers in SearXNG's own shape.

``tests/golden/searxng/search.json`` is a search reply written out field by field from
SearXNG's source (searx/webutils.py ``get_json_response``, searx/result_types/_base.py
``MainResult``; searxng/searxng 9fea412): the stub's replies must have its keys, in its
order, with its value types, so a gateway that parses the stub parses SearXNG.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.searxng_stub import make_app, search_response

GOLDEN = json.loads(
    (Path(__file__).resolve().parents[1] / "golden" / "searxng" / "search.json").read_text()
)


def _types(value: Any) -> Any:
    """The JSON shape of a value: key -> type name for objects, type name otherwise."""
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    return type(value).__name__


def test_a_reply_has_searxngs_keys_in_order() -> None:
    body = search_response("gateway release notes")
    assert list(body) == list(GOLDEN)
    assert list(body["results"][0]) == list(GOLDEN["results"][0])
    assert all(list(r) == list(GOLDEN["results"][0]) for r in body["results"])


@pytest.mark.parametrize("index", [0, 1])
def test_a_result_has_searxngs_value_types(index: int) -> None:
    """Result 1 carries a date, result 2 has none (``publishedDate`` null, ``pubdate`` "")."""
    got, want = search_response("release notes")["results"][index], GOLDEN["results"][index]
    assert _types(got) == _types(want)
    if want["publishedDate"] is not None:
        # datetime.isoformat() of a naive datetime, as SearXNG's JSONEncoder writes it
        assert got["publishedDate"][10] == "T" and len(got["publishedDate"]) == 19
    assert got["parsed_url"][:3] == [
        "https",
        got["url"].split("/")[2],
        "/" + got["url"].split("/", 3)[3],
    ]


@pytest.mark.parametrize(
    ("query", "check"),
    [
        (
            "a b site:wiki.example.org",
            lambda b: {r["parsed_url"][1] for r in b["results"]} == {"wiki.example.org"},
        ),
        (
            "x #empty",
            lambda b: (
                b["results"] == []
                and all(isinstance(e, list) and len(e) == 2 for e in b["unresponsive_engines"])
            ),
        ),
        ("x #nocount", lambda b: "number_of_results" not in b and len(b["results"]) == 3),
        ("x #many", lambda b: len(b["results"]) == 10),
        (
            "Hello, World",
            lambda b: (
                b["query"] == "Hello, World"
                and b["results"][0]["url"] == "https://docs.example.org/hello-world/1"
            ),
        ),
    ],
)
def test_results_follow_the_query(query: str, check: Any) -> None:
    assert check(search_response(query))


@pytest.mark.parametrize(
    ("path", "status", "body"),
    [
        ("/search?q=x+%23fail&format=json", 500, {"error": "search error"}),
        ("/search?format=json", 400, {"error": "No query"}),
        ("/search?q=x+%23busy&format=json", 429, None),
        ("/search?q=x", 403, None),  # only the json format is enabled
        ("/search?q=x&format=csv", 403, None),
        ("/search?q=x+%23garbage&format=json", 200, None),
        ("/?q=x&format=json", 200, "ok"),
    ],
)
async def test_the_http_answers(aiohttp_client: Any, path: str, status: int, body: Any) -> None:
    client = await aiohttp_client(make_app(slow_seconds=0))
    resp = await client.get(path)
    assert resp.status == status
    if isinstance(body, dict):
        assert await resp.json() == body
    elif body == "ok":
        assert (await resp.json())["query"] == "x"
    health = await client.get("/healthz")
    assert health.status == 200 and await health.text() == "OK"
    seen = await (await client.get("/_requests")).json()
    assert seen[0]["params"] == dict(resp.url.query)
