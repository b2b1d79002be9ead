"""UpstreamClient: the only place upstream connection errors and timeouts are caught.

One keep-alive connection pool per upstream (gateway/httpclient.py, owned by the
app's cleanup_ctx). Failures before response headers are mapped once, here:

* connection refused, or closed before any byte of the reply -> UpstreamUnavailable
  (529); retried at most once, and only then (nothing has reached the client yet);
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

from gateway import errors, httpclient
from gateway.config import UpstreamConfig

_ERROR_BODY_CAP = 64 * 1024
# after [DONE]: how much more body, and how long, to wait for to keep the connection
_DRAIN_BYTES = 16 * 1024
_DRAIN_SECONDS = 0.1


class UpstreamResponse:
    """A live upstream response; read it with :meth:`chunks` or :meth:`read`."""

    __slots__ = ("_done", "_ending", "_resp")

    def __init__(self, resp: httpclient.Response) -> None:
        self._resp = resp
        self._done = False
        self._ending = False

    @property
    def status(self) -> int:
        return self._resp.status

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive; idle gaps and cuts raise GatewayErrors."""
        readany = self._resp.readany
        try:
            while True:
                chunk = await readany()
                if not chunk:
                    self._done = True
                    return
                yield chunk
        except TimeoutError:
            raise errors.UpstreamTimeout("Upstream stopped sending") from None
        except (httpclient.HTTPClientError, OSError):
            raise errors.UpstreamError("Upstream connection lost", status=500) from None

    def release_if_complete(self, *, ended: bool = False) -> None:
        """Mark the response reusable if its body has been read to the end.

        ``ended``: the upstream has said its stream is over (``[DONE]``), so the rest
        of its body (the chunked terminator, usually a separate write) is due at once;
        leaving the ``async with`` then waits a moment for it instead of closing a
        connection that could be reused.
        """
        if self._resp.at_eof:
            self._done = True
        elif ended:
            self._ending = True

    async def read(self) -> bytes:
        try:
            body = await self._resp.read()
        except TimeoutError:
            raise errors.UpstreamTimeout() from None
        except (httpclient.HTTPClientError, OSError):
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
        elif self._ending and exc is None:
            # The client's reply is complete: wait for the body's end apart from this
            # handler, which may be cancelled the moment the client hangs up.
            task = asyncio.get_running_loop().create_task(_settle(self._resp))
            _SETTLING.add(task)
            task.add_done_callback(_SETTLING.discard)
        else:
            # Not read to the end: drop the connection so the upstream stops generating.
            self._resp.close()


_SETTLING: set[asyncio.Task[None]] = set()  # strong references to the tasks below


async def _settle(resp: httpclient.Response) -> None:
    """Pool the connection if the rest of the body comes soon, else close it."""
    done = False
    try:
        done = await resp.drain(_DRAIN_BYTES, _DRAIN_SECONDS)
    finally:
        if done:
            resp.release()
        else:
            resp.close()


class UpstreamClient:
    """Pooled HTTP client for one upstream."""

    def __init__(self, cfg: UpstreamConfig, *, connections: httpclient.Counter | None = None
                 ) -> None:
        self.cfg = cfg
        self._connections = connections
        self.name = cfg.name
        self.hosts = (cfg.host, cfg.host.rsplit(":", 1)[0], cfg.base_url)
        path = cfg.base_url.split("://", 1)[-1].partition("/")[2].rstrip("/")
        self._path = "/" + path if path else ""
        # llama.cpp's and vLLM's /tokenize, /apply-template live beside /v1, not under it
        self._root = self._path[:-3] if self._path.endswith("/v1") else self._path
        self._headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        if cfg.api_key:
            self._headers["Authorization"] = f"Bearer {cfg.api_key}"
        self._pool: httpclient.Pool | None = None

    async def start(self) -> None:
        self._pool = httpclient.Pool(self.cfg.base_url, limit=self.cfg.pool_size,
                                     connect_timeout=self.cfg.connect_timeout,
                                     extra_headers=self._headers, gauge=self._connections)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def open_connections(self) -> int:
        return self._pool.open_connections if self._pool is not None else 0

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
        pool = self._pool
        assert pool is not None, "UpstreamClient used before start()"
        cfg = self.cfg
        # buffered: the whole reply is generated before its headers, header_timeout bounds
        # both; a stream's headers wait at most the shorter of the two, its body idle_timeout
        if stream:
            head_timeout = min(cfg.header_timeout, cfg.idle_timeout)
            body_timeout = cfg.idle_timeout
        else:
            head_timeout = body_timeout = cfg.header_timeout
        target = (self._root if at_root else self._path) + path
        data = body if method == "POST" else None
        for attempt in (0, 1):
            try:
                resp = await pool.request(method, target, data, head_timeout=head_timeout,
                                          body_timeout=body_timeout)
            except TimeoutError:
                raise errors.UpstreamTimeout() from None
            except (httpclient.Disconnected, ConnectionError):
                if attempt == 0:
                    continue
                raise errors.UpstreamUnavailable() from None
            except (httpclient.HTTPClientError, OSError):
                raise errors.UpstreamUnavailable() from None
            break
        if resp.status >= 300:
            try:
                raw = await resp.read(_ERROR_BODY_CAP)
            except (httpclient.HTTPClientError, TimeoutError, OSError):
                raw = b""
            finally:
                resp.close()
            if resp.status < 400:  # a redirect: the upstream is misconfigured, not the client
                raise errors.UpstreamError(status=500)
            err = errors.from_upstream(resp.status, raw, hosts=self.hosts, max_tokens=max_tokens)
            err.upstream_status = resp.status  # type: ignore[attr-defined]
            raise err
        return UpstreamResponse(resp)
