"""A web fetch's URL checks and its bounded decompression (gateway/tools/web_fetch/net.py,
inflate.py). The network itself is exercised in tests/e2e/test_web_fetch_hostile.py."""

from __future__ import annotations

import gzip
import zlib

import pytest

from gateway.tools.web_fetch import inflate
from gateway.tools.web_fetch.net import Fetched, FetchPolicy, FetchRefused, check_url

POLICY = FetchPolicy(max_url_chars=100)


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("https://example.com/" + "a" * 100, "url_too_long"),
        # the length is checked before anything else: a long URL that is not one is too long
        ("ftp://" + "a" * 200, "url_too_long"),
        ("", "invalid_tool_input"),
        (None, "invalid_tool_input"),
        ("example.com/page", "invalid_tool_input"),
        ("ftp://example.com/", "invalid_tool_input"),
        ("file:///etc/passwd", "invalid_tool_input"),
        ("gopher://127.0.0.1:6379/_FLUSHALL", "invalid_tool_input"),
        ("javascript:alert(1)", "invalid_tool_input"),
        ("http://", "invalid_tool_input"),
        ("http:///path", "invalid_tool_input"),
        ("http://user:pass@example.com/", "invalid_tool_input"),
        ("http://user@example.com/", "invalid_tool_input"),
        ("http://:@example.com/", "invalid_tool_input"),
        ("http://example.com:0/", "invalid_tool_input"),
        ("http://example.com:65536/", "invalid_tool_input"),
        ("http://example.com:99999999999/", "invalid_tool_input"),
        ("http://example.com:port/", "invalid_tool_input"),
        ("http://[::1/", "invalid_tool_input"),
        ("http://[not-v6]/", "invalid_tool_input"),
        ("http://exa mple.com/", "invalid_tool_input"),
        ("http://example.com/\r\nHost: evil", "invalid_tool_input"),
        ("http://example.com/\x00", "invalid_tool_input"),
        ("http://example.com/\u2028", "invalid_tool_input"),
        # hosts aiohttp would connect to without the pinned resolver: canonical literals only
        ("http://2130706433/", "invalid_tool_input"),
        ("http://127.000.000.001/", "invalid_tool_input"),
        ("http://017700000001/", "invalid_tool_input"),
        ("http://1.2.3.4.5/", "invalid_tool_input"),
        ("http://127.1/", "invalid_tool_input"),
    ],
)
def test_bad_urls_refused(url: object, code: str) -> None:
    with pytest.raises(FetchRefused) as refused:
        check_url(url, POLICY)
    assert refused.value.code == code


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("https://example.com/a?b=c#frag", "example.com", 443),
        ("HTTP://EXAMPLE.com:8080/", "example.com", 8080),
        ("http://[2606:4700::1]:81/", "2606:4700::1", 81),
        ("http://127.0.0.1/", "127.0.0.1", 80),  # checked later, by address
        ("https://bücher.example/", "xn--bcher-kva.example", 443),
    ],
)
def test_good_urls_pass(url: str, host: str, port: int) -> None:
    parsed = check_url(url, POLICY)
    assert (parsed.raw_host, parsed.port, parsed.fragment) == (host, port, "")


def test_fetched_kind() -> None:
    kinds = [
        Fetched("u", media, None, b"").kind
        for media in ("text/html", "application/xhtml+xml", "application/pdf", "text/plain")
    ]
    assert kinds == ["html", "html", "pdf", "text"]


def _feed_all(decoder: inflate.Inflater, data: bytes, cap: int, step: int = 4096) -> bytes:
    """Feeds ``data`` in chunks as the fetcher does; raises PastCap past ``cap``."""
    out = bytearray()
    for i in range(0, len(data), step):
        got = decoder.feed(data[i : i + step], cap - len(out))
        assert len(got) <= cap - len(out) + 1, "a decoder returned more than the cap allows"
        out += got
        if len(out) > cap:
            raise inflate.PastCap
    out += decoder.flush(cap - len(out))
    if len(out) > cap:
        raise inflate.PastCap
    return bytes(out)


def _bomb(size: int) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"\0" * (1 << 20)
    parts = [z.compress(block) for _ in range(size >> 20)]
    return b"".join(parts) + z.flush()


def test_gzip_bomb_never_inflates_past_the_cap() -> None:
    """1 GiB of zeros is 1 MiB of gzip: fed whole, one call returns at most cap + 1 bytes."""
    bomb = _bomb(1 << 30)
    assert len(bomb) < 2 << 20
    decoder = inflate.decoder("gzip")
    out = decoder.feed(bomb, 1000)
    assert len(out) == 1001
    with pytest.raises(inflate.PastCap):
        _feed_all(inflate.decoder("gzip"), bomb, 64 * 1024)


@pytest.mark.parametrize(
    ("coding", "encode"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("GZIP", gzip.compress),
        ("deflate", zlib.compress),  # the zlib format RFC 9110 names
        ("deflate", lambda b: zlib.compress(b, wbits=-15)),  # raw deflate, as some send
        ("identity", lambda b: b),
        ("", lambda b: b),
        ("gzip, deflate", lambda b: zlib.compress(gzip.compress(b))),
        ("gzip", lambda b: gzip.compress(b[:500]) + gzip.compress(b[500:])),  # two members
    ],
)
def test_codings_undone(coding: str, encode: object) -> None:
    body = bytes(range(256)) * 40
    assert _feed_all(inflate.decoder(coding), encode(body), len(body), step=7) == body  # type: ignore[operator]
    with pytest.raises(inflate.PastCap):
        _feed_all(inflate.decoder(coding), encode(body), len(body) - 1, step=7)  # type: ignore[operator]


def test_brotli_when_installed() -> None:
    brotli = pytest.importorskip("brotli")
    body = b"hello brotli " * 1000
    assert _feed_all(inflate.decoder("br"), brotli.compress(body), len(body)) == body
    bomb = brotli.compress(b"\0" * (64 << 20))
    with pytest.raises(inflate.PastCap):
        _feed_all(inflate.decoder("br"), bomb, 1 << 20)


@pytest.mark.parametrize(
    ("coding", "data"),
    [
        ("compress", b"x"),
        ("zstd-unknown", b"x"),
        ("gzip, gzip, gzip", b"x"),  # more codings than undone
    ],
)
def test_unsupported_codings(coding: str, data: bytes) -> None:
    with pytest.raises(inflate.BadEncoding):
        inflate.decoder(coding)


@pytest.mark.parametrize(
    ("coding", "data"),
    [
        ("gzip", b"not gzip at all"),
        ("gzip", gzip.compress(b"x" * 1000)[:-12]),  # truncated
        ("deflate", b"\x78\x9c garbage"),
    ],
)
def test_corrupt_data(coding: str, data: bytes) -> None:
    with pytest.raises(inflate.BadEncoding):
        _feed_all(inflate.decoder(coding), data, 1 << 20)


def test_double_gzip_bomb_bounded_in_the_middle_stage() -> None:
    """gzip of a gzip bomb: the middle stage is handed on 64 KiB at a time, so neither it
    nor the last stage holds more than the cap allows."""
    double = gzip.compress(_bomb(256 << 20))
    assert len(double) < 1 << 20
    decoder = inflate.decoder("gzip, gzip")
    assert len(decoder.feed(double, 1 << 20)) == (1 << 20) + 1
