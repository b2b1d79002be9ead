"""build_app(config): the API application, and with ``server.metrics_port`` the metrics
listener's own small application (``app[OPS_APP]``: ``/metrics``, ``/health``, ``/ready``).

Routes (every API route under ``server.prefix``)::

    POST {prefix}/v1/messages                Anthropic Messages (any query string)
    POST {prefix}/v1/messages/count_tokens   Anthropic token counting
    GET  {prefix}/v1/models[/{model_id}]     configured models (Anthropic or OpenAI shape)
    POST {prefix}/v1/chat/completions        OpenAI pass-through (http/passthrough.py): alias
    POST {prefix}/v1/completions             rewritten, streams relayed, errors in OpenAI's
    POST {prefix}/v1/embeddings              shape
    POST {prefix}/v1/responses
    *    {prefix}/v1/files[/...]             Anthropic endpoints not implemented here: 404
    *    {prefix}/v1/complete                not_found_error naming the endpoint as not
    *    {prefix}/v1/messages/batches[/...]  supported by this gateway (batches: only when off;
                                             on, gateway/http/batches.py serves them)
    GET  {prefix}/v1/organizations/usage_report/messages
                                             the Admin API's usage report (http/usage_api.py):
                                             only with server.admin_keys, for those keys
    GET  {prefix}/.well-known/oauth-authorization-server
    POST {prefix}/oauth/device_authorization  Claude Code's sign-in ([auth] enabled;
    POST {prefix}/oauth/token                 gateway/auth/): RFC 8414 metadata, the
    POST {prefix}/oauth/revoke                device flow, tokens, revocation and the
    GET|POST {prefix}/oauth/device            verification page
    HEAD {prefix}                            Claude Code's pre-connect probe: 200, empty
    GET  /health  /ready                     liveness, readiness
    GET  /metrics                            here only without server.metrics_port (a key
                                             asked when keys are set); else on the metrics app

Each route is added with a :class:`~gateway.http.keys.RouteTag` (its api label, its error
dialect, whether it needs a client key, whether it is logged), which the middleware reads.

Any other path is a 404 ``not_found_error`` in Anthropic's envelope.

Upstream sessions are owned by a cleanup_ctx: opened at startup, closed at
shutdown. ``state.ready`` turns true once they are open. The redactor of every secret
the process knows is built once, here (``app[SECRETS]``, gateway/upstream/known.py), and
every upstream client scrubs its error replies with it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.multiprocess import MultiProcessCollector

from gateway import __version__, errors
from gateway.http import anthropic as messages
from gateway.http import charges, managed_settings, models, passthrough, usage_api
from gateway.http.decoder import DECODER, Decoder, decoder_ctx
from gateway.http.keys import (
    BATCH_STORE,
    CONFIG,
    COUNTERS,
    MESSAGES,
    METRICS,
    OPENAI_PATHS,
    OPS_APP,
    ROUTE_TAGS,
    SCHEDULER,
    SECRETS,
    STATE,
    UPSTREAM_CALLS,
    UPSTREAMS,
    VIEW,
    WEB_FETCH,
    WEB_SEARCH,
    WINDOWS,
    AppState,
    AppView,
    RouteTag,
)
from gateway.http.middleware import gateway_middleware
from gateway.http.tenancy import batch_reply_ended
from gateway.messages.deps import MessagesDeps
from gateway.messages.documents.pdf_pool import PdfPool
from gateway.openai.apis import APIS as OPENAI_APIS
from gateway.ops import log
from gateway.ops.budget import budgets
from gateway.ops.config import Config
from gateway.ops.metrics import Metrics
from gateway.tenancy.clients import Tenants
from gateway.tenancy.counters import CounterStore, LocalStore
from gateway.tools.web_fetch.fetcher_service import WebFetchService
from gateway.tools.web_search.searxng import Searxng
from gateway.upstream import fleet, window_watch
from gateway.upstream.known import known_secrets
from gateway.upstream.send import Upstreams

if TYPE_CHECKING:
    from gateway.auth.signin_store import AuthStore
    from gateway.batches.store import BatchStore
    from gateway.batches.usage_store import UsageStore
from gateway.upstream import UpstreamClient

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_log = log.get("gateway.app")
_OPS = RouteTag(None, needs_key=False, logged=False)


def _view(app: web.Application) -> None:
    """The application's :class:`AppView` (what the request path reads, as attributes), held
    by its middleware and filled when it starts."""
    view = app[VIEW] = AppView()

    async def fill(app: web.Application) -> None:
        view.fill(app, app.get(usage_api.USAGE))

    app.on_startup.append(fill)
    app.middlewares.append(gateway_middleware(view))


def _ops_routes(
    app: web.Application,
    exposed: CollectorRegistry,
    *,
    serve_metrics: bool,
    metrics_key: bool = False,
) -> None:
    """``/health`` and ``/ready``, and ``/metrics`` when ``serve_metrics`` (not on the API
    application when the metrics listener has its own); ``metrics_key``: /metrics asks for a
    client key when keys are set (it names every upstream model)."""
    tags = app[ROUTE_TAGS]
    if serve_metrics:
        app.router.add_route(
            "GET",
            "/metrics",
            make_aiohttp_handler(exposed, disable_compression=True),
            name="metrics",
        )
        tags["metrics"] = RouteTag(None, needs_key=metrics_key, logged=False)
    app.router.add_route("GET", "/health", _health, name="health")
    app.router.add_route("GET", "/ready", _ready, name="ready")
    tags["health"] = tags["ready"] = _OPS


def _ops_app(api: web.Application, exposed: CollectorRegistry) -> web.Application:
    """The metrics listener's own small application (``server.metrics_port``): ``/metrics``,
    ``/health`` and ``/ready`` and nothing else, rendered by the same middleware, sharing
    the API application's config, metrics and state."""
    app = web.Application()
    _view(app)
    app[CONFIG] = api[CONFIG]
    app[METRICS] = api[METRICS]
    app[STATE] = api[STATE]
    app[SECRETS] = api[SECRETS]
    app[ROUTE_TAGS] = {}
    app[OPENAI_PATHS] = frozenset()
    _ops_routes(app, exposed, serve_metrics=True)
    return app


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _ready(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.ready and not state.draining:
        return web.json_response({"status": "ready"})
    return web.json_response({"status": "draining" if state.draining else "starting"}, status=503)


async def _head_ok(request: web.Request) -> web.Response:
    return web.Response(status=200)


# Anthropic endpoints the gateway does not implement, each with everything below it. A
# 404 that says so, where a bare "Not found" would read like a wrong base URL.
_NOT_IMPLEMENTED = ("files", "complete", "messages/batches")


async def _not_supported(request: web.Request) -> web.Response:
    endpoint = request.path.removeprefix(request.app[CONFIG].server.prefix)[:256]
    raise errors.NotFound(f"{request.method} {endpoint} is not supported by this gateway")


async def _upstreams_ctx(app: web.Application) -> AsyncIterator[None]:
    clients = app[UPSTREAMS]
    for client in clients.values():
        await client.start()
    app[STATE].ready = True
    yield
    app[STATE].ready = False
    await asyncio.gather(*(c.close() for c in clients.values()))


async def _fleet_ctx(app: web.Application) -> AsyncIterator[None]:
    """DNS re-resolution and health probes (gateway/upstream/fleet.py), one task per
    upstream that has either; stopped before the upstreams' pools are closed."""
    state = app[STATE]
    tasks = [
        asyncio.create_task(fleet.maintain(client, lambda: state.draining))
        for client in app[UPSTREAMS].values()
        if fleet.needed(client)
    ]
    yield
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _windows_ctx(app: web.Application) -> AsyncIterator[None]:
    """The engines' context windows, read in the background (gateway/upstream/window_watch.py)."""
    clients = app[UPSTREAMS]
    tasks = window_watch.learners(app[WINDOWS], app[CONFIG].models, clients)
    yield
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _loop_lag_ctx(app: web.Application) -> AsyncIterator[None]:
    gauge = app[METRICS].loop_lag
    process = app[METRICS].process
    loop = asyncio.get_running_loop()

    async def probe() -> None:
        # one timer for two jobs: event-loop lag, and flushing buffered log lines
        while True:
            t = loop.time()
            await asyncio.sleep(log.FLUSH_INTERVAL)
            gauge.set(max(0.0, loop.time() - t - log.FLUSH_INTERVAL))
            log.flush()
            if process is not None:  # --workers: this worker's CPU, memory and fds
                process.sample()

    task = asyncio.create_task(probe())
    yield
    task.cancel()
    log.flush()


async def _web_search_ctx(app: web.Application) -> AsyncIterator[None]:
    """The web search backend's client session, open while the app serves."""
    backend = app[WEB_SEARCH]
    if backend is not None:
        await backend.start()
    yield
    if backend is not None:
        await backend.close()


async def _web_fetch_ctx(app: web.Application) -> AsyncIterator[None]:
    """The web fetcher's connections, closed with the app."""
    yield
    service = app[WEB_FETCH]
    if service is not None:
        await service.close()


async def _pdf_pool_ctx(app: web.Application) -> AsyncIterator[None]:
    """The PDF worker processes (started on first use) are stopped with the app."""
    yield
    await app[MESSAGES].pdfs.close()


def default_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def _registries(
    config: Config, registry: CollectorRegistry | None
) -> tuple[CollectorRegistry, CollectorRegistry, CollectorRegistry | None]:
    """(where metrics are defined, what /metrics serves, where build info goes).

    With --workers (prometheus multiprocess mode) every worker writes its values to files in
    ``metrics_dir`` and /metrics serves all workers' sums, whichever worker answers. No
    process or GC collector there: each would describe only the worker answering the scrape
    (its counters seen as resets); the workers write their process figures themselves
    (``metrics_workers.WorkerProcess``) and the python_gc_* series are left out.
    """
    if config.metrics_dir is None:
        reg = registry if registry is not None else default_registry()
        return reg, reg, None
    exposed = CollectorRegistry(auto_describe=True)
    PlatformCollector(registry=exposed)
    MultiProcessCollector(exposed, path=config.metrics_dir)
    return CollectorRegistry(), exposed, exposed


def build_app(
    config: Config,
    registry: CollectorRegistry | None = None,
    batch_store: BatchStore | None = None,
    usage_store: UsageStore | None = None,
    auth_store: AuthStore | None = None,
) -> web.Application:
    """The application; ``batch_store`` (opened by the caller, which reports a database
    that cannot be opened before serving) enables Message Batches and their scheduler;
    ``usage_store`` (likewise) records usage for the usage report (admin keys only);
    ``auth_store`` (likewise) enables Claude Code's sign-in (``[auth]``)."""
    defined, exposed, info = _registries(config, registry)
    traced = None
    if config.telemetry is not None:  # imported only then: the SDK's modules cost memory
        from gateway.http import otel as http_telemetry
        from gateway.ops.telemetry import start

        traced = start(config.telemetry, version=__version__)
    app = web.Application(
        middlewares=[] if traced is None else [http_telemetry.middleware(traced)],
        client_max_size=config.server.max_body_bytes,
    )
    _view(app)
    app[CONFIG] = config
    if config.server.tls and config.server.hsts_max_age:
        app.on_response_prepare.append(_hsts(config.server.hsts_max_age))
    metrics = Metrics(
        defined, info_registry=info, per_worker_process=config.metrics_dir is not None
    )
    app[METRICS] = metrics
    app[SECRETS] = known_secrets(config)
    app[UPSTREAMS] = {
        name: UpstreamClient(
            cfg,
            connections=metrics.upstream_connections.labels(name),
            protocol_errors=metrics.upstream_protocol_errors,
            keepalive=metrics.upstream_keepalive.labels(name),
            metrics=metrics,
            secrets=app[SECRETS],
        )
        for name, cfg in config.upstreams.items()
    }
    for name in config.upstreams:
        metrics.add_upstream(name)
    app[UPSTREAM_CALLS] = Upstreams(app[UPSTREAMS], metrics, app[SECRETS])
    memory, decoding = budgets(
        config.server.memory_budget_mb, config.server.max_decoding_bytes, metrics
    )
    app[DECODER] = decoder = Decoder()
    app[MESSAGES] = MessagesDeps(
        app[UPSTREAM_CALLS],
        config.server.signing_key,
        config.server.keep_billing_header,
        config.server.previous_signing_keys,
        decoding=decoding,
        memory=memory,
        max_restored_bytes=config.server.max_restored_reasoning_bytes,
        pdfs=PdfPool(
            config.server.pdf_workers,
            config.server.pdf_cpu_seconds,
            config.server.pdf_request_cpu_seconds,
        ),
        decode_offload_bytes=config.server.decode_offload_bytes,
        loads_off_loop=(decoder.loads_upstream if config.server.decode_offload_bytes else None),
        run_off_loop=(decoder.run if config.server.decode_offload_bytes else None),
    )
    app[WEB_SEARCH] = Searxng(config.web_search, metrics) if config.web_search is not None else None
    app[WEB_FETCH] = WebFetchService(config, metrics) if config.web_fetch.enabled else None
    app[STATE] = AppState(tenants=Tenants(config), decoding=decoding, memory=memory)
    app[COUNTERS] = _counters(config, metrics)
    for model in config.models.values():
        metrics.add_model(model.name, model.upstream.name, model.upstream_model, model.fallbacks)
        if model.queue_timeout:
            metrics.add_queue(model.name)

    p = config.server.prefix
    tags: dict[str, RouteTag] = {}
    app[ROUTE_TAGS] = tags

    def route(method: str, path: str, handler: Handler, name: str, tag: RouteTag) -> None:
        app.router.add_route(method, path, handler, name=name)
        tags[name] = tag

    route("POST", f"{p}/v1/messages", messages.create_message, "messages", RouteTag("messages"))
    route(
        "POST",
        f"{p}/v1/messages/count_tokens",
        messages.count_tokens,
        "count_tokens",
        RouteTag("count_tokens"),
    )
    app[WINDOWS] = window_watch.Windows()
    if config.server.managed_settings:
        route(
            "GET",
            f"{p}/managed/settings",
            managed_settings.managed_settings,
            "managed_settings",
            RouteTag(None),
        )
    route("GET", f"{p}/v1/models", models.list_models, "models", RouteTag("models"))
    route("GET", f"{p}/v1/models/{{model_id}}", models.get_model, "models_get", RouteTag("models"))
    for api in OPENAI_APIS:
        route(
            "POST",
            f"{p}/v1{api.path}",
            passthrough.handler(api),
            api.name,
            RouteTag(api.name, openai=True),
        )
    app[OPENAI_PATHS] = frozenset(f"{p}/v1{api.path}".encode() for api in OPENAI_APIS)
    not_implemented: tuple[str, ...] = _NOT_IMPLEMENTED
    if batch_store is not None:
        # imported here: the SQL layer costs ~12 MB and a quarter second, only when enabled
        from gateway.batches.scheduler import Scheduler
        from gateway.http import batches as batches_api

        app[BATCH_STORE] = batch_store
        state = app[STATE]
        scheduler = Scheduler(
            config.batches,
            app[MESSAGES],
            batch_store,
            routes=config.models,
            in_flight=state.in_flight,
            draining=lambda: state.draining,
            reply_ended=batch_reply_ended(app),
            spend=charges.batch_spender(app),
        )
        app[SCHEDULER] = scheduler
        app[STATE].on_request_end = scheduler.interactive_ended
        batches_api.add_routes(app, p)
        app.cleanup_ctx.append(batches_api.scheduler_ctx)
        not_implemented = tuple(e for e in not_implemented if e != "messages/batches")
    if config.server.admin_keys:  # the Admin API's usage report: admin keys only
        if usage_store is not None:
            app[usage_api.USAGE] = usage_api.UsageRecorder(usage_store)
            app.cleanup_ctx.append(usage_api.usage_ctx)
        route(
            "GET",
            f"{p}/v1/organizations/usage_report/messages",
            usage_api.usage_report,
            "usage_report",
            RouteTag(None, needs_key=False),  # the handler asks for an admin key
        )
    if auth_store is not None:
        _signin_routes(app, auth_store, route)
    if traced is not None:  # the client's own OTLP, forwarded (404 without [telemetry])
        app[http_telemetry.TELEMETRY] = traced
        route(
            "POST",
            f"{p}/v1/{{signal:(?:traces|metrics|logs)}}",
            http_telemetry.otlp_sink,
            "otlp",
            RouteTag(None),
        )
        app.cleanup_ctx.append(http_telemetry.telemetry_ctx)
    endpoints = "|".join(re.escape(e) for e in not_implemented)
    route(
        "*",
        f"{p}/v1/{{endpoint:(?:{endpoints})(?:/.*)?}}",
        _not_supported,
        "not_supported",
        RouteTag(None, needs_key=False),
    )
    route("HEAD", p or "/", _head_ok, "root", RouteTag(None, needs_key=False))
    if p:
        route("HEAD", p + "/", _head_ok, "root_slash", RouteTag(None, needs_key=False))
    _ops_routes(app, exposed, serve_metrics=not config.server.metrics_apart, metrics_key=True)
    app[OPS_APP] = _ops_app(app, exposed) if config.server.metrics_apart else None
    app.cleanup_ctx.append(_upstreams_ctx)
    app.cleanup_ctx.append(_fleet_ctx)
    app.cleanup_ctx.append(_windows_ctx)
    app.cleanup_ctx.append(_loop_lag_ctx)
    app.cleanup_ctx.append(_pdf_pool_ctx)
    app.cleanup_ctx.append(_web_search_ctx)
    app.cleanup_ctx.append(_web_fetch_ctx)
    app.cleanup_ctx.append(decoder_ctx)
    app.cleanup_ctx.append(_counters_ctx)
    return app


def _signin_routes(
    app: web.Application,
    store: AuthStore,
    route: Callable[[str, str, Handler, str, RouteTag], None],
) -> None:
    """Claude Code's sign-in (gateway/auth/): the OAuth metadata, device and token endpoints
    and the verification page, none asking for a key."""
    # imported here: the sign-in's handlers load the SQL layer, only when enabled
    from gateway.auth import oauth, page
    from gateway.auth.service import SIGNIN, SignIn, signin_ctx

    config = app[CONFIG]
    state = app[STATE]
    p = config.server.prefix
    app[SIGNIN] = SignIn(
        config.auth,
        store,
        lambda: state.tenants,
        p,
        config.batches.public_base_url,
        config.server.signing_key,
        app[METRICS],
    )
    free = RouteTag(None, needs_key=False)
    route("GET", f"{p}/.well-known/oauth-authorization-server", oauth.metadata, "oauth_meta", free)
    route(
        "POST", f"{p}/oauth/device_authorization", oauth.device_authorization, "oauth_device", free
    )
    route("POST", f"{p}/oauth/token", oauth.token, "oauth_token", free)
    route("POST", f"{p}/oauth/revoke", oauth.revoke, "oauth_revoke", free)
    route("GET", f"{p}{oauth.PAGE_PATH}", page.show, "oauth_page", free)
    route("POST", f"{p}{oauth.PAGE_PATH}", page.approve, "oauth_approve", free)
    if config.auth.oidc:
        from gateway.auth import oidc_page

        route("POST", f"{p}{oidc_page.START_PATH}", oidc_page.start, "oauth_oidc", free)
        route("GET", f"{p}{oidc_page.CALLBACK_PATH}", oidc_page.callback, "oauth_oidc_back", free)
    app.cleanup_ctx.append(signin_ctx)


def _hsts(
    max_age: int,
) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """The API listener serves https: every answer (a stream's too, and the sign-in page)
    tells browsers to come back over https only (RFC 6797). Not on plain http, where a
    browser ignores it, nor on the metrics listener, which is plain http."""
    value = f"max-age={max_age}"

    async def add(_: web.Request, response: web.StreamResponse) -> None:
        response.headers["Strict-Transport-Security"] = value

    return add


def _counters(config: Config, metrics: Metrics) -> CounterStore:
    """The clients' counters: in Redis with ``[limits] redis_url_env``, else this process's."""
    if not config.limits.redis_url:
        return LocalStore()
    # imported here: only a gateway sharing its counters loads the Redis client
    from gateway.tenancy.redis_counters import RedisCounters
    from gateway.tenancy.store_errors import StoreErrors

    lim = config.limits
    errors = StoreErrors(metrics.limits_store_errors, lim.on_store_error)
    return RedisCounters(lim.redis_url, lim.store_timeout, errors)


async def _counters_ctx(app: web.Application) -> AsyncIterator[None]:
    """Says once whether the counters are this process's or shared; with Redis, connects
    in the background (a Redis that is down does not stop the start: the first requests
    meet ``on_store_error``), and closes the connection at shutdown."""
    store = app[COUNTERS]
    shared = not isinstance(store, LocalStore)
    _log.info("limits_counters", store="redis" if shared else "local")
    ping = getattr(store, "ping", None)
    task = asyncio.create_task(ping()) if ping is not None else None
    yield
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await store.close()
