"""Typed application keys and the small mutable state shared by handlers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web

from gateway.config import Config
from gateway.metrics import Metrics
from gateway.redact import Redactor
from gateway.upstream import UpstreamClient


class Drainable(Protocol):
    def drain(self) -> None:
        """End this stream with the failure envelope (the grace period is over)."""


@dataclass
class AppState:
    api_keys: tuple[bytes, ...] = ()
    ready: bool = False
    draining: bool = False
    in_flight: dict[str, int] = field(default_factory=dict)  # model alias -> requests now
    streams: set[Drainable] = field(default_factory=set)  # live streams, for the drain
    decoding: int = 0  # request body bytes being received and decoded now (gateway/body.py)
    # called with a model's name when one of its interactive requests ends (the batch
    # scheduler, waiting for the upstream to be free); None: nobody waits
    on_request_end: Callable[[str], None] | None = None


CONFIG = web.AppKey("config", Config)
METRICS = web.AppKey("metrics", Metrics)
UPSTREAMS = web.AppKey("upstreams", dict[str, UpstreamClient])
STATE = web.AppKey("state", AppState)
# every configured upstream's secrets, redacted from upstream text before a client or a log
# line sees it
SECRETS = web.AppKey("secrets", Redactor)


# per-request state, set by the middleware and the handlers
API = web.RequestKey("api", str)  # metrics.APIS (messages, chat, ...), or "" for others
REQUEST_ID = web.RequestKey("request_id", str)
MODEL = web.RequestKey("model", str)  # the routed alias (config value, safe as a label)
UPSTREAM: web.RequestKey[str | None] = web.RequestKey("upstream")
STREAM = web.RequestKey("stream", bool)
STREAM_RESPONSE = web.RequestKey("stream_response", web.StreamResponse)
# (error.type, client-safe message or None)
ERROR: web.RequestKey[tuple[str, str | None] | None] = web.RequestKey("error")
OPENAI_ERRORS = web.RequestKey("openai_errors", bool)  # render errors in OpenAI's shape
