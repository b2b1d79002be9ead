"""A developer named by a trusted proxy in front of the gateway: who a forwarded request is for.

Anthropic's own team gateway (``claude gateway``, in Claude Code's binary) signs developers in
with OpenID Connect and, for an ``anthropic`` upstream with ``forward_user_identity: true``,
sends each request here with the upstream's ``auth.api_key`` as ``x-api-key`` and the
signed-in developer in two headers: ``x-claude-gateway-user-id`` (the ID token's ``sub``) and
``x-claude-gateway-user-email`` (its email claim). It trims each value and percent-encodes
``%`` and every byte outside printable ASCII (``encodeURIComponent``); it also sends the email
as ``x-litellm-end-user-id``, which this gateway does not read.

Any client can write those headers, so they are believed only when both hold:

* the connection's peer address is in ``auth.trusted_forwarders`` (CIDRs; the socket's
  address, never a header such as ``X-Forwarded-For``), and
* the request's key is that of a ``[[clients]]`` entry with ``forwards_identity = true``
  (a sign-in token or an ``api_keys_env`` key never forwards).

Then the request is the client whose ``forwarded_ids`` holds the id, else the one whose
``forwarded_emails`` holds the email (case-insensitively), else the forwarder's own client:
a developer no entry names shares the forwarder's limits. Otherwise the headers are ignored
and the request is its key's client. Neither header ever reaches an upstream: the gateway
builds every upstream request's headers itself.

Pure (no aiohttp). Cost per request with no forwarder configured: one attribute read; with
one, two header lookups, and for a request carrying them an address parse and a dict lookup.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

from gateway.ops.config import Config

USER_ID_HEADER = "x-claude-gateway-user-id"
USER_EMAIL_HEADER = "x-claude-gateway-user-email"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Forwarded(enum.Enum):
    """What became of a request's identity headers (a metric's label)."""

    NONE = "none"  # it carried none
    IGNORED = "ignored"  # an untrusted address, or a key not allowed to forward
    NAMED = "named"  # a client names the developer
    UNNAMED = "unnamed"  # trusted, but no client names the developer: the forwarder's own


def _address(peer: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not peer:  # a Unix socket, or a transport already closed
        return None
    try:
        address = ipaddress.ip_address(peer.partition("%")[0])  # no IPv6 zone
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # a dual-stack socket's IPv4 peer
    return address


def _value(raw: str | None) -> str:
    return unquote(raw.strip(), errors="strict") if raw else ""


@dataclass(frozen=True, slots=True)
class Forwarding:
    """The trust rule of one config, over the clients' names."""

    networks: tuple[Network, ...] = ()
    forwarders: frozenset[str] = frozenset()  # the clients allowed to forward
    by_id: Mapping[str, str] = field(default_factory=dict)  # user id -> client name
    by_email: Mapping[str, str] = field(default_factory=dict)  # lower-cased email -> name

    @property
    def active(self) -> bool:
        return bool(self.networks and self.forwarders)

    def trusts(self, peer: str | None) -> bool:
        address = _address(peer)
        return address is not None and any(address in net for net in self.networks)

    def resolve(
        self, peer: str | None, name: str, user_id: str | None, user_email: str | None
    ) -> tuple[str, Forwarded]:
        """The name of the client a request is for: ``name`` (its key's client) unless a
        trusted forwarder names another. -> (name, what became of the headers)."""
        if not user_id and not user_email:
            return name, Forwarded.NONE
        if name not in self.forwarders or not self.trusts(peer):
            return name, Forwarded.IGNORED
        try:
            uid, email = _value(user_id), _value(user_email).lower()
        except UnicodeDecodeError:  # not what claude gateway writes: believe none of it
            return name, Forwarded.IGNORED
        named = self.by_id.get(uid) if uid else None
        if named is None and email:
            named = self.by_email.get(email)
        if named is None:
            return name, Forwarded.UNNAMED
        return named, Forwarded.NAMED

    @classmethod
    def of(cls, cfg: Config) -> Forwarding:
        by_id: dict[str, str] = {}
        by_email: dict[str, str] = {}
        for c in cfg.clients:
            by_id.update(dict.fromkeys(c.forwarded_ids, c.name))
            by_email.update(dict.fromkeys((e.lower() for e in c.forwarded_emails), c.name))
        return cls(
            tuple(ipaddress.ip_network(n, strict=False) for n in cfg.auth.trusted_forwarders),
            frozenset(c.name for c in cfg.clients if c.forwards_identity),
            by_id,
            by_email,
        )
