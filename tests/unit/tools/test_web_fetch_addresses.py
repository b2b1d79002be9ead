"""Which addresses a web fetch may connect to (gateway/tools/web_fetch/addresses.py).

Public addresses only, unless the operator opened a range (``allowed_networks``); an IPv6
address that carries an IPv4 one (mapped, 6to4, NAT64) is judged by that address; the
gateway's own listeners and upstreams (``protected``) stay shut inside an opened range unless
that very address is listed.
"""

from __future__ import annotations

import ipaddress

import pytest

from gateway.tools.web_fetch.addresses import embedded_ipv4, is_protected, is_refused

REFUSED = [
    ("0.0.0.0", "unspecified"),
    ("0.1.2.3", "this network"),
    ("10.0.0.1", "private"),
    ("10.255.255.255", "private"),
    ("100.64.0.1", "carrier-grade NAT"),
    ("100.127.255.254", "carrier-grade NAT"),
    ("127.0.0.1", "loopback"),
    ("127.1.2.3", "loopback"),
    ("169.254.169.254", "cloud metadata"),
    ("169.254.0.1", "link-local"),
    ("172.16.0.1", "private"),
    ("172.31.255.255", "private"),
    ("192.0.0.1", "IETF protocol assignments"),
    ("192.0.0.170", "NAT64 discovery"),
    ("192.0.2.1", "TEST-NET-1"),
    ("192.88.99.1", "6to4 relay"),
    ("192.168.1.1", "private"),
    ("198.18.0.1", "benchmarking"),
    ("198.19.255.255", "benchmarking"),
    ("198.51.100.7", "TEST-NET-2"),
    ("203.0.113.9", "TEST-NET-3"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast (SSDP)"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "broadcast"),
    ("::", "IPv6 unspecified"),
    ("::1", "IPv6 loopback"),
    ("::127.0.0.1", "IPv4-compatible loopback"),
    ("::8.8.8.8", "IPv4-compatible (deprecated) even of a public address"),
    ("::ffff:127.0.0.1", "IPv4-mapped loopback"),
    ("::ffff:169.254.169.254", "IPv4-mapped metadata"),
    ("::ffff:10.0.0.1", "IPv4-mapped private"),
    ("::ffff:7f00:1", "IPv4-mapped loopback, hex form"),
    ("2002:7f00:1::", "6to4 of loopback"),
    ("2002:a9fe:a9fe::1", "6to4 of metadata"),
    ("2002:c0a8:101::1", "6to4 of private"),
    ("64:ff9b::127.0.0.1", "NAT64 of loopback"),
    ("64:ff9b::a9fe:a9fe", "NAT64 of metadata"),
    ("64:ff9b:1::1", "local-use NAT64"),
    ("100::1", "discard-only"),
    ("2001::1", "Teredo"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo with a server"),
    ("2001:db8::1", "documentation"),
    ("3fff::1", "documentation (RFC 9637)"),
    ("fc00::1", "unique local"),
    ("fd12:3456:789a::1", "unique local"),
    ("fe80::1", "link-local"),
    ("fe80::1%eth0", "link-local with a scope"),
    ("fec0::1", "site-local"),
    ("ff02::1", "multicast"),
    ("ff0e::1", "global-scope multicast"),
    ("fd00:ec2::254", "AWS metadata over IPv6"),
]
PUBLIC = [
    ("8.8.8.8", "public"),
    ("1.1.1.1", "public"),
    ("93.184.215.14", "public"),
    ("100.63.255.255", "just below CGNAT"),
    ("100.128.0.0", "just above CGNAT"),
    ("172.15.255.255", "just below 172.16/12"),
    ("172.32.0.0", "just above 172.16/12"),
    ("198.17.255.255", "just below benchmarking"),
    ("198.20.0.0", "just above benchmarking"),
    ("223.255.255.255", "just below multicast"),
    ("2606:4700:4700::1111", "public IPv6"),
    ("2a00:1450:4001::1", "public IPv6"),
    ("::ffff:8.8.8.8", "IPv4-mapped public"),
    ("2002:808:808::1", "6to4 of a public address"),
    ("64:ff9b::808:808", "NAT64 of a public address"),
]


@pytest.mark.parametrize(("text", "what"), REFUSED)
def test_refused_by_default(text: str, what: str) -> None:
    assert is_refused(ipaddress.ip_address(text)), what


@pytest.mark.parametrize(("text", "what"), PUBLIC)
def test_public_allowed(text: str, what: str) -> None:
    assert not is_refused(ipaddress.ip_address(text)), what


LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)


@pytest.mark.parametrize(
    ("text", "allowed", "refused"),
    [
        ("127.0.0.1", LOOPBACK, False),
        ("127.9.9.9", LOOPBACK, False),
        ("::ffff:127.0.0.1", LOOPBACK, False),  # the same IPv4 address, mapped
        ("::1", LOOPBACK, True),  # IPv6 loopback is not in an IPv4 network
        ("10.0.0.1", LOOPBACK, True),
        ("169.254.169.254", LOOPBACK, True),
        ("10.1.2.3", (ipaddress.ip_network("10.1.0.0/16"),), False),
        ("10.2.0.1", (ipaddress.ip_network("10.1.0.0/16"),), True),
        ("fd00::5", (ipaddress.ip_network("fd00::/8"),), False),
        ("fe80::1%eth0", (ipaddress.ip_network("fe80::/10"),), False),
    ],
)
def test_allowed_networks_open_a_range(text: str, allowed: tuple, refused: bool) -> None:
    assert is_refused(ipaddress.ip_address(text), allowed) is refused


@pytest.mark.parametrize(
    ("text", "inner"),
    [
        ("::ffff:1.2.3.4", "1.2.3.4"),
        ("2002:102:304::1", "1.2.3.4"),
        ("64:ff9b::1.2.3.4", "1.2.3.4"),
        ("2606:4700::1", None),
        ("::1.2.3.4", None),  # IPv4-compatible: refused whole, not unwrapped
    ],
)
def test_embedded_ipv4(text: str, inner: str | None) -> None:
    found = embedded_ipv4(ipaddress.IPv6Address(text))
    assert (str(found) if found else None) == inner


GATEWAY = frozenset({("127.0.0.1", 8080), ("10.0.0.5", 8000), ("0.0.0.0", 9090)})


@pytest.mark.parametrize(
    ("text", "port", "allowed", "protected"),
    [
        ("127.0.0.1", 8080, (), True),
        ("127.0.0.1", 8080, LOOPBACK, True),  # opening the range does not open the gateway
        ("::ffff:127.0.0.1", 8080, LOOPBACK, True),  # nor its IPv4-mapped form
        ("127.0.0.1", 8080, (ipaddress.ip_network("127.0.0.1/32"),), False),  # listed itself
        ("127.0.0.1", 8081, LOOPBACK, False),  # another port
        ("127.0.0.2", 8080, LOOPBACK, False),  # another address
        ("10.0.0.5", 8000, (ipaddress.ip_network("10.0.0.0/8"),), True),  # an upstream
        ("8.8.8.8", 9090, (), True),  # a listener on 0.0.0.0 answers on every address
        ("8.8.8.8", 9091, (), False),
    ],
)
def test_protected_pairs(text: str, port: int, allowed: tuple, protected: bool) -> None:
    assert is_protected(ipaddress.ip_address(text), port, GATEWAY, allowed) is protected
