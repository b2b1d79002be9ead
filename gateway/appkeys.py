"""Typed application keys and the small mutable state shared by handlers."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from gateway.config import Config
from gateway.metrics import Metrics
from gateway.upstream import UpstreamClient


@dataclass
class AppState:
    api_keys: tuple[bytes, ...] = ()
    ready: bool = False
    draining: bool = False
    in_flight: dict[str, int] = field(default_factory=dict)  # model alias -> requests now
    streams: set[object] = field(default_factory=set)  # live stream handles, for drain


CONFIG = web.AppKey("config", Config)
METRICS = web.AppKey("metrics", Metrics)
UPSTREAMS = web.AppKey("upstreams", dict[str, UpstreamClient])
STATE = web.AppKey("state", AppState)
