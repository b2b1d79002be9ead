"""The engines' real context windows, learnt in the background (never on a request's path).

For each upstream whose ``context_window_interval`` is not 0, one task (app.py's cleanup_ctx)
asks the engine for the window of every route to it that has no ``context_window`` in the
config (the config wins), at start and every ``context_window_interval`` seconds after: one
request per distinct question (gateway/upstream/windows.py :func:`~windows.ask`), on a
connection of its own (``Connection: close``), within ``WINDOW_TIMEOUT`` seconds all in and
at most ``windows.MAX_REPLY_BYTES`` read; the first replica that answers 200 is taken (replicas
are one server). A failed or senseless answer keeps what was learnt before.

What is learnt, :class:`Windows`, is read by ``/v1/models`` and ``/managed/settings``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

import structlog

from gateway.ops.config import ModelRoute
from gateway.upstream import windows
from gateway.upstream.client import UpstreamClient

_log = structlog.get_logger("gateway.upstream")

# seconds one question to an engine may take, connect to last byte
WINDOW_TIMEOUT = 5.0
# replicas tried per question before the round gives up
MAX_TRIES = 3


class Windows:
    """Route name -> the window its engine stated (only routes without a configured one)."""

    def __init__(self) -> None:
        self.learnt: dict[str, int] = {}

    def of(self, route: ModelRoute) -> int:
        """The route's window: the configured one, else the learnt one; 0: unknown."""
        return route.context_window or self.learnt.get(route.name, 0)


def asked(routes: Iterable[ModelRoute], client: UpstreamClient) -> list[ModelRoute]:
    """The routes to ``client`` whose window is to be learnt."""
    if not client.cfg.context_window_interval or client.cfg.kind not in windows.KINDS:
        return []
    return [r for r in routes if r.upstream.name == client.name and not r.context_window]


async def learn(found: Windows, routes: list[ModelRoute], client: UpstreamClient) -> None:
    """One round: ask the engine behind ``client`` for each route's window."""
    replies: dict[windows.Ask, bytes | None] = {}
    kind = client.cfg.kind
    for route in routes:
        question = windows.ask(kind, route.upstream_model)
        if question is None:
            continue
        if question not in replies:
            replies[question] = await _fetch(client, question)
        body = replies[question]
        value = windows.parse(kind, route.upstream_model, body) if body is not None else None
        if value is None:
            continue
        if found.learnt.get(route.name) != value:
            _log.info("context_window_learnt", model=route.name, context_window=value)
        found.learnt[route.name] = value


async def watch(found: Windows, routes: list[ModelRoute], client: UpstreamClient) -> None:
    """Learn the windows now and every ``context_window_interval`` seconds, until cancelled."""
    while True:
        try:
            await learn(found, routes, client)
        except Exception as exc:  # (a bug must not end the learning for good)
            _log.error("context_window_error", upstream=client.name, error=type(exc).__name__)
        await asyncio.sleep(client.cfg.context_window_interval)


async def _fetch(client: UpstreamClient, question: windows.Ask) -> bytes | None:
    """The body of the first replica's 200 answer to ``question``; None: none answered."""
    members = client.members
    for replica in list(client.replicas.all)[:MAX_TRIES]:
        pool = members.pools.get(replica.index)
        paths = members.targets.get(replica.index)
        if pool is None or paths is None:
            continue
        target = (paths[1] if question.root else paths[0]) + question.path
        try:
            async with asyncio.timeout(WINDOW_TIMEOUT):
                resp = await pool.request(
                    question.method,
                    target,
                    question.body,
                    head_timeout=WINDOW_TIMEOUT,
                    body_timeout=WINDOW_TIMEOUT,
                    fresh=True,
                )
                try:
                    if resp.status != 200:
                        _log.info(
                            "context_window_unanswered", upstream=client.name, status=resp.status
                        )
                        continue
                    return await resp.read(cap=windows.MAX_REPLY_BYTES)
                finally:
                    resp.close()
        except Exception as exc:  # refused, reset, too large, timed out: the next replica
            _log.info("context_window_unanswered", upstream=client.name, error=type(exc).__name__)
    return None


def learners(
    found: Windows, routes: Mapping[str, ModelRoute], clients: Mapping[str, UpstreamClient]
) -> list[asyncio.Task[None]]:
    """One :func:`watch` task per upstream with a window to learn."""
    tasks = []
    for client in clients.values():
        mine = asked(routes.values(), client)
        if mine:
            tasks.append(asyncio.create_task(watch(found, mine, client)))
    return tasks
