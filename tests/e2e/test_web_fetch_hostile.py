"""Issue 36's hostile suite: the web fetcher against the network it stands in.

Real HTTP servers on 127.0.0.1 (an aiohttp app, raw asyncio servers for what aiohttp will
not send) and a scripted DNS (an injected resolver: a name that resolves to loopback, to the
metadata address, to 10.x, one whose answer changes between lookups). Loopback is refused
by default, so each server is reachable only with ``allowed_networks=(127.0.0.0/8,)``, or a
single address of it: a test that expects a refusal proves it by the server's hit count
staying 0, a test that expects a fetch by the body.

Protocol and policy facts relied on:

* a name is resolved once per hop; every address is checked and the connection goes to a
  checked one (Linux answers on all of 127/8, so 127.0.0.2 and 127.0.0.1 are two "hosts");
* a redirect is a new hop, checked from scratch; ``max_redirects`` hops past the first;
* codes are the API's ``web_fetch_tool_result_error`` codes: 429 -> ``too_many_requests``,
  an unreachable or refused address, a timeout, a bad status -> ``url_not_accessible``, a
  body past a cap -> ``content_too_large``, a media type that is not text, HTML or PDF ->
  ``unsupported_content_type``.

No wall-clock asserts: the slow servers are bounded by the policy's timeouts, which are
short here, and each waiting loop has a count.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import gzip
import ipaddress
import socket
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace

import pytest
from aiohttp import web
from yarl import URL

from gateway.tools.web_fetch.net import Fetcher, FetchPolicy, FetchRefused

pytestmark = [pytest.mark.e2e]

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)
OPEN = FetchPolicy(allowed_networks=LOOPBACK, timeout=5.0, connect_timeout=2.0)
SECRET = b"internal secret"


class DNS:
    """A scripted resolver: name -> answers (a list per lookup, the last one repeated)."""

    def __init__(self, table: dict[str, Sequence[Sequence[str]] | Exception]) -> None:
        self.table = table
        self.lookups: Counter[str] = Counter()

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.lookups[host] += 1
        answer = self.table.get(host)
        if answer is None:
            raise socket.gaierror(socket.EAI_NONAME, "no such name")
        if isinstance(answer, Exception):
            raise answer
        return answer[min(self.lookups[host], len(answer)) - 1]


@functools.cache
def _bomb() -> bytes:
    """gzip of 1 GiB of zeros: about 1 MiB on the wire (made once)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"\0" * (1 << 20)
    return b"".join(z.compress(block) for _ in range(1024)) + z.flush()


