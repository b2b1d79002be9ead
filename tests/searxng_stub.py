"""A SearXNG-compatible search backend for end-to-end tests (run as a real process).

    python tests/searxng_stub.py PORT [SLOW_SECONDS]

What it answers, and the real SearXNG facts it copies (searx/webapp.py ``search()`` and
``index_error()``, searx/webutils.py ``get_json_response()``, searx/result_types/_base.py
``Result`` / ``MainResult``; read at searxng/searxng 9fea412, Aug 2026; docs/dev/search_api.rst):

- ``GET`` or ``POST /search`` (and ``/``) with ``q`` and ``format=json`` (query string or form
  data): ``200 application/json``, the object ``get_json_response`` writes::

      {"query": str, "number_of_results": int, "results": [MainResult...],
       "answers": [...], "corrections": [str], "infoboxes": [...], "suggestions": [str],
       "unresponsive_engines": [[engine, message], ...]}

  ``number_of_results`` is an int (0 when the engines report no count); SearXNG dropped it
  from the JSON in May 2026 (commit dd27fce3b), so a query holding ``#nocount`` leaves it
  out, as a current instance does. ``unresponsive_engines`` is a list of 2-item lists
  ``[engine name, translated error]`` (``"timeout"``, ``"CAPTCHA"``, ...), sorted by engine.
- Each result is ``MainResult.as_dict()``: every struct field, in order: ``url``, ``engine``,
  ``parsed_url`` (``urllib.parse.ParseResult`` as a 6-item list), ``template``, ``title``,
  ``content`` (plain text in JSON; only the HTML page escapes and highlights it), ``img_src``,
  ``iframe_src``, ``audio_src``, ``thumbnail``, ``publishedDate`` (``datetime.isoformat()``,
  e.g. ``"2026-03-14T09:26:53"``, or null), ``pubdate`` (``"%Y-%m-%d %H:%M:%S%z"`` or ``""``),
  ``length`` (seconds or null), ``views``, ``author``, ``metadata``, ``priority``,
  ``engines`` (a list: a set in Python), ``open_group``, ``close_group``, ``positions``
  (list of int), ``score`` (float), ``category``.
- No ``q``: ``400 {"error": "No query"}``. A format the instance has not enabled (here
  anything but ``json``): ``403``. An exception in the search: ``500 {"error": "search
  error"}``. ``GET /healthz``: ``200 OK`` (text/plain).

Results are deterministic, derived from the query: three results on three hosts
(``docs.example.org``, ``news.example.com``, ``blog.example.net``), URL
``https://HOST/<slug of the query>/<n>``, title ``<query> - result <n>``, content
``Snippet <n> about <query>.``; the second has no ``publishedDate``. A ``site:HOST`` term
keeps only results on HOST (engines honour it, so all three are then on HOST).

Markers in the query script the failure modes (the marker stays in the echoed ``query``):

    #fail      500 {"error": "search error"}, as SearXNG when the search raises
    #busy      429 ``Too Many Requests`` (text/html), as SearXNG's limiter (searx/botdetection)
    #slow      sleeps SLOW_SECONDS (default 30: past any sane search timeout), then answers
    #empty     no results; ``unresponsive_engines`` names two engines (timeout, CAPTCHA)
    #nocount   no ``number_of_results`` key (SearXNG since May 2026)
    #garbage   200 application/json whose body is not JSON
    #html      200 text/html (a login page of a proxy in front of the instance)
    #many      ten results instead of three (hosts cycle), for result caps
    #redirectN 302 to the same path and query on ``127.0.0.1:N`` (an instance behind a proxy
               that sends a client elsewhere: the gateway must not follow it)
    #odd       results as SearXNG may pass them on (:func:`odd_results`): an empty title, an
               ``ftp://`` URL, a URL with a query string and non-ASCII path, a
               ``publishedDate`` with a UTC offset, a long multi-line snippet

``GET /_requests`` returns every search request seen (method, path, its parameters as a
dict, and ``"cancelled": true`` for a ``#slow`` one whose connection the gateway closed
while it slept); ``DELETE /_requests`` clears it.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import re
import sys
from urllib.parse import urlparse

from aiohttp import web

HOSTS = ("docs.example.org", "news.example.com", "blog.example.net")
ENGINES = ("duckduckgo", "brave", "wikipedia")
PUBLISHED = datetime.datetime(2026, 3, 14, 9, 26, 53)
_SITE = re.compile(r"(?:^|\s)site:(\S+)")
_MARKER = re.compile(r"#\w+")
_REDIRECT = re.compile(r"#redirect(\d+)")


def slug(query: str) -> str:
    """The query's words, lower case, joined by ``-`` (markers and ``site:`` terms left out)."""
    words = _SITE.sub(" ", _MARKER.sub(" ", query)).lower()
    return "-".join(re.findall(r"[a-z0-9]+", words)) or "query"


