"""A bare aiohttp relay: the Python floor for the OpenAI pass-through.

    python -m tests.benchmarks.bare_relay PORT UPSTREAM_BASE_URL

No auth, metrics, logging, validation or model aliasing: the body goes upstream as is,
the reply (buffered, or a stream relayed as the bytes arrive) comes back as is.
"""

from __future__ import annotations

import sys

import aiohttp
from aiohttp import web

_SESSION = web.AppKey("session", aiohttp.ClientSession)
_UPSTREAM = web.AppKey("upstream", str)


async def _relay(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    session = request.app[_SESSION]
    async with session.post(
        request.app[_UPSTREAM] + "/chat/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    ) as up:
        ctype = up.headers.get("Content-Type", "application/json")
        if not ctype.startswith("text/event-stream"):
            return web.Response(
                body=await up.read(), status=up.status, headers={"Content-Type": ctype}
            )
        resp = web.StreamResponse(
            status=up.status, headers={"Content-Type": ctype, "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        async for data in up.content.iter_any():
            await resp.write(data)
        await resp.write_eof()
        return resp


async def _session(app: web.Application):  # type: ignore[no-untyped-def]
    # limit=0: aiohttp's default of 100 connections would queue the 101st stream
    app[_SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    yield
    await app[_SESSION].close()


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def main(argv: list[str]) -> None:
    app = web.Application()
    app[_UPSTREAM] = argv[2].rstrip("/")
    app.cleanup_ctx.append(_session)
    app.router.add_post("/v1/chat/completions", _relay)
    app.router.add_get("/health", _health)
    web.run_app(app, host="127.0.0.1", port=int(argv[1]), access_log=None, print=None, backlog=4096)


if __name__ == "__main__":
    main(sys.argv)
