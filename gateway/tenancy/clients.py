"""A request's key to its client: :class:`Tenants`, built from the config and swapped whole
when the config is re-read (SIGHUP).

Keys are compared by their SHA-256: the config may hold only the digest (``key_sha256``), and
one dict lookup finds the client whatever the number of clients. What a lookup's timing could
tell is where a digest of the presented key falls in a hash table, nothing of a configured
key. The keys of ``server.api_keys_env`` are one client, ``anonymous`` (as every request is
when no key is configured at all).

Cost per request: one SHA-256 of the presented key (about 0.5 µs) and a dict lookup.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.ops.config import ANONYMOUS, Config
from gateway.ops.config_schema import ClientConfig, is_pattern
from gateway.tenancy.forwarding import Forwarding
from gateway.text.glob import glob_match


@dataclass(frozen=True, slots=True)
class Client:
    """One client as limits, admission and usage see it. Every limit's 0 is no limit."""

    name: str
    models: tuple[str, ...] = ()  # names and patterns it may use; (): every model
    max_concurrency: int = 0
    requests_per_minute: int = 0
    input_tokens_per_minute: int = 0
    output_tokens_per_minute: int = 0
    tokens_per_day: int = 0
    weight: float = 1.0
    # the account shown to a developer who signs in as this client (gateway/auth/): "" none
    email: str = ""
    # a rate limit or a concurrency limit: the one attribute a request of a client without
    # limits reads (gateway/http/charges.py)
    metered: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "metered", self.limited or self.max_concurrency > 0)

    @property
    def limited(self) -> bool:
        """Any rate limit set (the per-request counters run only then)."""
        return bool(
            self.requests_per_minute
            or self.input_tokens_per_minute
            or self.output_tokens_per_minute
            or self.tokens_per_day
        )

    def may_use(self, requested: str, route_name: str) -> bool:
        """The model the client asked for (or the configured route it reached) is on its
        list: an exact name, or a ``*`` pattern matching the name asked for."""
        if not self.models:
            return True
        for allowed in self.models:
            if allowed == requested or allowed == route_name:
                return True
            if is_pattern(allowed) and glob_match(allowed, requested):
                return True
        return False

    @classmethod
    def of(cls, c: ClientConfig) -> Client:
        return cls(
            c.name,
            c.models,
            c.max_concurrency,
            c.requests_per_minute,
            c.input_tokens_per_minute,
            c.output_tokens_per_minute,
            c.tokens_per_day,
            c.weight,
            c.email,
        )


ANONYMOUS_CLIENT = Client(ANONYMOUS)


def owner_id(digest: bytes) -> str:
    """A batch owner's id from a key's SHA-256: what the batches store has always kept."""
    return digest.hex()[:32]


def signin_key(name: str) -> bytes:
    """What stands for the key of a request made with a signed-in developer's token
    (gateway/auth/): one per client, so a batch made with a token is the client's, whatever
    token made it (they are refreshed hourly). A NUL byte: no header can present it."""
    return b"\0signin:" + name.encode()


class Tenants:
    """Keys -> clients, for one config. Its tables do not change (only the keys already
    matched are remembered, :meth:`identify`): a reload builds a new one."""

    __slots__ = (
        "_by_digest",
        "_by_owner",
        "_seen",
        "admin_digests",
        "clients",
        "forwarding",
        "keyed",
        "oidc_values",
    )

    def __init__(self, cfg: Config) -> None:
        by_digest: dict[bytes, Client] = {}
        for key in cfg.server.api_keys:
            by_digest[hashlib.sha256(key.encode()).digest()] = ANONYMOUS_CLIENT
        named: dict[str, Client] = {}
        for c in cfg.clients:
            client = Client.of(c)
            by_digest[c.key_digest] = client
            named[c.name] = client
        self._by_digest: Mapping[bytes, Client] = by_digest
        # keys presented before -> their client: at most one entry per configured key (only
        # a key whose digest is configured is kept), so a request with a known key skips the
        # SHA-256 (3-6 µs of a reply's CPU where requests come one at a time: OpenSSL's code
        # is cold by the next one). A bytes key is looked up by its keyed SipHash and compared
        # only on a full hash match, which a caller cannot aim at.
        self._seen: dict[bytes, Client] = {}
        self._by_owner = {owner_id(d): c for d, c in by_digest.items()}
        for name, client in named.items():  # batches made with a sign-in token
            self._by_owner[owner_id(hashlib.sha256(signin_key(name)).digest())] = client
        # every configured client by name ("anonymous" too): the bounded label set of the
        # per-client metrics and the usage report's api_key_ids
        self.clients: Mapping[str, Client] = {ANONYMOUS: ANONYMOUS_CLIENT, **named}
        # True when any key is configured: a request without a known one is a 401
        self.keyed = bool(by_digest)
        self.admin_digests = frozenset(
            hashlib.sha256(k.encode()).digest() for k in cfg.server.admin_keys
        )
        # (name, auth.oidc_claim's values naming it) in config order: the OpenID Connect
        # sign-in's mapping (gateway/auth/oidc_state.py)
        self.oidc_values: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
            (c.name, c.oidc_values) for c in cfg.clients if c.oidc_values
        )
        # whom a trusted proxy's requests are for (gateway/tenancy/forwarding.py)
        self.forwarding = Forwarding.of(cfg)

    def identify(self, presented: bytes | None) -> Client | None:
        """The client whose key was presented; None: no such key (a 401). With no key
        configured every request is ``anonymous``."""
        if not self.keyed:
            return ANONYMOUS_CLIENT
        if presented is None:
            return None
        client = self._seen.get(presented)
        if client is None:
            client = self._by_digest.get(hashlib.sha256(presented).digest())
            if client is not None:
                self._seen[presented] = client
        return client

    def is_admin(self, presented: bytes | None) -> bool:
        return presented is not None and (hashlib.sha256(presented).digest() in self.admin_digests)

    def by_owner(self, owner: str) -> Client:
        """A batch's owner (gateway/http/batches.py ``owner_of``) to its client, for the
        batch's requests' limits and usage; an unknown owner (its key since removed) is
        ``anonymous``."""
        return self._by_owner.get(owner, ANONYMOUS_CLIENT)
