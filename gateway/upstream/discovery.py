"""Replicas found by DNS: one name (a Kubernetes headless Service) that resolves to several
addresses, each a replica.

With ``discover = "dns"`` the host of the upstream's ``base_url`` is resolved (every A and
AAAA record, through the event loop's ``getaddrinfo``, which runs in a thread) at start-up
and every ``resolve_interval`` seconds after. Each address is a replica whose URL is
``base_url`` with the address in place of the name (same scheme, port and path); the
connection goes to the address, the ``Host`` header and TLS's server name stay the name's
(gateway/upstream/pool.py). Rendezvous hashing (gateway/upstream/replicas.py) scores the
address URLs, so every gateway process that sees the same answer places sessions alike, and
an address that comes or goes moves only the sessions it wins or held.

This module is the pure part: :func:`diff` says which addresses join and leave; the
client's members (gateway/upstream/members.py) open and drain their pools. A resolution that
fails, times out or answers nothing keeps the last good set: a DNS hiccup must not empty a
working fleet. At most ``max_replicas`` addresses are replicas at once; the ones kept are the
ones already in (in place), then the newcomers in address order.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

# (host, port) -> the addresses it resolves to, in the resolver's order
Resolve = Callable[[str, int], Awaitable[list[str]]]
# the longest one resolution may take before it counts as failed
RESOLVE_TIMEOUT = 5.0
# the ``outcome`` label of llm_gateway_upstream_resolutions_total
RESOLUTION_OUTCOMES = ("ok", "failed", "empty")


async def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (A and AAAA), once each, in the resolver's order."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def target(base_url: str) -> tuple[str, int]:
    """(the name to resolve, the port) of a base URL."""
    parts = urlsplit(base_url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def replica_url(base_url: str, address: str) -> str:
    """``base_url`` with ``address`` in place of its host (an IPv6 one bracketed); the port
    written out, the userinfo left out."""
    parts = urlsplit(base_url)
    _, port = target(base_url)
    try:
        literal = ipaddress.ip_address(address.partition("%")[0])
    except ValueError:
        literal = None
    host = f"[{address}]" if literal is not None and literal.version == 6 else address
    return urlunsplit((parts.scheme, f"{host}:{port}", parts.path, parts.query, ""))


@dataclass(frozen=True)
class Change:
    """What one resolution changes: the addresses that ``join`` and ``leave``, and how many
    it gave beyond the cap (left out: ``over``)."""

    join: tuple[str, ...] = ()
    leave: tuple[str, ...] = ()
    over: int = 0


def diff(current: Sequence[str], answer: Sequence[str], cap: int) -> Change:
    """The change from ``current`` to ``answer``, at most ``cap`` addresses in all.

    An empty answer changes nothing (the caller counts it: the last good set stays).
    Addresses in both stay in place; newcomers join in address order while there is room.
    """
    if not answer:
        return Change()
    answered = dict.fromkeys(answer)
    stay = [a for a in current if a in answered]
    leave = tuple(a for a in current if a not in answered)
    new = sorted(a for a in answered if a not in set(current))
    room = max(cap - len(stay), 0)
    return Change(join=tuple(new[:room]), leave=leave, over=max(len(new) - room, 0))
