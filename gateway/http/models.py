"""``GET {prefix}/v1/models`` and ``/v1/models/{id}``: the configured model aliases.

A request with an ``anthropic-version`` header gets Anthropic's list shape
(``data`` of ``{type:"model", id, display_name, created_at}``, with ``max_input_tokens``
(the window: configured, or read from the engine, gateway/upstream/window_watch.py) and
``max_tokens`` (the output cap /managed/settings pushes) when the window is known; ``lifecycle``
too, which the Python SDK's strict validation requires; ``has_more``,
``first_id``, ``last_id``; ``limit``/``after_id``/``before_id`` honoured so the
SDK auto-pager terminates). Any other request gets OpenAI's list shape.

The list holds exact names only; ``/v1/models/{id}`` answers any id a route takes,
patterns included (``claude-haiku-4-5`` under ``claude-*``), echoing the id asked for.
"""

from __future__ import annotations

from datetime import datetime

from aiohttp import web

from gateway import errors
from gateway.http.keys import CONFIG, EXCHANGE, WINDOWS
from gateway.http.managed_settings import output_cap
from gateway.ops.config import ModelRoute, find_route
from gateway.ops.config_schema import is_pattern
from gateway.text import jsonutil


def _anthropic(route: ModelRoute, model_id: str, window: int, cap: int) -> dict[str, object]:
    shown = route.display_name if route.name == model_id else model_id
    info: dict[str, object] = {
        "type": "model",
        "id": model_id,
        "display_name": shown or model_id,
        "created_at": route.created_at,
        "lifecycle": "active",
    }
    if window:  # optional fields of the model object
        info["max_input_tokens"] = window
        if cap:
            info["max_tokens"] = output_cap(window, cap)
    return info


def _openai(route: ModelRoute, model_id: str) -> dict[str, object]:
    try:
        created = int(datetime.fromisoformat(route.created_at.replace("Z", "+00:00")).timestamp())
    except ValueError:
        created = 0
    return {"id": model_id, "object": "model", "created": created, "owned_by": route.upstream.name}


def _json(body: object) -> web.Response:
    return web.Response(body=jsonutil.dumpb(body), content_type="application/json")


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit", "20")
    try:
        limit = int(raw)
    except ValueError:
        raise errors.InvalidRequest("limit", "must be an integer") from None
    if not 1 <= limit <= 1000:
        raise errors.InvalidRequest("limit", "must be between 1 and 1000")
    return limit


async def list_models(request: web.Request) -> web.Response:
    # A pattern route (``claude-*``) is no model id a client could pick from a list.
    # A client with a models list sees only what it may use.
    client = request[EXCHANGE].client
    routes = [
        r
        for r in request.app[CONFIG].models.values()
        if not is_pattern(r.name) and client.may_use(r.name, r.name)
    ]
    if "anthropic-version" not in request.headers:
        return _json({"object": "list", "data": [_openai(r, r.name) for r in routes]})
    limit = _limit(request)
    windows, cap = request.app[WINDOWS], request.app[CONFIG].server.claude_code_output_cap
    ids = [r.name for r in routes]
    after, before = request.query.get("after_id"), request.query.get("before_id")
    if before is not None:
        end = ids.index(before) if before in ids else 0
        start = max(0, end - limit)
        page = routes[start:end]
        has_more = start > 0
    else:
        start = ids.index(after) + 1 if after in ids else (len(ids) if after else 0)
        page = routes[start : start + limit]
        has_more = start + limit < len(routes)
    return _json(
        {
            "data": [_anthropic(r, r.name, windows.of(r), cap) for r in page],
            "has_more": has_more,
            "first_id": page[0].name if page else None,
            "last_id": page[-1].name if page else None,
        }
    )


async def get_model(request: web.Request) -> web.Response:
    model_id = request.match_info["model_id"]
    route = find_route(request.app[CONFIG].models, model_id)
    if route is not None and not request[EXCHANGE].client.may_use(model_id, route.name):
        route = None  # not this client's: as unknown as a model nobody serves
    if route is None:
        if "anthropic-version" not in request.headers:
            request[EXCHANGE].openai = True
            raise errors.NotFound(f"The model `{errors.echo(model_id, 256)}` does not exist")
        raise errors.NotFound(f"model: {errors.echo(model_id, 256)}")
    if "anthropic-version" not in request.headers:
        return _json(_openai(route, model_id))
    window = request.app[WINDOWS].of(route)
    return _json(
        _anthropic(route, model_id, window, request.app[CONFIG].server.claude_code_output_cap)
    )
