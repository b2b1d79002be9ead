"""Typed application keys and the small mutable state shared by handlers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from gateway.http.decoder import DECODER, Decoder
from gateway.messages.deps import MessagesDeps
from gateway.ops.budget import Budget
from gateway.ops.config import Config
from gateway.ops.metrics import Metrics
from gateway.tenancy.clients import ANONYMOUS_CLIENT, Client, Tenants
from gateway.tenancy.counters import CounterStore
from gateway.tenancy.fair import FairQueue
from gateway.tenancy.limits import Charge
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


class AppView:
    """What the request path reads from the application, as attributes: a handler reads
    ``request[EXCHANGE].app.metrics`` where ``request.app[METRICS]`` cost three Python calls
    (aiohttp's ``request.app``, its match info's ``current_app`` and ``Application.__getitem__``)
    each time, about forty a Messages request.

    Made empty with the application (the middleware holds it) and filled from the
    application's keys when it starts (:meth:`fill`, an ``on_startup`` hook), after
    everything that sets them (the app's assembly, a test replacing a store) and before the
    first request; the keys stay the source of truth for set-up code."""

    __slots__ = (
        "config",
        "counters",
        "decoder",
        "messages",
        "metrics",
        "secrets",
        "state",
        "tags",
        "telemetry",
        "upstream_calls",
        "usage",
        "web_fetch",
        "web_search",
    )

    config: Config
    counters: CounterStore | None
    decoder: Decoder | None
    messages: MessagesDeps | None
    metrics: Metrics
    secrets: Redactor
    state: AppState
    tags: dict[str, RouteTag]
    telemetry: bool
    upstream_calls: Upstreams | None
    usage: Any  # the usage report's recorder (gateway/http/usage_api.py), None without one
    web_fetch: WebFetchService | None
    web_search: Searxng | None

    def fill(self, app: web.Application, usage: Any = None) -> None:
        self.config = app[CONFIG]
        self.metrics = app[METRICS]
        self.state = app[STATE]
        self.secrets = app[SECRETS]
        self.tags = app[ROUTE_TAGS]
        self.messages = app.get(MESSAGES)
        self.counters = app.get(COUNTERS)
        self.decoder = app.get(DECODER)
        self.upstream_calls = app.get(UPSTREAM_CALLS)
        self.web_search = app.get(WEB_SEARCH)
        self.web_fetch = app.get(WEB_FETCH)
        self.usage = usage
        self.telemetry = self.config.telemetry is not None


VIEW = web.AppKey("view", AppView)


class Exchange:
    """One request's record, set by the middleware and the handlers and read at its end
    (its metrics, its access line): who sent it, what it was routed to, what it came to.
    One object per request, stored under one key (:data:`EXCHANGE`), where a key apiece
    cost a request's ``__setitem__`` and ``__getitem__`` (Python calls) each time."""

    __slots__ = (
        "api",
        "app",
        "charge",
        "client",
        "client_key",
        "error",
        "model",
        "openai",
        "request_id",
        "stream",
        "stream_response",
        "upstream",
    )

    def __init__(self, app: AppView, request_id: str, api: str, openai: bool) -> None:
        self.app = app
        self.request_id = request_id
        self.api = api  # metrics.APIS (messages, chat, ...), or "" for others
        self.openai = openai  # render errors in OpenAI's shape
        # the client's key as presented (x-api-key, else a bearer token)
        self.client_key: bytes | None = None
        # who the key belongs to (gateway/tenancy/clients.py)
        self.client: Client = ANONYMOUS_CLIENT
        self.model = ""  # the routed alias (config value, safe as a label)
        self.upstream: str | None = None
        self.stream = False
        self.error: tuple[str, str | None] | None = None  # (error.type, client-safe message)
        # a stream started: its status is sent, so no error response can follow
        self.stream_response: web.StreamResponse | None = None
        self.charge: Charge | None = None  # a limited client's charge (gateway/http/charges.py)


EXCHANGE = web.RequestKey("exchange", Exchange)