def result(query: str, n: int, host: str) -> dict:
    """Result ``n`` (1-based) for ``query`` on ``host``: ``MainResult.as_dict()``'s fields."""
    url = f"https://{host}/{slug(query)}/{n}"
    parsed = urlparse(url)
    engine = ENGINES[(n - 1) % len(ENGINES)]
    published = None if n % 3 == 2 else PUBLISHED - datetime.timedelta(days=n)
    shown = " ".join(_MARKER.sub(" ", query).split())
    return {
        "url": url,
        "engine": engine,
        "parsed_url": [
            parsed.scheme,
            parsed.netloc,
            parsed.path,
            parsed.params,
            parsed.query,
            parsed.fragment,
        ],
        "template": "default.html",
        "title": f"{shown} - result {n}",
        "content": f"Snippet {n} about {shown}.",
        "img_src": "",
        "iframe_src": "",
        "audio_src": "",
        "thumbnail": "",
        "publishedDate": published.isoformat() if published else None,
        "pubdate": published.strftime("%Y-%m-%d %H:%M:%S%z") if published else "",
        "length": None,
        "views": "",
        "author": "",
        "metadata": "",
        "priority": "",
        "engines": [engine],
        "open_group": n == 1,
        "close_group": False,
        "positions": [n],
        "score": round(3.0 / n, 6),
        "category": "general",
    }


ODD_URL = "https://wiki.example.org/wiki/Z\u00fcrich?lang=de&x=1"


def odd_results(query: str) -> list[dict]:
    """``#odd``: five results whose fields are legal in SearXNG but awkward downstream."""
    base = [result(query, n, HOSTS[(n - 1) % 3]) for n in range(1, 6)]
    base[0]["title"] = ""
    base[1].update(
        url="ftp://files.example.org/pub/notes.txt",
        parsed_url=["ftp", "files.example.org", "/pub/notes.txt", "", "", ""],
    )
    base[2].update(
        url=ODD_URL,
        parsed_url=["https", "wiki.example.org", "/wiki/Z\u00fcrich", "", "lang=de&x=1", ""],
    )
    base[3].update(publishedDate="2026-03-13T09:26:53+02:00", pubdate="2026-03-13 09:26:53+0200")
    base[4]["content"] = "\n\t".join(["A long line of page text."] * 200)
    return base


def search_response(query: str) -> dict:
    """The JSON body of a successful search for ``query``."""
    site = _SITE.search(query)
    count = 10 if "#many" in query else 3
    hosts = [site.group(1)] * count if site else [HOSTS[i % len(HOSTS)] for i in range(count)]
    results = (
        [] if "#empty" in query else [result(query, i + 1, host) for i, host in enumerate(hosts)]
    )
    if "#odd" in query:
        results = odd_results(query)
    body: dict = {
        "query": query,
        "number_of_results": 0,
        "results": results,
        "answers": [],
        "corrections": [],
        "infoboxes": [],
        "suggestions": [],
        "unresponsive_engines": [],
    }
    if "#empty" in query:
        body["unresponsive_engines"] = [["brave", "CAPTCHA"], ["duckduckgo", "timeout"]]
    else:
        body["suggestions"] = [f"{slug(query).replace('-', ' ')} latest"]
    if "#nocount" in query:
        del body["number_of_results"]
    return body


class SearxStub:
    def __init__(self, slow_seconds: float) -> None:
        self.slow_seconds = slow_seconds
        self.requests: list[dict] = []

    async def search(self, request: web.Request) -> web.StreamResponse:
        params = dict(request.query)
        if request.method == "POST":
            params.update({k: str(v) for k, v in (await request.post()).items()})
        record: dict = {"method": request.method, "path": request.path, "params": params}
        self.requests.append(record)
        if params.get("format", "html") != "json":
            return web.Response(status=403, text="403 Forbidden", content_type="text/html")
        query = params.get("q", "")
        if not query:
            return web.json_response({"error": "No query"}, status=400)
        redirect = _REDIRECT.search(query)
        if redirect is not None:
            target = f"http://127.0.0.1:{redirect.group(1)}{request.path_qs}"
            return web.Response(status=302, headers={"Location": target})
        if "#fail" in query:
            return web.json_response({"error": "search error"}, status=500)
        if "#busy" in query:
            return web.Response(status=429, text="Too Many Requests", content_type="text/html")
        if "#slow" in query:
            try:
                await asyncio.sleep(self.slow_seconds)
            except asyncio.CancelledError:  # the gateway closed the connection
                record["cancelled"] = True
                raise
        if "#garbage" in query:
            return web.Response(text='{"query": "trunc', content_type="application/json")
        if "#html" in query:
            return web.Response(text="<html><body>Sign in</body></html>", content_type="text/html")
        return web.Response(
            text=json.dumps(search_response(query)), content_type="application/json"
        )

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="OK", content_type="text/plain")

    async def get_requests(self, request: web.Request) -> web.Response:
        return web.json_response(self.requests)

    async def clear_requests(self, request: web.Request) -> web.Response:
        self.requests.clear()
        return web.json_response({})


def make_app(slow_seconds: float = 30.0) -> web.Application:
    stub = SearxStub(slow_seconds)
    app = web.Application()
    for path in ("/search", "/"):
        app.router.add_get(path, stub.search)
        app.router.add_post(path, stub.search)
    app.router.add_get("/healthz", stub.healthz)
    app.router.add_get("/_requests", stub.get_requests)
    app.router.add_delete("/_requests", stub.clear_requests)
    return app


if __name__ == "__main__":
    slow = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
    web.run_app(
        make_app(slow),
        host="127.0.0.1",
        port=int(sys.argv[1]),
        print=None,
        handler_cancellation=True,
        access_log=None,
    )
