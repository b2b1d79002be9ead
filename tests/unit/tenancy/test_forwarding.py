"""Whom a forwarded request is for (gateway/tenancy/forwarding.py): the trust rule as a table,
and the config that sets it up, taken or refused with one line naming the key.

The rule: ``x-claude-gateway-user-id``/``-email`` (what ``claude gateway`` sends with
``forward_user_identity: true``) are believed only when the connection comes from
``auth.trusted_forwarders`` and its key is a client's with ``forwards_identity = true``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.ops import config
from gateway.tenancy.clients import Tenants
from gateway.tenancy.forwarding import Forwarded
from tests.config_cases import GOOD

ENV = {"PROXY_KEY": "proxy-key", "ALICE_KEY": "alice-key", "BOB_KEY": "bob-key"}

CLIENTS = """
[auth]
trusted_forwarders = ["10.1.0.0/16", "127.0.0.1/32", "fd00::/8"]

[[clients]]
name = "proxy"
key_env = "PROXY_KEY"
forwards_identity = true

[[clients]]
name = "alice"
key_env = "ALICE_KEY"
forwarded_ids = ["sub-alice"]
forwarded_emails = ["Alice@Example.com"]

[[clients]]
name = "bob"
key_env = "BOB_KEY"
forwarded_emails = ["bob@example.com"]
"""


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Tenants:
    path = tmp_path_factory.mktemp("fwd") / "c.toml"
    path.write_text(GOOD + CLIENTS)
    return Tenants(config.load(str(path), ENV))


# (case id, peer address, the key's client, user id header, email header, -> client, outcome)
NAMED, UNNAMED, IGNORED, NONE = (
    Forwarded.NAMED,
    Forwarded.UNNAMED,
    Forwarded.IGNORED,
    Forwarded.NONE,
)
RULE = [
    ("no headers", "127.0.0.1", "proxy", None, None, "proxy", NONE),
    ("empty headers", "127.0.0.1", "proxy", "", "", "proxy", NONE),
    ("by id", "127.0.0.1", "proxy", "sub-alice", None, "alice", NAMED),
    ("by email", "10.1.2.3", "proxy", None, "bob@example.com", "bob", NAMED),
    ("email in any case", "10.1.2.3", "proxy", None, "ALICE@example.COM", "alice", NAMED),
    # percent-encoded as claude gateway writes what is not printable ASCII, and `%` itself
    ("email percent-encoded", "127.0.0.1", "proxy", None, "bob%40example.com", "bob", NAMED),
    ("id wins over email", "127.0.0.1", "proxy", "sub-alice", "bob@example.com", "alice", NAMED),
    ("unknown id, known email", "127.0.0.1", "proxy", "sub-x", "bob@example.com", "bob", NAMED),
    ("nobody names them", "127.0.0.1", "proxy", "sub-x", "x@example.com", "proxy", UNNAMED),
    ("IPv6 in range", "fd00::7", "proxy", "sub-alice", None, "alice", NAMED),
    ("IPv4-mapped IPv6 peer", "::ffff:10.1.0.9", "proxy", "sub-alice", None, "alice", NAMED),
    # spoofs: an address not trusted, or a key of a client that may not forward
    ("untrusted address", "10.2.0.1", "proxy", "sub-alice", None, "proxy", IGNORED),
    ("loopback outside the /32", "127.0.0.2", "proxy", "sub-alice", None, "proxy", IGNORED),
    ("IPv6 loopback not listed", "::1", "proxy", "sub-alice", None, "proxy", IGNORED),
    ("no peer (a Unix socket)", None, "proxy", "sub-alice", None, "proxy", IGNORED),
    ("peer not an address", "localhost", "proxy", "sub-alice", None, "proxy", IGNORED),
    ("trusted address, not a forwarder", "127.0.0.1", "bob", "sub-alice", None, "bob", IGNORED),
    ("anonymous key", "127.0.0.1", "anonymous", "sub-alice", None, "anonymous", IGNORED),
    ("bad percent-encoding", "127.0.0.1", "proxy", "%ff%fe", None, "proxy", IGNORED),
]  # fmt: skip


@pytest.mark.parametrize(
    "peer,name,user_id,email,expected,outcome", [c[1:] for c in RULE], ids=[c[0] for c in RULE]
)
def test_the_trust_rule(
    tenants: Tenants,
    peer: str | None,
    name: str,
    user_id: str | None,
    email: str | None,
    expected: str,
    outcome: Forwarded,
) -> None:
    assert tenants.forwarding.active
    assert tenants.forwarding.resolve(peer, name, user_id, email) == (expected, outcome)
    assert expected in tenants.clients  # a name the middleware can look up


def test_no_trusted_forwarders_no_forwarding(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(GOOD + '\n[[clients]]\nname = "a"\nkey_env = "ALICE_KEY"\n')
    tenants = Tenants(config.load(str(path), ENV))
    assert not tenants.forwarding.active  # the middleware reads no header at all


def _without(line: str) -> str:
    return CLIENTS.replace(line + "\n", "")


# (case id, config text after GOOD, the one-line error must contain)
REFUSED = [
    (
        "a forwarder without trusted addresses",
        _without('trusted_forwarders = ["10.1.0.0/16", "127.0.0.1/32", "fd00::/8"]'),
        "clients.forwards_identity: set auth.trusted_forwarders",
    ),
    (
        "trusted addresses without a forwarder",
        _without("forwards_identity = true"),
        "auth.trusted_forwarders: no client has forwards_identity = true",
    ),
    (
        "host bits set",
        CLIENTS.replace('"10.1.0.0/16"', '"10.1.0.1/16"'),
        "auth.trusted_forwarders[0]: must be an IP network",
    ),
    (
        "not an address",
        CLIENTS.replace('"10.1.0.0/16"', '"gateway.internal"'),
        "auth.trusted_forwarders[0]: must be an IP network",
    ),
    (
        "one email, two clients",
        CLIENTS.replace('["bob@example.com"]', '["ALICE@example.com"]'),
        "clients.forwarded_emails: 'alice@example.com' names both 'alice' and 'bob'",
    ),
    (
        "one id, two clients",
        CLIENTS + '\n[[clients]]\nname = "c"\nkey_sha256 = "' + "ab" * 32 + '"\n'
        'forwarded_ids = ["sub-alice"]\n',
        "clients.forwarded_ids: 'sub-alice' names both 'alice' and 'c'",
    ),
    (
        "a space in an id",
        CLIENTS.replace('"sub-alice"', '"sub alice"'),
        "clients[1].forwarded_ids[0]: must be 1 to 256 printable ASCII characters",
    ),
]


@pytest.mark.parametrize("text,expected", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(GOOD + text)
    with pytest.raises(config.ConfigError) as info:
        config.load(str(path), ENV)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    assert expected in message, message
