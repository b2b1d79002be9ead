"""UpstreamClient: the only place aiohttp client errors and timeouts are caught.

One pooled ``ClientSession`` per upstream (owned by the app's cleanup_ctx).
Failures before response headers are mapped once, here:

* connection refused / reset before headers -> UpstreamUnavailable (529);
  retried at most once, and only then (nothing has reached the client yet);
* no response headers within ``header_timeout`` -> UpstreamTimeout (504);
* an HTTP error status -> errors.from_upstream (scrubbed, mapped);
* while reading a body: no bytes for ``idle_timeout`` -> UpstreamTimeout, a
  cut or broken body -> UpstreamError (500).

A response is used as an async context manager: leaving it early (client gone,
stream translated to its end, an error) *closes* the connection, so the
upstream sees the disconnect and stops generating; only a body read to its end
goes back to the pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import TracebackType

import aiohttp

from gateway import errors
from gateway.config import UpstreamConfig

_ERROR_BODY_CAP = 64 * 1024
_CONNECT_ERRORS = (
    aiohttp.ClientConnectorError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
    ConnectionResetError,
)


class UpstreamResponse:
    """A live upstream response; read it with :meth:`chunks` or :meth:`read`."""

    __slots__ = ("_done", "_resp")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self._done = False

    @property
    def status(self) -> int:
        return self._resp.status

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive; idle gaps and cuts raise GatewayErrors."""
        content = self._resp.content
        try:
            while True:
                chunk = await content.readany()
                if not chunk:
                    self._done = True
                    return
                yield chunk
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise errors.UpstreamTimeout("Upstream stopped sending") from None
        except (aiohttp.ClientError, ConnectionError):
            raise errors.UpstreamError("Upstream connection lost", status=500) from None

    def release_if_complete(self) -> None:
        """Mark the response reusable if its body has been read to the end."""
        if self._resp.content.at_eof():
            self._done = True

    async def read(self) -> bytes:
        try:
            body = await self._resp.read()
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise errors.UpstreamTimeout() from None
        except (aiohttp.ClientError, ConnectionError):
            raise errors.UpstreamError("Upstream connection lost", status=500) from None
        self._done = True
        return body

    async def __aenter__(self) -> UpstreamResponse:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._done and exc is None:
            self._resp.release()
        else:
            # Not read to the end: drop the connection so the upstream stops generating.
            self._resp.close()


class UpstreamClient:
    """Pooled HTTP client for one upstream."""

    def __init__(self, cfg: UpstreamConfig) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.hosts = (cfg.host, cfg.host.rsplit(":", 1)[0], cfg.base_url)
        self._url = cfg.base_url
        # llama.cpp's and vLLM's /tokenize, /apply-template live beside /v1, not under it
        self._root = cfg.base_url[:-3] if cfg.base_url.endswith("/v1") else cfg.base_url
        self._headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        if cfg.api_key:
            self._headers["Authorization"] = f"Bearer {cfg.api_key}"
        self._buffered_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=cfg.connect_timeout, sock_read=cfg.header_timeout
        )
        self._stream_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=cfg.connect_timeout, sock_read=cfg.idle_timeout
        )
        self._headers_first = cfg.header_timeout < cfg.idle_timeout
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self.cfg.pool_size, limit_per_host=0, ttl_dns_cache=300,
            enable_cleanup_closed=True,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=True,
            skip_auto_headers=("User-Agent",),
            read_bufsize=2**16,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "UpstreamClient used before start()"
        return self._session

    async def request(
        self,
        path: str,
        body: bytes,
        *,
        stream: bool,
        max_tokens: int | None = None,
        method: str = "POST",
        at_root: bool = False,
    ) -> UpstreamResponse:
        """Send and wait for a 2xx response's headers; anything else raises a GatewayError."""
        timeout = self._stream_timeout if stream else self._buffered_timeout
        url = (self._root if at_root else self._url) + path
        # sock_read already bounds the wait for headers (header_timeout for buffered
        # calls, idle_timeout for streams); an outer timer is only needed when a
        # stream's header_timeout is the shorter of the two.
        outer = self.cfg.header_timeout if stream and self._headers_first else None
        data = body if method == "POST" else None
        for attempt in (0, 1):
            try:
                if outer is None:
                    resp = await self.session.request(
                        method, url, data=data, headers=self._headers, timeout=timeout,
                        allow_redirects=False,
                    )
                else:
                    async with asyncio.timeout(outer):
                        resp = await self.session.request(
                            method, url, data=data, headers=self._headers, timeout=timeout,
                            allow_redirects=False,
                        )
            except (TimeoutError, aiohttp.ServerTimeoutError):
                raise errors.UpstreamTimeout() from None
            except _CONNECT_ERRORS:
                if attempt == 0:
                    continue
                raise errors.UpstreamUnavailable() from None
            except aiohttp.ClientError:
                raise errors.UpstreamUnavailable() from None
            break
        if resp.status >= 300:
            try:
                raw = await resp.content.read(_ERROR_BODY_CAP)
            except (aiohttp.ClientError, TimeoutError, ConnectionError):
                raw = b""
            finally:
                resp.close()
            if resp.status < 400:  # a redirect: the upstream is misconfigured, not the client
                raise errors.UpstreamError(status=500)
            err = errors.from_upstream(resp.status, raw, hosts=self.hosts, max_tokens=max_tokens)
            err.upstream_status = resp.status  # type: ignore[attr-defined]
            raise err
        return UpstreamResponse(resp)
