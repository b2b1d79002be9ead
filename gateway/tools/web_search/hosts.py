"""A result URL's host and path as a browser reads them, for the web search domain filters.

A filter must judge the host a client's browser would go to, not what ``urllib.parse``
makes of the URL: the two differ, and each difference lets a result past a filter. The
WHATWG URL Standard's facts for the special schemes (``http``, ``https``) this relies on:

- Leading and trailing C0 controls and spaces are stripped; tab, LF and CR are removed
  anywhere. The scheme is case-insensitive.
- After ``scheme:`` any run of ``/`` and ``\\`` is skipped. The authority ends at the first
  ``/``, ``\\``, ``?`` or ``#`` (a backslash is a path separator: ``https://evil.com\\@a.com/``
  is the host ``evil.com``, where ``urlsplit`` says ``a.com``); the user info ends at the
  authority's last ``@``; the port follows a ``:`` outside brackets (digits only, at most
  65535).
- A host in brackets is an IPv6 address. Any other host is percent-decoded, read as UTF-8,
  and put through UTS #46 ToASCII (non-transitional, CheckHyphens and UseSTD3ASCIIRules
  off, VerifyDnsLength off): mapped (lower case, full-width forms, the ideographic and
  full-width full stops U+3002, U+FF0E, U+FF61 become ``.``), each non-ASCII label
  Punycode-encoded with ``xn--``; an ``xn--`` label must decode to a valid, non-ASCII label.
  A host holding a forbidden code point (controls, space, ``#%/:<>?@[\\]^|``) fails.
- A host whose last label is a number (decimal, ``0x`` hex) is an IPv4 address, each of at
  most four parts decimal, octal (a leading ``0``) or hex: ``0x7f.1`` is ``127.0.0.1``.
- The path's ``\\`` are ``/``; its ``.`` and ``..`` segments (also written ``%2e``) are
  resolved. A browser sends ``%62`` as it is, but a server reads it as ``b`` (RFC 3986
  6.2.2.2: an escaped unreserved character is that character), so the filters compare
  paths with those escapes decoded (:func:`normal_path`, for entries too).

A browser keeps a host's trailing dot; the filters compare without it (``a.com.`` is the
DNS name ``a.com``). The UTS #46 mapping is the ``idna`` package's table (aiohttp's yarl
depends on it); bidi and joiner checks are left out: a host they would refuse cannot be
visited, and it is still compared in the same one form. Everything is bounded by the input's
length (a host of more than :data:`_MAX_HOST` characters fails). Pure.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from urllib.parse import unquote_to_bytes

import idna

__all__ = ["canonical_host", "host_and_path", "normal_path"]

_MAX_HOST = 1024  # characters of a host looked at; DNS names are at most 253
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
_STRIPPED = "".join(map(chr, range(0x21)))  # C0 controls and space
_REMOVED = str.maketrans("", "", "\t\n\r")
_FORBIDDEN = re.compile(r"[\x00-\x20#%/:<>?@\[\\\]^|\x7f]")
_DOTS = re.compile("[\u3002\uff0e\uff61]")
_ESCAPE = re.compile("%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_SINGLE_DOT = frozenset({".", "%2e"})
_DOUBLE_DOT = frozenset({"..", ".%2e", "%2e.", "%2e%2e"})


def host_and_path(url: str) -> tuple[str, str] | None:
    """(the canonical host, the path) of an ``http(s)`` URL, or None where a browser would
    not parse it (or it is another scheme)."""
    url = url.strip(_STRIPPED).translate(_REMOVED)
    scheme = _SCHEME.match(url)
    if scheme is None or scheme.group(1).lower() not in ("http", "https"):
        return None
    rest = url[scheme.end() :].lstrip("/\\")
    end = len(rest)
    for stop in "/\\?#":
        at = rest.find(stop, 0, end)
        if at >= 0:
            end = at
    authority = rest[:end]
    hostport = authority[authority.rfind("@") + 1 :]
    host = _host_without_port(hostport)
    if host is None:
        return None
    canonical = canonical_host(host)
    if canonical is None:
        return None
    path_end = len(rest)
    for stop in "?#":
        at = rest.find(stop, end, path_end)
        if at >= 0:
            path_end = at
    return canonical, _path(rest[end:path_end])


def _host_without_port(hostport: str) -> str | None:
    close = hostport.rfind("]") if hostport.startswith("[") else -1
    colon = hostport.find(":", close + 1)
    if colon < 0:
        return hostport
    port = hostport[colon + 1 :]
    if port and (
        not port.isascii() or not port.isdigit() or len(port.lstrip("0")) > 5 or int(port) > 65535
    ):
        return None
    return hostport[:colon]


def canonical_host(host: str) -> str | None:
    """``host`` (a URL's host, or a filter entry's) in the one form the filters compare:
    ASCII, lower case, A-labels, IPv4 dotted decimal, IPv6 compressed in brackets, no
    trailing dot; None where a browser would fail to parse it."""
    if not host or len(host) > _MAX_HOST:
        return None
    if host.startswith("["):
        if not host.endswith("]") or "%" in host:
            return None
        try:
            return f"[{ipaddress.IPv6Address(host[1:-1]).compressed}]"
        except ValueError:
            return None
    try:
        decoded = unquote_to_bytes(host).decode("utf-8")
    except UnicodeDecodeError:
        return None
    ascii_host = _to_ascii(decoded)
    if ascii_host is None or _FORBIDDEN.search(ascii_host):
        return None
    if _ends_in_a_number(ascii_host):
        return _ipv4(ascii_host)
    return ascii_host.rstrip(".") or None


def _to_ascii(domain: str) -> str | None:
    """UTS #46 ToASCII, as the module docstring says."""
    if domain.isascii():
        mapped = domain.lower()
    else:
        try:
            mapped = idna.uts46_remap(_DOTS.sub(".", domain), std3_rules=False, transitional=False)
        except (idna.IDNAError, ValueError):
            return None
    labels = mapped.split(".")
    for i, label in enumerate(labels):
        if label.startswith("xn--"):
            if not _valid_a_label(label):
                return None
        elif not label.isascii():
            try:
                labels[i] = "xn--" + label.encode("punycode").decode("ascii")
            except UnicodeError:
                return None
    return ".".join(labels)