class Site:
    """The test site: its routes, and how often each was asked for."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.seen_headers: list[dict[str, str]] = []
        _bomb()  # made before any fetch's clock runs
        self.port = 0

    def app(self) -> web.Application:
        @web.middleware
        async def count(request: web.Request, handler):  # type: ignore[no-untyped-def]
            self.hits[request.path] += 1
            self.seen_headers.append(dict(request.headers))
            return await handler(request)

        app = web.Application(middlewares=[count])
        r = app.router
        r.add_get("/page", self.page)
        r.add_get("/text", self.fixed(b"plain words", 'Text/Plain; Charset="UTF-8"'))
        r.add_get("/secret", self.fixed(SECRET, "text/plain"))
        r.add_get("/png", self.fixed(b"\x89PNG\r\n", "image/png"))
        r.add_get("/zip", self.octets)
        r.add_get("/untyped", self.untyped)
        r.add_get("/pdf", self.small_pdf)
        r.add_get("/pdf50", self.big_pdf)
        r.add_get("/pdf50-chunked", self.big_pdf)
        r.add_get("/bomb", self.gzip_bomb)
        r.add_get("/gzip", self.gzipped)
        r.add_get("/status/{code}", self.status)
        r.add_get("/loop", self.loop)
        r.add_get("/redirect", self.redirect)
        r.add_get("/cookie", self.cookie)
        return app

    @staticmethod
    def fixed(body: bytes, media_type: str):  # type: ignore[no-untyped-def]
        async def handler(request: web.Request) -> web.Response:
            return web.Response(body=body, headers={"Content-Type": media_type})

        return handler

    async def status(self, request: web.Request) -> web.Response:
        return web.Response(status=int(request.match_info["code"]))

    async def page(self, request: web.Request) -> web.Response:
        html = "<html><title>A page</title><body><p>Hello from the page.</p></body></html>"
        return web.Response(text=html, content_type="text/html")

    async def octets(self, request: web.Request) -> web.Response:
        return web.Response(body=b"PK\x03\x04", content_type="application/octet-stream")

    async def untyped(self, request: web.Request) -> web.Response:
        resp = web.Response(body=b"%PDF-1.4 tiny")
        resp.headers.popall("Content-Type", None)
        resp.content_type = ""  # aiohttp adds application/octet-stream otherwise
        return resp

    async def small_pdf(self, request: web.Request) -> web.Response:
        return web.Response(body=b"%PDF-1.4\n%%EOF\n", content_type="application/pdf")

    async def big_pdf(self, request: web.Request) -> web.StreamResponse:
        """50 MB of PDF, with a Content-Length or chunked; written as it is read."""
        resp = web.StreamResponse(headers={"Content-Type": "application/pdf"})
        if not request.path.endswith("chunked"):
            resp.content_length = 50 * 1000 * 1000
        await resp.prepare(request)
        block = b"%PDF-1.7\n" + b"0" * (1 << 16)
        try:
            for _ in range(50 * 1000 * 1000 // len(block)):
                await resp.write(block)
        except (ConnectionResetError, ConnectionError):
            pass
        return resp

    async def gzip_bomb(self, request: web.Request) -> web.Response:
        return web.Response(
            body=_bomb(), headers={"Content-Type": "text/plain", "Content-Encoding": "gzip"}
        )

    async def gzipped(self, request: web.Request) -> web.Response:
        return web.Response(
            body=gzip.compress(b"inflated words"),
            headers={"Content-Type": "text/plain", "Content-Encoding": "gzip"},
        )

    async def loop(self, request: web.Request) -> web.Response:
        """A redirect to itself, forever (10,000 of them, or as many as a client follows)."""
        n = int(request.query.get("n", "0"))
        if n >= 10_000:
            return web.Response(text="the end", content_type="text/plain")
        raise web.HTTPFound(f"/loop?n={n + 1}")

    async def redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    async def cookie(self, request: web.Request) -> web.Response:
        resp = web.Response(text=request.headers.get("Cookie", "none"), content_type="text/plain")
        resp.set_cookie("session", "abc")
        return resp


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    """The site on 127.0.0.1 and 127.0.0.2 alike (one listener on both, same port)."""
    s = Site()
    runner = web.AppRunner(s.app())
    await runner.setup()
    first = web.TCPSite(runner, "127.0.0.1", 0)
    await first.start()
    s.port = runner.addresses[0][1]
    try:
        yield s
    finally:
        await runner.cleanup()


@pytest.fixture
async def inside() -> AsyncIterator[tuple[Site, Site]]:
    """Two sites on one port: a "public" one on 127.0.0.2, an "internal" one on 127.0.0.1.

    The port is the one the system gives 127.0.0.2; the same number on 127.0.0.1 may be taken
    (another test's listener, a connection's local port), so another pair is tried then."""
    for attempt in range(20):
        public, internal = Site(), Site()
        runners: list[web.AppRunner] = []
        try:
            for host, s in (("127.0.0.2", public), ("127.0.0.1", internal)):
                runner = web.AppRunner(s.app())
                await runner.setup()
                runners.append(runner)
                await web.TCPSite(runner, host, public.port).start()
                s.port = runner.addresses[0][1]
                public.port = s.port
        except OSError as exc:
            for runner in runners:
                await runner.cleanup()
            if exc.errno != errno.EADDRINUSE or attempt == 19:
                raise
            continue
        break
    try:
        yield public, internal
    finally:
        for runner in runners:
            await runner.cleanup()


async def _refused(
    fetcher: Fetcher, url: str, allow: Callable[[URL], bool] | None = None
) -> FetchRefused:
    with pytest.raises(FetchRefused) as refused:
        await fetcher.fetch(url, allow)
    return refused.value


# -- addresses -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "http://10.0.0.1/",
        "http://192.168.1.1/",
        "http://100.64.0.1/",
        "http://0.0.0.0/",
        "http://[::1]/",
        "http://[::ffff:169.254.169.254]/",
        "http://[::ffff:127.0.0.1]/",
        "http://metadata.test/computeMetadata/v1/",
        "http://intranet.test/",
        "http://cgnat.test/",
    ],
)
async def test_metadata_and_private_addresses_refused(url: str) -> None:
    dns = DNS(
        {
            "metadata.test": [["169.254.169.254"]],
            "intranet.test": [["10.1.2.3"]],
            "cgnat.test": [["100.100.100.200"]],
        }
    )
    refused = await _refused(Fetcher(FetchPolicy(), resolver=dns), url)
    assert (refused.code, refused.reason) == ("url_not_accessible", "address_refused")
    assert "169.254" not in repr(refused) and "10.1" not in repr(refused)


async def test_a_name_resolving_to_loopback_is_refused_then_fetched_when_opened(
    site: Site,
) -> None:
    dns = DNS({"local.test": [["127.0.0.1"]]})
    url = f"http://local.test:{site.port}/page"
    refused = await _refused(Fetcher(FetchPolicy(), resolver=dns), url)
    assert refused.code == "url_not_accessible"
    assert site.hits["/page"] == 0
    fetched = await Fetcher(OPEN, resolver=dns).fetch(url)
    assert (fetched.media_type, fetched.kind, fetched.url) == ("text/html", "html", url)
    assert b"Hello from the page." in fetched.body
    assert site.seen_headers[-1]["Host"] == f"local.test:{site.port}"  # the name, not the IP


async def test_a_loopback_literal_is_refused_then_fetched_when_opened(site: Site) -> None:
    url = f"http://127.0.0.1:{site.port}/text"
    refused = await _refused(Fetcher(FetchPolicy()), url)
    assert refused.code == "url_not_accessible"
    assert site.hits["/text"] == 0
    fetched = await Fetcher(OPEN).fetch(url)
    assert (fetched.body, fetched.media_type, fetched.charset) == (
        b"plain words",
        "text/plain",
        "utf-8",
    )


@pytest.mark.parametrize("host", ["localhost", "0x7f.1", "0x7f000001"])
async def test_the_system_resolver_is_checked_too(site: Site, host: str) -> None:
    """No injected DNS: getaddrinfo's answer (/etc/hosts, inet_aton's hex forms) is what is
    checked, and what the connection is pinned to."""
    fetcher = Fetcher(FetchPolicy())
    try:
        refused = await _refused(fetcher, f"http://{host}:{site.port}/secret")
    finally:
        await fetcher.close()
    assert (refused.code, refused.reason) == ("url_not_accessible", "address_refused")
    assert site.hits.total() == 0


async def test_a_hex_loopback_is_fetched_when_opened(site: Site) -> None:
    fetcher = Fetcher(OPEN)
    try:
        fetched = await fetcher.fetch(f"http://0x7f.1:{site.port}/secret")
    finally:
        await fetcher.close()
    assert fetched.body == SECRET
    assert site.seen_headers[-1]["Host"] == f"0x7f.1:{site.port}"


async def test_one_private_address_among_public_ones_refuses_the_name(
    inside: tuple[Site, Site],
) -> None:
    public, internal = inside
    only_public = FetchPolicy(allowed_networks=(ipaddress.ip_network("127.0.0.2/32"),))
    dns = DNS({"mixed.test": [["127.0.0.2", "127.0.0.1"]]})
    refused = await _refused(
        Fetcher(only_public, resolver=dns), f"http://mixed.test:{public.port}/page"
    )
    assert refused.code == "url_not_accessible"
    assert public.hits.total() == internal.hits.total() == 0


async def test_dns_that_changes_between_lookups_is_asked_once(
    inside: tuple[Site, Site],
) -> None:
    """Rebinding: the first answer is the allowed ("public") 127.0.0.2, every later one the
    internal 127.0.0.1. One lookup happens and the connection goes to the checked address:
    the public site answers, the internal one is never asked."""
    public, internal = inside
    only_public = FetchPolicy(allowed_networks=(ipaddress.ip_network("127.0.0.2/32"),))
    dns = DNS({"rebind.test": [["127.0.0.2"], ["127.0.0.1"]]})
    fetcher = Fetcher(only_public, resolver=dns)
    fetched = await fetcher.fetch(f"http://rebind.test:{public.port}/secret")
    assert fetched.body == SECRET  # the same route on both: the hit counts tell them apart
    assert dns.lookups["rebind.test"] == 1
    assert (public.hits["/secret"], internal.hits["/secret"]) == (1, 0)
    # the next fetch looks up again, gets the internal address, and is refused
    refused = await _refused(fetcher, f"http://rebind.test:{public.port}/secret")
    assert refused.code == "url_not_accessible"
    assert dns.lookups["rebind.test"] == 2
    assert internal.hits.total() == 0


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (socket.gaierror(socket.EAI_NONAME, "no such name"), "dns_failed"),
        (OSError("network unreachable"), "dns_failed"),
        ([["not an address"]], "dns_failed"),
        ([[]], "dns_failed"),
    ],
)
async def test_dns_failures_are_not_accessible(answer: object, reason: str) -> None:
    dns = DNS({"broken.test": answer})  # type: ignore[dict-item]
    refused = await _refused(Fetcher(OPEN, resolver=dns), "http://broken.test/")
    assert (refused.code, refused.reason) == ("url_not_accessible", reason)


async def test_dns_that_never_answers_is_bounded() -> None:
    async def hang(host: str, port: int) -> Sequence[str]:
        await asyncio.sleep(3600)
        return []

    policy = replace(OPEN, connect_timeout=0.2)
    refused = await _refused(Fetcher(policy, resolver=hang), "http://slow-dns.test/")
    assert (refused.code, refused.reason) == ("url_not_accessible", "dns_timeout")


# -- the gateway's own ports -----------------------------------------------------------


async def test_protected_pairs_stay_shut_inside_an_opened_range(site: Site) -> None:
    guarded = replace(OPEN, protected=frozenset({("127.0.0.1", site.port)}))
    dns = DNS({"gw.test": [["127.0.0.1"]]})
    for url in (f"http://127.0.0.1:{site.port}/secret", f"http://gw.test:{site.port}/secret"):
        refused = await _refused(Fetcher(guarded, resolver=dns), url)
        assert (refused.code, refused.reason) == ("url_not_accessible", "address_protected")
    assert site.hits.total() == 0
    # a redirect to the gateway's port from an allowed page is refused the same way
    other = replace(OPEN, protected=frozenset({("127.0.0.1", site.port + 1)}))
    assert (await Fetcher(other).fetch(f"http://127.0.0.1:{site.port}/secret")).body == SECRET
    # listing that very address opens it
    listed = replace(guarded, allowed_networks=(ipaddress.ip_network("127.0.0.1/32"),))
    assert (await Fetcher(listed).fetch(f"http://127.0.0.1:{site.port}/secret")).body == SECRET


async def test_a_wildcard_listener_shuts_its_port_on_every_address(site: Site) -> None:
    guarded = replace(OPEN, protected=frozenset({("0.0.0.0", site.port)}))
    refused = await _refused(Fetcher(guarded), f"http://127.0.0.1:{site.port}/secret")
    assert refused.code == "url_not_accessible"
    assert site.hits.total() == 0


# -- redirects -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/", "address_refused"),
        ("http://10.0.0.1/admin", "address_refused"),
        ("http://[::1]/", "address_refused"),
        ("http://internal.test/", "address_refused"),  # a name that resolves to loopback
        ("http://127.0.0.1:{port}/secret", "address_refused"),  # the internal site itself
        ("ftp://127.0.0.2/", "bad_redirect"),
        ("http://user:pw@127.0.0.2:{port}/page", "bad_redirect"),
        ("file:///etc/passwd", "bad_redirect"),
        ("http://2130706433:{port}/secret", "bad_redirect"),  # would not be pinned
    ],
)
async def test_a_redirect_to_a_private_address_is_refused(
    inside: tuple[Site, Site], target: str, reason: str
) -> None:
    public, internal = inside
    only_public = FetchPolicy(allowed_networks=(ipaddress.ip_network("127.0.0.2/32"),))
    dns = DNS({"internal.test": [["127.0.0.1"]]})
    to = target.format(port=public.port)
    url = f"http://127.0.0.2:{public.port}/redirect?to={to}"
    refused = await _refused(Fetcher(only_public, resolver=dns), url)
    assert (refused.code, refused.reason) == ("url_not_accessible", reason)
    assert public.hits["/redirect"] == 1
    assert internal.hits.total() == 0
    assert dns.lookups["internal.test"] == (1 if "internal.test" in target else 0)


@pytest.mark.parametrize(
    ("path", "redirects"),
    [("/redirect?to=http://127.0.0.1:{port}/page", 1), ("/page", 0)],
    ids=["redirect", "first-url"],
)
async def test_a_hop_the_caller_refuses_is_never_requested(
    inside: tuple[Site, Site], path: str, redirects: int
) -> None:
    """``allow`` (the tool's domain filters) is asked before each hop: a redirect to a host
    it refuses is ``url_not_allowed`` and that host sees no request."""
    public, other = inside
    asked: list[str] = []

    def allow(url: object) -> bool:
        asked.append(str(url))
        return str(url).startswith("http://127.0.0.2:")

    host = "127.0.0.2" if redirects else "127.0.0.1"
    url = f"http://{host}:{public.port}" + path.format(port=public.port)
    refused = await _refused(Fetcher(OPEN), url, allow)
    assert refused.code == "url_not_allowed"
    assert other.hits.total() == 0
    assert public.hits["/redirect"] == redirects
    assert len(asked) == redirects + 1 and asked[-1] == f"http://127.0.0.1:{public.port}/page"


async def test_a_redirect_to_an_allowed_page_is_followed(site: Site) -> None:
    fetched = await Fetcher(OPEN).fetch(f"http://127.0.0.1:{site.port}/redirect?to=/page")
    assert fetched.url == f"http://127.0.0.1:{site.port}/page"
    assert fetched.redirects == 1


async def test_ten_thousand_redirects_end_after_max_redirects(site: Site) -> None:
    refused = await _refused(Fetcher(OPEN), f"http://127.0.0.1:{site.port}/loop")
    assert (refused.code, refused.reason) == ("url_not_accessible", "too_many_redirects")
    assert site.hits["/loop"] == OPEN.max_redirects + 1
    fetched = await Fetcher(OPEN).fetch(f"http://127.0.0.1:{site.port}/loop?n=9997")
    assert fetched.body == b"the end"  # three hops are within the limit


# -- sizes, encodings, types -----------------------------------------------------------


async def test_a_gzip_bomb_is_content_too_large(site: Site) -> None:
    refused = await _refused(Fetcher(OPEN), f"http://127.0.0.1:{site.port}/bomb")
    assert (refused.code, refused.reason) == ("content_too_large", "body_bytes")


async def test_gzip_is_undone(site: Site) -> None:
    fetched = await Fetcher(OPEN).fetch(f"http://127.0.0.1:{site.port}/gzip")
    assert fetched.body == b"inflated words"
    assert "gzip" in site.seen_headers[-1]["Accept-Encoding"]


@pytest.mark.parametrize(
    ("path", "reason"),
    [("/pdf50", "content_length"), ("/pdf50-chunked", "wire_bytes")],
)
async def test_a_50_mb_pdf_is_content_too_large(site: Site, path: str, reason: str) -> None:
    refused = await _refused(Fetcher(OPEN), f"http://127.0.0.1:{site.port}{path}")
    assert (refused.code, refused.reason) == ("content_too_large", reason)


async def test_a_pdf_is_fetched_as_bytes(site: Site) -> None:
    fetched = await Fetcher(OPEN).fetch(f"http://127.0.0.1:{site.port}/pdf")
    assert (fetched.media_type, fetched.kind) == ("application/pdf", "pdf")
    assert fetched.body.startswith(b"%PDF-")


@pytest.mark.parametrize("path", ["/png", "/zip"])
async def test_non_text_content_types_are_unsupported(site: Site, path: str) -> None:
    refused = await _refused(Fetcher(OPEN), f"http://127.0.0.1:{site.port}{path}")
    assert refused.code == "unsupported_content_type"


async def test_an_untyped_body_is_sniffed(site: Site) -> None:
    fetched = await Fetcher(OPEN).fetch(f"http://127.0.0.1:{site.port}/untyped")
    assert fetched.media_type == "application/pdf"


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (429, "too_many_requests"),
        (404, "url_not_accessible"),
        (403, "url_not_accessible"),
        (500, "url_not_accessible"),
        (503, "url_not_accessible"),
        (304, "url_not_accessible"),
        (302, "url_not_accessible"),  # a redirect without a Location
    ],
)
async def test_statuses(site: Site, status: int, code: str) -> None:
    refused = await _refused(Fetcher(OPEN), f"http://127.0.0.1:{site.port}/status/{status}")
    assert (refused.code, refused.status) == (code, status)


async def test_no_cookie_is_kept_between_fetches_nor_a_proxy_taken_from_the_environment(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9/")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9/")
    fetcher = Fetcher(OPEN)
    url = f"http://127.0.0.1:{site.port}/cookie"
    assert (await fetcher.fetch(url)).body == b"none"
    assert (await fetcher.fetch(url)).body == b"none"


# -- raw servers: what never ends --------------------------------------------------------


class Raw:
    """A raw TCP server answering every connection with ``script(writer)``."""

    def __init__(self, script) -> None:  # type: ignore[no-untyped-def]
        self.script = script
        self.connected = asyncio.Event()
        self.closed = asyncio.Event()
        self.port = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connected.set()
        try:
            await reader.readuntil(b"\r\n\r\n")
            await self.script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed.set()
            writer.close()

    async def __aenter__(self) -> Raw:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def _drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Headers, then a byte every 50 ms, for an hour."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n")
    for _ in range(72_000):
        writer.write(b"x")
        await writer.drain()
        await asyncio.sleep(0.05)


async def _endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A chunked body that never ends (bounded by the client closing)."""
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"%x\r\n%s\r\n" % (1 << 16, b"a" * (1 << 16))
    for _ in range(1 << 20):  # 64 GiB: far past any cap
        writer.write(chunk)
        await writer.drain()


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Never answers; waits for the client to leave."""
    await reader.read()


async def test_a_slow_drip_ends_at_the_timeout() -> None:
    async with Raw(_drip) as raw:
        policy = replace(OPEN, timeout=1.0)
        refused = await _refused(Fetcher(policy), f"http://127.0.0.1:{raw.port}/")
        assert (refused.code, refused.reason) == ("url_not_accessible", "timeout")
        await asyncio.wait_for(raw.closed.wait(), 10)


async def test_an_endless_body_is_content_too_large() -> None:
    async with Raw(_endless) as raw:
        policy = replace(OPEN, max_wire_bytes=1 << 20)
        refused = await _refused(Fetcher(policy), f"http://127.0.0.1:{raw.port}/")
        assert (refused.code, refused.reason) == ("content_too_large", "wire_bytes")
        await asyncio.wait_for(raw.closed.wait(), 10)


async def test_cancelling_the_caller_closes_the_connection() -> None:
    async with Raw(_silent) as raw:
        fetch = asyncio.create_task(Fetcher(OPEN).fetch(f"http://127.0.0.1:{raw.port}/"))
        await asyncio.wait_for(raw.connected.wait(), 10)
        fetch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await fetch
        await asyncio.wait_for(raw.closed.wait(), 10)  # the server saw the client leave


async def test_fetches_past_the_concurrency_limit_are_too_many_requests() -> None:
    async with Raw(_silent) as raw:
        fetcher = Fetcher(replace(OPEN, queue_timeout=0.1), max_concurrent=1)
        first = asyncio.create_task(fetcher.fetch(f"http://127.0.0.1:{raw.port}/"))
        await asyncio.wait_for(raw.connected.wait(), 10)
        refused = await _refused(fetcher, f"http://127.0.0.1:{raw.port}/")
        assert (refused.code, refused.reason) == ("too_many_requests", "busy")
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
