"""One fetch of a URL the model asked for, safe against the network the gateway stands in.

A fetch is a GET of an ``http(s)://`` URL, its redirects followed by hand. Each hop:

1. the URL is checked (:func:`check_url`): at most ``max_url_chars``, ``http`` or ``https``, a
   host, no userinfo, a valid port, nothing that would break a request line;
2. its host is resolved once (``getaddrinfo`` in the fetcher's own threads, the wait bounded
   by ``connect_timeout``; an IP literal is not resolved) and every address checked
   (:mod:`.addresses`): one refused address refuses the hop, a mix of public and private
   answers included (a rebinding attacker's DNS sends both);
3. the connection goes to the checked addresses and nowhere else: the hop's session resolves
   the host through a resolver that knows only those addresses (no second lookup, so DNS
   that changes its answer between lookups cannot move the connection), while the ``Host``
   header, TLS SNI and the certificate check keep the name;
4. a redirect's target (``Location`` joined to the hop's URL) is a new hop, checked from
   scratch; ``max_redirects`` hops past the first, the next is refused.

A caller's ``allow`` (the tool's domain filters) is asked about each hop's URL before its
name is resolved: a URL it refuses is ``url_not_allowed`` and never requested, a redirect's
target included.

Each hop has its own session and connector (``force_close``: no connection outlives its hop,
no pool another fetch could pick a connection from), no cookie jar (a cookie set by one site
is never sent on), no proxy from the environment (``trust_env=False``) and aiohttp's
decompression off: the body is inflated here (:mod:`.inflate`) under ``max_body_bytes``, the
wire bytes under ``max_wire_bytes`` (a ``Content-Length`` past it is refused before a byte is
read). The whole fetch, redirects included, takes at most ``timeout`` seconds (a slow drip
ends there); at most ``max_concurrent`` fetches run at once per :class:`Fetcher`, a fetch
finding none free waits at most ``queue_timeout`` seconds. Cancelling the caller cancels the
fetch; the hop's session closes its connection on the way out.

Outcomes -> the API's ``web_fetch_tool_result_error`` codes (:class:`FetchRefused`): a URL
that is not one -> ``invalid_tool_input``; too long -> ``url_too_long``; an address that is
refused, one of the gateway's own ports, a name that does not resolve, a connection or TLS
failure, a timeout, too many redirects, a status other than 2xx/3xx/429 ->
``url_not_accessible``; HTTP 429 or no free slot -> ``too_many_requests``; a media type that
is not text, HTML or PDF -> ``unsupported_content_type``; a body past a cap ->
``content_too_large``. ``reason`` is one short fixed word for the log (its rate limit keys on
it), never an address, a host or the site's text.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from gateway.tools.web_fetch import addresses, inflate

__all__ = [
    "HTML_TYPES",
    "PDF_TYPES",
    "TEXT_TYPES",
    "FetchPolicy",
    "FetchRefused",
    "Fetched",
    "Fetcher",
    "Resolve",
    "check_url",
]

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
PDF_TYPES = frozenset({"application/pdf"})
TEXT_TYPES = frozenset(
    {
        "text/plain",
        "text/markdown",
        "text/x-markdown",
        "text/csv",
        "text/xml",
        "application/xml",
        "application/json",
    }
)
_SUPPORTED = HTML_TYPES | PDF_TYPES | TEXT_TYPES
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_MAX_ADDRESSES = 16  # addresses of one name handed to the connector (all are checked)
_CHUNK = 64 * 1024
_MAX_HEADERS = 100  # header lines of a response, at most (with max_header_bytes: its head)
_MAX_LOCATION = 8192  # a Location header longer than this is not followed
# what a URL may not hold: controls, spaces and the characters that hide or break a line
_BAD_URL = re.compile(
    "[\x00-\x20\x7f-\xa0\u1680\u2000-\u200f\u2028-\u202f\u205f-\u206f\u3000\ufeff]"
)
_ACCEPT = (
    "text/html,application/xhtml+xml,text/plain;q=0.9,text/markdown;q=0.9,"
    "application/pdf;q=0.8,*/*;q=0.1"
)

# An injected resolver for tests: (host, port) -> the addresses it resolves to
Resolve = Callable[[str, int], Awaitable[Sequence[str]]]


@dataclass(frozen=True, slots=True)
class FetchPolicy:
    """What a fetch may reach and how much of it (see the module docstring)."""

    # the only way to open a refused range (a /32 or /128 also opens a protected pair on it)
    allowed_networks: tuple[addresses.Network, ...] = ()
    # (ip, port) of the gateway's own listeners and its upstreams
    protected: frozenset[tuple[str, int]] = frozenset()
    timeout: float = 20.0  # one fetch, all in (redirects included)
    connect_timeout: float = 5.0  # resolving a name; connecting (TLS included) to it
    max_redirects: int = 5
    max_wire_bytes: int = 10 * 1024 * 1024  # read off the socket (compressed)
    max_body_bytes: int = 10 * 1024 * 1024  # after Content-Encoding is undone
    max_url_chars: int = 2048
    user_agent: str = "llm-gateway-web-fetch/1.0"
    queue_timeout: float = 5.0  # waiting for a free slot, at most; then too_many_requests
    # headers past these are a failed fetch (aiohttp's defaults are 8190 bytes a line)
    max_header_bytes: int = 16 * 1024


@dataclass(frozen=True, slots=True)
class Fetched:
    """A fetched body, the Content-Encoding undone."""

    url: str  # the final URL (after redirects)
    media_type: str  # lower-case, without parameters: "text/html", "application/pdf"
    charset: str | None  # the Content-Type's charset parameter, lower-case, if any
    body: bytes
    redirects: int = field(default=0)  # hops followed to reach ``url``

    @property
    def kind(self) -> str:
        """``"html"``, ``"pdf"`` or ``"text"``: which extraction the body needs."""
        if self.media_type in HTML_TYPES:
            return "html"
        if self.media_type in PDF_TYPES:
            return "pdf"
        return "text"


class FetchRefused(Exception):
    """A fetch that did not happen or did not finish: ``code`` is the API's error code,
    ``reason`` one fixed word for the log (never an address, a host or a site's text),
    ``status`` the site's HTTP status where one answered."""

    def __init__(self, code: str, reason: str, status: int | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.reason = reason
        self.status = status

    def __repr__(self) -> str:
        return f"FetchRefused({self.code!r}, {self.reason!r}, status={self.status!r})"


def check_url(url: Any, policy: FetchPolicy) -> URL:
    """``url`` as a URL a hop may request, or FetchRefused (``url_too_long``,
    ``invalid_tool_input``). The length is checked before anything else."""
    if not isinstance(url, str) or not url:
        raise FetchRefused("invalid_tool_input", "not_a_url")
    if len(url) > policy.max_url_chars:
        raise FetchRefused("url_too_long", "url_too_long")
    if _BAD_URL.search(url) or not url.lower().startswith(("http://", "https://")):
        raise FetchRefused("invalid_tool_input", "bad_url")
    try:
        parsed = URL(url)
        host = parsed.raw_host
        port = parsed.port
    except (ValueError, UnicodeError):
        raise FetchRefused("invalid_tool_input", "bad_url") from None
    if parsed.scheme not in ("http", "https") or not host or port is None:
        raise FetchRefused("invalid_tool_input", "bad_url")
    if parsed.raw_user is not None or parsed.raw_password is not None:
        raise FetchRefused("invalid_tool_input", "userinfo")
    if not 0 < port < 65536:
        raise FetchRefused("invalid_tool_input", "bad_port")
    if _looks_like_ip(host) and _literal(host) is None:
        # aiohttp connects to a host of digits and dots (or with a colon) without asking
        # the resolver, so the connection would not be pinned to the checked address:
        # only canonical literals pass (2130706433, 127.000.000.001, 1.2.3.4.5 do not)
        raise FetchRefused("invalid_tool_input", "ip_form")
    return parsed.with_fragment(None)


def _looks_like_ip(host: str) -> bool:
    """aiohttp's test (``helpers.is_ip_address``) for a host it will not resolve."""
    return ":" in host or host.replace(".", "").isdigit()


def _literal(host: str) -> addresses.Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


class _SystemResolver:
    """getaddrinfo in threads of the fetcher's own (a lookup that hangs holds one of
    them, not one of the loop's default executor, which other work of the gateway uses);
    a lookup the fetch stopped waiting for still ends in its thread, at most ``workers``
    of them at once."""

    __slots__ = ("_pool", "_workers")

    def __init__(self, workers: int) -> None:
        self._workers = workers
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    async def __call__(self, host: str, port: int) -> list[str]:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self._workers, thread_name_prefix="web-fetch-dns"
            )
        infos = await asyncio.get_running_loop().run_in_executor(
            self._pool,
            functools.partial(
                socket.getaddrinfo, host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            ),
        )
        return [str(info[4][0]) for info in infos]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


class _Pinned(AbstractResolver):
    """Resolves one host to the addresses checked for it, and nothing else."""

    def __init__(self, host: str, port: int, found: list[addresses.Address]) -> None:
        self._host = host
        self._port = port
        self._found = found

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host != self._host or port != self._port:
            raise OSError("host not pinned")  # fail closed: no lookup of anything else
        return [
            ResolveResult(
                hostname=host,
                host=str(a),
                port=port,
                family=socket.AF_INET if a.version == 4 else socket.AF_INET6,
                proto=socket.IPPROTO_TCP,
                flags=socket.AI_NUMERICHOST,
            )
            for a in self._found
        ]

    async def close(self) -> None:
        return None


class Fetcher:
    """Fetches URLs under one :class:`FetchPolicy` (see the module docstring)."""

    __slots__ = ("_policy", "_resolve", "_slots", "_system")

    def __init__(
        self,
        policy: FetchPolicy,
        *,
        resolver: Resolve | None = None,
        max_concurrent: int = 8,
    ) -> None:
        self._policy = policy
        self._system: _SystemResolver | None = None
        if resolver is None:
            self._system = resolver = _SystemResolver(max_concurrent)
        self._resolve: Resolve = resolver
        self._slots = asyncio.Semaphore(max_concurrent)

    @property
    def policy(self) -> FetchPolicy:
        return self._policy

    async def close(self) -> None:
        """Stops the lookup threads (each hop's session is closed with its hop)."""
        if self._system is not None:
            self._system.close()

    async def fetch(self, url: str, allow: Callable[[URL], bool] | None = None) -> Fetched:
        """The body at ``url`` (redirects followed); raises FetchRefused. ``allow``, if
        given, is asked about each hop's URL before the hop (False: ``url_not_allowed``)."""
        policy = self._policy
        target = check_url(url, policy)
        if allow is not None and not allow(target):
            raise FetchRefused("url_not_allowed", "domain_filter")
        try:
            async with asyncio.timeout(policy.queue_timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise FetchRefused("too_many_requests", "busy") from None
        try:
            async with asyncio.timeout(policy.timeout):
                return await self._follow(target, allow)
        except TimeoutError:
            raise FetchRefused("url_not_accessible", "timeout") from None
        finally:
            self._slots.release()

    async def _follow(self, target: URL, allow: Callable[[URL], bool] | None) -> Fetched:
        policy = self._policy
        for hop in range(policy.max_redirects + 1):
            if hop and allow is not None and not allow(target):
                raise FetchRefused("url_not_allowed", "redirect_off_domains")
            found = await self._addresses(target)
            result = await self._hop(target, found, hop)
            if isinstance(result, Fetched):
                return result
            try:
                target = check_url(str(result), policy)
            except FetchRefused:
                # the site chose this URL, not the model: whatever is wrong with it (too
                # long, not http, userinfo), the page is not accessible
                raise FetchRefused("url_not_accessible", "bad_redirect") from None
        raise FetchRefused("url_not_accessible", "too_many_redirects")

    async def _addresses(self, target: URL) -> list[addresses.Address]:
        """The checked addresses of the target's host (resolved once), or FetchRefused."""
        policy = self._policy
        host = target.raw_host
        port = target.port
        assert host is not None and port is not None
        literal = _literal(host)
        if literal is not None:
            found = [literal]
        else:
            try:
                async with asyncio.timeout(policy.connect_timeout):
                    answer = await self._resolve(host, port)
            except TimeoutError:
                raise FetchRefused("url_not_accessible", "dns_timeout") from None
            except (OSError, UnicodeError, ValueError):
                raise FetchRefused("url_not_accessible", "dns_failed") from None
            found = []
            for text in answer:
                address = _literal(str(text))
                if address is None:
                    raise FetchRefused("url_not_accessible", "dns_failed")
                if address not in found:
                    found.append(address)
            if not found:
                raise FetchRefused("url_not_accessible", "dns_failed")
        allowed = policy.allowed_networks
        for address in found:
            if addresses.is_refused(address, allowed):
                raise FetchRefused("url_not_accessible", "address_refused")
            if addresses.is_protected(address, port, policy.protected, allowed):
                raise FetchRefused("url_not_accessible", "address_protected")
        return [addresses.unwrap(a) for a in found[:_MAX_ADDRESSES]]

    def _session(self, target: URL, found: list[addresses.Address]) -> aiohttp.ClientSession:
        policy = self._policy
        host = target.raw_host
        port = target.port
        assert host is not None and port is not None
        connector = aiohttp.TCPConnector(
            resolver=_Pinned(host, port, found),
            use_dns_cache=False,
            force_close=True,
            limit=1,
        )
        return aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(
                total=None, connect=policy.connect_timeout, sock_connect=policy.connect_timeout
            ),
            max_line_size=policy.max_header_bytes,
            max_field_size=policy.max_header_bytes,
            max_headers=_MAX_HEADERS,
            headers={
                "User-Agent": policy.user_agent,
                "Accept": _ACCEPT,
                "Accept-Encoding": inflate.ACCEPT_ENCODING,
            },
        )

    async def _hop(self, target: URL, found: list[addresses.Address], hop: int) -> Fetched | URL:
        """One request: the Fetched body, or the URL a redirect names."""
        status = None
        try:
            async with (
                self._session(target, found) as session,
                session.get(target, allow_redirects=False) as resp,
            ):
                status = resp.status
                if status in _REDIRECTS:
                    location = resp.headers.get("Location")
                    if not location or len(location) > _MAX_LOCATION:
                        raise FetchRefused("url_not_accessible", "bad_redirect", status)
                    try:
                        return resp.url.join(URL(location))
                    except (ValueError, UnicodeError):
                        raise FetchRefused("url_not_accessible", "bad_redirect", status) from None
                if status == 429:
                    raise FetchRefused("too_many_requests", "http_429", status)
                if not 200 <= status < 300:
                    raise FetchRefused("url_not_accessible", f"http_{status // 100}xx", status)
                media_type, charset = _content_type(resp.headers.get("Content-Type"))
                if media_type is not None and media_type not in _SUPPORTED:
                    raise FetchRefused("unsupported_content_type", "media_type", status)
                try:
                    decoder = inflate.decoder(resp.headers.get("Content-Encoding"))
                except inflate.BadEncoding:
                    raise FetchRefused("url_not_accessible", "content_encoding", status) from None
                if (resp.content_length or 0) > self._policy.max_wire_bytes:
                    raise FetchRefused("content_too_large", "content_length", status)
                body = await self._read(resp.content, decoder, status)
        except FetchRefused:
            raise
        except (aiohttp.ClientError, OSError, ValueError, UnicodeError):
            raise FetchRefused("url_not_accessible", "connection_failed", status) from None
        if media_type is None:  # no Content-Type: what the body is, where that is clear
            media_type = _sniff(body)
            if media_type is None:
                raise FetchRefused("unsupported_content_type", "media_type", status)
        return Fetched(str(target), media_type, charset, body, hop)

    async def _read(
        self, content: aiohttp.StreamReader, decoder: inflate.Inflater, status: int
    ) -> bytes:
        policy = self._policy
        cap = policy.max_body_bytes
        out = bytearray()
        wire = 0
        try:
            while chunk := await content.read(_CHUNK):
                wire += len(chunk)
                if wire > policy.max_wire_bytes:
                    raise FetchRefused("content_too_large", "wire_bytes", status)
                out += decoder.feed(chunk, cap - len(out))
                if len(out) > cap:
                    raise FetchRefused("content_too_large", "body_bytes", status)
            out += decoder.flush(cap - len(out))
        except inflate.BadEncoding:
            raise FetchRefused("url_not_accessible", "content_encoding", status) from None
        if len(out) > cap:
            raise FetchRefused("content_too_large", "body_bytes", status)
        return bytes(out)


def _content_type(value: str | None) -> tuple[str | None, str | None]:
    """(media type, charset) of a Content-Type header, lower-case; (None, None) if absent."""
    if not value:
        return None, None
    media, _, rest = value.partition(";")
    media = media.strip().lower()
    charset = None
    for param in rest.split(";"):
        name, _, val = param.partition("=")
        if name.strip().lower() == "charset":
            charset = val.strip().strip('"').strip().lower()[:40] or None
    return (media or None), charset


def _sniff(body: bytes) -> str | None:
    """The media type of a body sent without one: a PDF, HTML or nothing."""
    head = body[:512].lstrip().lower()
    if body.startswith(b"%PDF-"):
        return "application/pdf"
    if head.startswith((b"<!doctype html", b"<html")):
        return "text/html"
    return None