def _valid_a_label(label: str) -> bool:
    """An ``xn--`` label decodes to a non-ASCII label in its mapped form that encodes back
    to it (one spelling per label)."""
    if not label.isascii() or len(label) > 4 * 63:
        return False
    try:
        decoded = label[4:].encode("ascii").decode("punycode")
        if (
            not decoded
            or decoded.isascii()
            or unicodedata.normalize("NFC", decoded) != decoded
            or idna.uts46_remap(decoded, std3_rules=False, transitional=False) != decoded
        ):
            return False
        return "xn--" + decoded.encode("punycode").decode("ascii") == label
    except (UnicodeError, idna.IDNAError, ValueError):
        return False


def _ends_in_a_number(host: str) -> bool:
    labels = host.split(".")
    if labels[-1] == "" and len(labels) > 1:
        labels.pop()
    last = labels[-1]
    if last.isdigit():
        return True
    return last[:2] in ("0x", "0X") and all(c in "0123456789abcdefABCDEF" for c in last[2:])


def _ipv4(host: str) -> str | None:
    """The WHATWG IPv4 parser: None for a host that ends in a number but is no address."""
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    if len(parts) > 4:
        return None
    numbers: list[int] = []
    for part in parts:
        number = _ipv4_number(part)
        if number is None:
            return None
        numbers.append(number)
    if any(n > 255 for n in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(numbers)):
        return None
    address = numbers[-1] + sum(n * 256 ** (3 - i) for i, n in enumerate(numbers[:-1]))
    return str(ipaddress.IPv4Address(address))


def _ipv4_number(part: str) -> int | None:
    if not part or not part.isascii():
        return None
    base = 10
    if part[:2] in ("0x", "0X"):
        part, base = part[2:], 16
    elif len(part) > 1 and part[0] == "0":
        part, base = part[1:], 8
    if not part:
        return 0
    if len(part) > 32:  # bounded: far past any address
        return None
    try:
        return int(part, base)
    except ValueError:
        return None


def normal_path(path: str) -> str:
    """``path`` with its escaped unreserved characters decoded, other escapes upper case."""
    return _ESCAPE.sub(_unescape, path) if "%" in path else path


def _unescape(escape: re.Match[str]) -> str:
    char = chr(int(escape.group(1), 16))
    return char if char in _UNRESERVED else escape.group(0).upper()


def _path(raw: str) -> str:
    """The path as a browser resolves it (``\\`` as ``/``, dot segments removed), its
    escaped unreserved characters decoded."""
    raw = normal_path(raw)
    segments = raw.replace("\\", "/").split("/")[1:] if raw else [""]
    out: list[str] = []
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        lowered = segment.lower()
        if lowered in _DOUBLE_DOT:
            if out:
                out.pop()
            if last:
                out.append("")
        elif lowered in _SINGLE_DOT:
            if last:
                out.append("")
        else:
            out.append(segment)
    return "/" + "/".join(out)
