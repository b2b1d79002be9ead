"""Which addresses a fetch may connect to: the public Internet, and what the operator opens.

An address is refused when it is not globally routable or stands for one that is not: the
IPv4 special-purpose ranges (RFC 6890 and its updates: "this network" 0/8, private 10/8,
172.16/12, 192.168/16, carrier-grade NAT 100.64/10, loopback 127/8, link-local 169.254/16 with
the cloud metadata services, IETF protocol assignments 192.0.0/24, the documentation ranges,
benchmarking 198.18/15, 6to4 relay anycast 192.88.99/24, multicast 224/4, reserved 240/4 and
broadcast), and in IPv6 the unspecified and loopback addresses, IPv4-compatible (::/96) and
other ::/8 forms, discard-only 100::/64, the IETF protocol block 2001::/23 (Teredo 2001::/32
with it), ORCHID, documentation (2001:db8::/32, 3fff::/20), unique local fc00::/7, site-local
fec0::/10, link-local fe80::/10 and multicast ff00::/8. An IPv6 address that carries an IPv4
one the network delivers to (IPv4-mapped ::ffff:0:0/96, 6to4 2002::/16, the NAT64 well-known
prefix 64:ff9b::/96) is judged by that IPv4 address; the local-use NAT64 prefix 64:ff9b:1::/48
is refused. The table is the module's own, not only :attr:`ipaddress.IPv4Address.is_global`,
whose ranges moved between Python releases; ``is_global`` is consulted as well, so a range
Python learns about later is refused too.

``allowed_networks`` (the operator's ``[web_fetch] allowed_networks``) is the only way to open
a refused range: an address inside one of them is allowed whatever it is. The gateway's own
listeners and its upstreams (``protected``, ``(ip, port)`` pairs) are refused even inside an
allowed network, unless the operator lists that very address (a ``/32`` or ``/128``): opening
``127.0.0.0/8`` for a page server on the same host does not open the gateway's own port. A
protected pair with an unspecified address (a listener on ``0.0.0.0`` or ``::``) answers on every
address of the host, which the gateway cannot enumerate: its port is refused on every address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

__all__ = ["Address", "Network", "embedded_ipv4", "is_protected", "is_refused", "unwrap"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

# (network, what it is): every range here is refused unless an allowed network holds it
REFUSED_V4: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("0.0.0.0/8"), "this network"),
    (_V4("10.0.0.0/8"), "private"),
    (_V4("100.64.0.0/10"), "carrier-grade NAT"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("169.254.0.0/16"), "link-local, cloud metadata"),
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.0.0.0/24"), "IETF protocol assignments"),
    (_V4("192.0.2.0/24"), "documentation"),
    (_V4("192.31.196.0/24"), "AS112"),
    (_V4("192.52.193.0/24"), "AMT"),
    (_V4("192.88.99.0/24"), "6to4 relay anycast"),
    (_V4("192.168.0.0/16"), "private"),
    (_V4("192.175.48.0/24"), "AS112 direct delegation"),
    (_V4("198.18.0.0/15"), "benchmarking"),
    (_V4("198.51.100.0/24"), "documentation"),
    (_V4("203.0.113.0/24"), "documentation"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("240.0.0.0/4"), "reserved, broadcast"),
)
REFUSED_V6: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("::/8"), "unspecified, loopback, IPv4-compatible, reserved"),
    (_V6("64:ff9b:1::/48"), "local-use NAT64"),
    (_V6("100::/64"), "discard-only"),
    (_V6("2001::/23"), "IETF protocol assignments, Teredo"),
    (_V6("2001:db8::/32"), "documentation"),
    (_V6("2002::/16"), "6to4 (judged by its IPv4 address)"),
    (_V6("3fff::/20"), "documentation"),
    (_V6("5f00::/16"), "segment routing SIDs"),
    (_V6("fc00::/7"), "unique local"),
    (_V6("fe80::/10"), "link-local"),
    (_V6("fec0::/10"), "site-local"),
    (_V6("ff00::/8"), "multicast"),
)
_NAT64 = _V6("64:ff9b::/96")
_MAPPED = _V6("::ffff:0:0/96")
_SIX_TO_FOUR = _V6("2002::/16")


def unwrap(address: Address) -> Address:
    """``address`` without a scope id (``fe80::1%eth0`` is ``fe80::1`` to the tables)."""
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None:
        return ipaddress.IPv6Address(int(address))
    return address


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one delivers to, where it carries one: IPv4-mapped
    (``::ffff:a.b.c.d``), 6to4 (``2002:AABB:CCDD::/48``), NAT64 (``64:ff9b::a.b.c.d``)."""
    if address in _MAPPED:
        return address.ipv4_mapped
    if address in _SIX_TO_FOUR:
        return address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _allowed(address: Address, allowed: Iterable[Network]) -> bool:
    return any(address.version == net.version and address in net for net in allowed)


def _special(address: Address) -> bool:
    """True for an address of a refused range (the tables, or Python's ``is_global``)."""
    if isinstance(address, ipaddress.IPv4Address):
        if any(address in net for net, _ in REFUSED_V4):
            return True
    else:
        inner = embedded_ipv4(address)
        if inner is not None:
            return _special(inner)
        if any(address in net for net, _ in REFUSED_V6):
            return True
    return not address.is_global or address.is_multicast


def is_refused(address: Address, allowed: Iterable[Network] = ()) -> bool:
    """True when a fetch may not connect to ``address`` (see the module docstring)."""
    address = unwrap(address)
    allowed = tuple(allowed)
    if _allowed(address, allowed):
        return False
    if isinstance(address, ipaddress.IPv6Address):
        inner = embedded_ipv4(address)
        if inner is not None and _allowed(inner, allowed):
            return False
    return _special(address)


def is_protected(
    address: Address,
    port: int,
    protected: Iterable[tuple[str, int]],
    allowed: Iterable[Network] = (),
) -> bool:
    """True when ``(address, port)`` is one of the gateway's own listeners or upstreams and
    the operator did not list that very address (see the module docstring)."""
    address = unwrap(address)
    if isinstance(address, ipaddress.IPv6Address):
        address = embedded_ipv4(address) if address in _MAPPED else address  # type: ignore[assignment]
    hit = False
    for host, guarded in protected:
        if guarded != port:
            continue
        try:
            other = unwrap(ipaddress.ip_address(host))
        except ValueError:
            continue
        if other.is_unspecified or other == address:
            hit = True
            break
    if not hit:
        return False
    return not any(
        net.prefixlen == net.max_prefixlen and address.version == net.version and address in net
        for net in allowed
    )
