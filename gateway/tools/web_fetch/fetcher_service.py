"""The process's web fetch service: the safe fetcher (:mod:`.net`), its policy made from
``[web_fetch]``, the fetches' metrics and their one failure log.

Made once at app start when ``[web_fetch] enabled``; each request's fetches are a
:class:`~gateway.tools.web_fetch.fetches.Fetches` over it. The policy's ``protected``
endpoints are the gateway's own listeners and every upstream's and the search backend's
``host:port``: never fetched, even inside ``allowed_networks`` (a model must not reach the
engines behind the gateway, nor the gateway itself, through a page). A name among them is
resolved once as the app starts (an upstream that a DNS name finds elsewhere later is not
covered; list its network outside ``allowed_networks``).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

from gateway.ops.config import Config
from gateway.ops.config_schema import WebFetchConfig
from gateway.ops.metrics import WEB_FETCH_ERROR_CODES, Metrics
from gateway.tools.web_fetch.net import Fetcher, FetchPolicy
from gateway.upstream.failures import FailureLog

__all__ = ["WebFetchService", "policy"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _endpoints(config: Config) -> Iterator[tuple[str, int]]:
    """(ip, port) of every endpoint of ``config``'s (a name resolved once, at start)."""
    for host, port in _named_endpoints(config):
        try:
            yield str(ipaddress.ip_address(host.strip("[]"))), port
            continue
        except ValueError:
            pass
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            continue  # a name that does not resolve now: nothing there to reach either
        for *_, sockaddr in found[:16]:
            yield str(ipaddress.ip_address(str(sockaddr[0]).split("%")[0])), port


def _named_endpoints(config: Config) -> Iterator[tuple[str, int]]:
    server = config.server
    for host, port in ((server.host, server.port), (server.metrics_host, server.metrics_port)):
        if port:
            yield (host or server.host), port
            if host in ("", "0.0.0.0", "::"):  # every interface: loopback's name for it too
                yield "127.0.0.1", port
                yield "::1", port
    urls = [url for cfg in config.upstreams.values() for url in cfg.replica_urls]
    if config.web_search is not None and config.web_search.searxng_url:
        urls.append(config.web_search.searxng_url)
    for url in urls:
        parts = urlsplit(url)
        if parts.hostname is None:
            continue
        try:
            port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)
        except ValueError:
            continue
        yield parts.hostname, port


def policy(config: Config) -> FetchPolicy:
    """The fetcher's policy for ``config`` (its ``[web_fetch]`` table and the endpoints it
    must never reach)."""
    fetch = config.web_fetch
    return FetchPolicy(
        allowed_networks=tuple(ipaddress.ip_network(n) for n in fetch.allowed_networks),
        protected=frozenset(_endpoints(config)),
        timeout=fetch.fetch_timeout,
        connect_timeout=fetch.fetch_connect_timeout,
        max_redirects=fetch.max_redirects,
        max_wire_bytes=fetch.max_page_bytes,
        max_body_bytes=fetch.max_page_bytes,
    )


class WebFetchService:
    """The fetcher and what every request's fetches share."""

    def __init__(self, config: Config, metrics: Metrics) -> None:
        self.config: WebFetchConfig = config.web_fetch
        self.fetcher = Fetcher(policy(config), max_concurrent=config.web_fetch.max_concurrent)
        self.metrics = metrics
        self.failures = FailureLog("web_fetch", event="web_fetch_failure", key="tool")
        self._models: set[str] = set()

    def count(self, model: str, outcome: str, seconds: float | None = None) -> None:
        """One fetch asked for by the model of ``model``: ``ok`` or its error code."""
        metrics = self.metrics
        if model not in self._models:  # every outcome's series at zero, once per model
            self._models.add(model)
            for code in ("ok", *WEB_FETCH_ERROR_CODES):
                metrics.web_fetches.labels(model, code)
        metrics.web_fetches.labels(model, outcome).inc()
        if seconds is not None:
            metrics.web_fetch_duration.labels(model).observe(seconds)

    async def close(self) -> None:
        await self.fetcher.close()
