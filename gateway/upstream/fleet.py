"""The fleet's background work, one task per upstream while the app runs (app.py's
cleanup_ctx): DNS re-resolution every ``resolve_interval`` seconds (``discover = "dns"``,
gateway/upstream/discovery.py) and active health probes every ``health_interval`` seconds.

Both run on the loop and never block it: ``getaddrinfo`` runs in the loop's executor, each
resolution within ``discovery.RESOLVE_TIMEOUT``; a probe round sends one probe per replica
at once, each within ``health_timeout``, and the next round starts ``health_interval`` after
the last one ended, so a replica never has two probes out. Probes stop when the gateway
starts draining (nothing new is sent then); re-resolution goes on until shutdown, for the
requests still finishing. The first resolution and the first probe round happen in
``UpstreamClient.start``, before the gateway is ready.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from gateway.upstream.client import UpstreamClient

_log = structlog.get_logger("gateway.upstream")


async def maintain(client: UpstreamClient, draining: Callable[[], bool]) -> None:
    """Re-resolve and probe ``client``'s replicas until cancelled (each as configured)."""
    jobs = []
    if client.discover:
        jobs.append(_resolving(client))
    if client.cfg.health_interval:
        jobs.append(_probing(client, draining))
    await asyncio.gather(*jobs)


def needed(client: UpstreamClient) -> bool:
    """Whether ``client`` has background work at all."""
    return client.discover or bool(client.cfg.health_interval)


async def _resolving(client: UpstreamClient) -> None:
    while True:
        await asyncio.sleep(client.cfg.resolve_interval)
        try:
            await client.members.resolve_now()
        except Exception as exc:  # (a bug must not end re-resolution for good)
            _log.error("upstream_resolve_error", upstream=client.name, error=type(exc).__name__)


async def _probing(client: UpstreamClient, draining: Callable[[], bool]) -> None:
    while True:
        await asyncio.sleep(client.cfg.health_interval)
        if draining():
            return
        try:
            await client.members.probe_all()
        except Exception as exc:
            _log.error("upstream_probe_error", upstream=client.name, error=type(exc).__name__)
