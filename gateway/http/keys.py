"""Typed application keys and the small mutable state shared by handlers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from gateway.messages.call import MessagesDeps
from gateway.ops.budget import Budget
from gateway.ops.config import Config
from gateway.ops.metrics import Metrics
from gateway.tenancy.clients import Client, Tenants
from gateway.tenancy.counters import CounterStore
from gateway.tenancy.fair import FairQueue
from gateway.text.redact import Redactor
from gateway.tools.web_fetch.fetcher_service import WebFetchService
from gateway.tools.web_search.searxng import Searxng
from gateway.upstream import UpstreamClient
from gateway.upstream.send import Upstreams
from gateway.upstream.window_watch import Windows

if TYPE_CHECKING:  # the SQL layer is imported only when batches are on
    from gateway.batches.scheduler import Scheduler
    from gateway.batches.store import BatchStore


class Drainable(Protocol):
    def drain(self) -> None:
        """End this stream with the failure envelope (the grace period is over)."""


@dataclass
class AppState:
    # keys -> clients ([[clients]], server.api_keys_env); replaced whole on SIGHUP
    tenants: Tenants
    ready: bool = False
    draining: bool = False
    in_flight: dict[str, int] = field(default_factory=dict)  # model alias -> requests now
    # model alias -> its requests waiting for a slot (queue_timeout; gateway/http/admission.py)
    queues: dict[str, FairQueue[asyncio.Future[None]]] = field(default_factory=dict)
    streams: set[Drainable] = field(default_factory=set)  # live streams, for the drain
    # request bodies being received and decoded (gateway/http/body.py), within memory: what
    # requests in flight hold (gateway/ops/budget.py)
    memory: Budget = field(default_factory=lambda: Budget(512 * 1024 * 1024))
    decoding: Budget = field(default_factory=lambda: Budget(64 * 1024 * 1024))
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
# what the one upstream call and the one Messages call need, passed to them explicitly
UPSTREAM_CALLS = web.AppKey("upstream_calls", Upstreams)
MESSAGES = web.AppKey("messages", MessagesDeps)
# the web_search server tool's backend; None: no [web_search] table (such tools get a 400)
WEB_SEARCH: web.AppKey[Searxng | None] = web.AppKey("web_search")
# the web_fetch server tool's fetcher; None: `[web_fetch] enabled` is off (such tools: 400)
WEB_FETCH: web.AppKey[WebFetchService | None] = web.AppKey("web_fetch")
# the clients' counters (gateway/tenancy/counters.py): this process's, or Redis's
COUNTERS = web.AppKey("counters", CounterStore)
# Message Batches: the store and the scheduler (absent when batches are off)
BATCH_STORE: web.AppKey[BatchStore] = web.AppKey("batch_store")
SCHEDULER: web.AppKey[Scheduler] = web.AppKey("batch_scheduler")
# the engines' context windows, learnt in the background (gateway/upstream/window_watch.py)
WINDOWS = web.AppKey("windows", Windows)


@dataclass(frozen=True, slots=True)
class RouteTag:
    """What the middleware needs to know of a route, set where the route is added.

    ``api``: its label in the metrics (``metrics.APIS``), None for the operational routes;
    ``openai``: errors rendered in OpenAI's shape (the pass-through) instead of Anthropic's
    envelope; ``needs_key``: a client key is asked for when ``server.api_keys`` are set.
    """

    api: str | None
    openai: bool = False
    needs_key: bool = True
    logged: bool = True  # an access line per request (not for /health, /ready, /metrics)


# route name -> its tag; a route without one (the unmatched-path 404) is an Anthropic route
ROUTE_TAGS = web.AppKey("route_tags", dict[str, RouteTag])
# the request paths of the OpenAI-dialect routes: errors the connection answers before any
# route is matched (a malformed body, a timeout) take the dialect from the raw path
OPENAI_PATHS = web.AppKey("openai_paths", frozenset[bytes])
# the metrics listener's own application (server.metrics_port), or None: served by this one
OPS_APP: web.AppKey[web.Application | None] = web.AppKey("ops_app")


class Outcome:
    """What a request came to, filled in by the middleware and the handlers and read at its
    end (its metrics, its access line): one object per request, set once, where a key each
    cost a request's ``__setitem__`` apiece."""

    __slots__ = ("error", "model", "stream", "upstream")

    def __init__(self) -> None:
        self.model = ""  # the routed alias (config value, safe as a label)
        self.upstream: str | None = None
        self.stream = False
        self.error: tuple[str, str | None] | None = None  # (error.type, client-safe message)


# per-request state, set by the middleware and the handlers
API = web.RequestKey("api", str)  # metrics.APIS (messages, chat, ...), or "" for others
REQUEST_ID = web.RequestKey("request_id", str)
STREAM_RESPONSE = web.RequestKey("stream_response", web.StreamResponse)
# the client's key as presented (x-api-key, else a bearer token), read once by the middleware
CLIENT_KEY: web.RequestKey[bytes | None] = web.RequestKey("client_key")
# who the key belongs to (gateway/tenancy/clients.py), set by the middleware on every request
CLIENT = web.RequestKey("client", Client)
OUTCOME = web.RequestKey("outcome", Outcome)
OPENAI_ERRORS = web.RequestKey("openai_errors", bool)  # render errors in OpenAI's shape
