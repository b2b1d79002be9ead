"""CLI: arguments -> config -> logging -> serve until SIGTERM/SIGINT, then drain; SIGHUP
re-reads the config file's clients and keys (gateway/http/reload.py).

    python -m gateway --config FILE [--host H] [--port P]
    python -m gateway                  # the built-in default config
    python -m gateway --check-config   # validate, open the batch store, exit (0, 1 or 2)
    python -m gateway --health-check   # GET /health at the config's host:port (0 or 1)
    llm-gateway --demo                 # + an embedded llama.cpp upstream serving `demo`
    llm-gateway --workers N ...        # N processes on one port (SO_REUSEPORT)

Exit status: 0 after a clean shutdown, 2 for a bad config or bad arguments, 1 when a
batch database the config names cannot be opened (or the listener cannot bind). The default
batch database (in the state directory) that cannot be kept turns batches off instead.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import os
import resource
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from gateway import __version__, stores
from gateway.ops import config, log, notify
from gateway.ops.config_schema import ServerConfig

if TYPE_CHECKING:
    from gateway.ops.tls import Served


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="llm-gateway",
        description=("Anthropic Messages API gateway in front of OpenAI-compatible upstreams."),
    )
    ap.add_argument("--config", help="TOML config file (default: $GATEWAY_CONFIG, else built-in)")
    ap.add_argument("--host", help="listen address (overrides server.host)")
    ap.add_argument("--port", type=int, help="listen port (overrides server.port)")
    ap.add_argument(
        "--check-config",
        action="store_true",
        help="validate the config, open the batch store, and exit",
    )
    ap.add_argument(
        "--health-check",
        action="store_true",
        help="ask the running gateway's /health (the config's host and port) and "
        "exit 0 if it answers 200, else 1 (a container HEALTHCHECK)",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="run N worker processes on one port (SO_REUSEPORT); default 1",
    )
    ap.add_argument(
        "--demo",
        action="store_true",
        help="start an embedded llama.cpp upstream serving a tiny model as `demo`",
    )
    ap.add_argument("--version", action="version", version=f"llm-gateway {__version__}")
    return ap.parse_args(argv)


async def _serve(
    cfg: config.Config,
    notifier: notify.Notifier | None = None,
    reread: tuple[config.Config, Callable[[], config.Config]] | None = None,
) -> None:
    """Serve ``cfg`` until SIGTERM/SIGINT. ``reread``: (the config as loaded, how to load it
    again): SIGHUP applies a new file's clients and keys."""
    # imported here: --check-config and --health-check (a container's HEALTHCHECK, every few
    # seconds under a short timeout) need none of the HTTP shell, half a second of imports
    from aiohttp import web

    from gateway.app import build_app
    from gateway.http.keys import METRICS, OPENAI_PATHS, OPS_APP, STATE
    from gateway.http.protocol import listen
    from gateway.http.reload import Reloader

    logger = structlog.get_logger("gateway")
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(log.loop_exception_handler)
    fd_limit = _raise_fd_limit()
    store = stores.start_batch_store(cfg)
    app = build_app(
        cfg,
        batch_store=store,
        usage_store=stores.open_usage_store(cfg),
        auth_store=stores.open_auth_store(cfg),
    )
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    assert runner.server is not None
    runners = [runner]
    ops_app = app[OPS_APP]
    if ops_app is not None:  # server.metrics_port: the metrics listener's own application
        runners.append(
            web.AppRunner(ops_app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        )
        await runners[1].setup()
    served = _tls_context(cfg.server)
    frozen = settle_heap()  # before a client can wait on it
    try:
        listeners = listen(
            runner.server,
            cfg.server,
            app[METRICS],
            ops_server=runners[1].server if ops_app is not None else None,
            openai_paths=app[OPENAI_PATHS],
            reuse_port=cfg.reuse_port,
            tls=served.context if served is not None else None,
        )
    except OSError as exc:
        logger.error(
            "listen_failed",
            host=cfg.server.host,
            port=cfg.server.port,
            metrics_port=cfg.server.metrics_port or None,
            errno=exc.errno,
            detail=exc.strerror,
        )
        for r in reversed(runners):
            await r.cleanup()
        raise SystemExit(1) from None
    if served is not None:
        # what Claude Code's sign-in shows and pins, to compare on first contact
        logger.info(
            "tls_certificate",
            cert_file=cfg.server.tls_cert_file,
            fingerprint_sha256=served.fingerprint,
            fingerprint_sha256_colons=served.fingerprint_colons,
        )
    logger.info(
        "listening",
        host=cfg.server.host,
        port=cfg.server.port,
        scheme="https" if served is not None else "http",
        prefix=cfg.server.prefix,
        models=sorted(cfg.models),
        config=cfg.source,
        metrics=_metrics_address(cfg.server),
        fd_limit=fd_limit,
        frozen_objects=frozen,
    )
    for event, detail in start_warnings(cfg, batches=store is not None):
        logger.warning(event, detail=detail)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if reread is not None:
        reloader = Reloader(app, *reread, listener=listeners[0] if served is not None else None)
        loop.add_signal_handler(signal.SIGHUP, reloader.request)
    # bound and listening, and SIGTERM drains: a stop that follows READY=1 is a clean one
    if notifier is not None:
        notifier.send("READY=1")
    await stop.wait()
    state = app[STATE]
    state.draining = True
    if notifier is not None:
        notifier.send("STOPPING=1")
    logger.info(
        "draining", grace_s=cfg.server.shutdown_grace, in_flight=sum(state.in_flight.values())
    )
    deadline = loop.time() + cfg.server.shutdown_grace
    while sum(state.in_flight.values()) and loop.time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)  # a poll: requests finish in many places
    for handle in list(state.streams):
        handle.drain()
    while sum(state.in_flight.values()) and loop.time() < deadline + 2.0:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    for listener in listeners:
        listener.close()
    for r in reversed(runners):
        await r.cleanup()
    logger.info("stopped")


def _tls_context(server: ServerConfig) -> Served | None:
    """The API listener's TLS (None: plain http). The pair was checked when the config was
    loaded; one changed since then stops the start as a bad config would."""
    if not server.tls:
        return None
    from gateway.ops import tls

    try:
        return tls.load(*server.tls_files)
    except tls.TLSError as exc:
        structlog.get_logger("gateway").error("config_error", detail=f"server.{exc.key}: {exc}")
        raise SystemExit(2) from None


def settle_heap() -> int:
    """Move what the start made (modules, classes, the app: about 55,000 objects, none of
    them ever garbage) out of the collector's reach; -> how many objects. A full collection
    walks every tracked object, and one came every few seconds under load (a batch create's
    parse, a large reply's translation), each a stop of the event loop: 90-120 ms measured in
    a gateway beside a 20,000-request batch create, on a loaded 2-core machine. Frozen, a
    collection walks only what requests made since."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def start_warnings(cfg: config.Config, *, batches: bool) -> list[tuple[str, str]]:
    """(event, detail) of each warning the start logs about the config it runs with."""
    out = []
    if cfg.server.signing_key_source == "random":
        out.append(
            (
                "signing_key_ephemeral",
                "no server.signing_key_env and no writable state directory: thinking "
                "signatures made now stop opening after a restart",
            )
        )
    if not cfg.server.api_keys:
        out.append(
            (
                "auth_disabled",
                "no API keys configured (server.api_keys_env); every client is accepted",
            )
        )
        if batches:
            # batches are owned by the client key that made them; without keys, all by one
            out.append(
                (
                    "batches_unowned",
                    "message batches are on without client keys (server.api_keys_env): "
                    "every client can list, read, cancel and delete every batch and "
                    "its results; set api_keys_env, or batches.enabled = false",
                )
            )
    return out


def _check_config(cfg: config.Config) -> int:
    """--check-config: the config, then the batch store start-up would open (and close)."""
    from gateway.batches.store import StoreError

    try:
        store, off = stores.open_batch_store(cfg.batches)
    except StoreError as exc:
        print(f"llm-gateway: batch store error: {exc}", file=sys.stderr)
        return 1
    if store is not None:
        asyncio.run(store.close())
    print(f"llm-gateway: config ok: {cfg.source} ({len(cfg.models)} models)")
    if off is not None:
        print(
            f"llm-gateway: warning: batches would be disabled: {off[1]}; {stores.STATE_FIX}",
            file=sys.stderr,
        )
    return 0


def _health_check(server: ServerConfig) -> int:
    """--health-check: GET /health on the API listener (it serves /health whether or not
    server.metrics_port is set) at the config's host and port, a wildcard host asked on
    loopback; no proxy from the environment is used. With TLS it asks over https without
    checking the certificate: the question is whether this gateway answers, and the name
    the certificate carries need not be the loopback address asked."""
    import ssl
    import urllib.request

    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(server.host, server.host)
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if server.tls else "http"
    url = f"{scheme}://{host}:{server.port}/health"
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if server.tls:
        unverified = ssl.create_default_context()
        unverified.check_hostname = False
        unverified.verify_mode = ssl.CERT_NONE
        handlers.append(urllib.request.HTTPSHandler(context=unverified))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(url, timeout=2) as resp:
            ok = resp.status == 200
    except OSError as exc:
        print(f"llm-gateway: health check {url}: {exc}", file=sys.stderr)
        return 1
    return 0 if ok else 1


def _metrics_address(server: ServerConfig) -> str:
    if not server.metrics_apart:
        return "api listener"
    return f"{server.metrics_host or server.host}:{server.metrics_port}"


def _raise_fd_limit() -> int:
    """Lift the soft limit on open files to the hard one (each client connection holds a
    descriptor; systemd's default soft limit is 1,024); the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (OSError, ValueError):
            pass
    return soft


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        cfg = config.load(args.config, os.environ)
        cfg = config.with_overrides(cfg, host=args.host, port=args.port)
    except config.ConfigError as exc:
        print(f"llm-gateway: config error: {exc}", file=sys.stderr)
        return 2
    if args.health_check:
        return _health_check(cfg.server)
    if args.check_config:
        return _check_config(cfg)
    log.configure(cfg.server.log_level, journal_stream=os.environ.get("JOURNAL_STREAM"))
    # a reload asked for before the handler is in place (or of the supervisor) is not a stop
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    reread = (cfg, functools.partial(_reread, args))
    notifier = notify.Notifier(os.environ.get("NOTIFY_SOCKET"))
    if args.workers < 1:
        print("llm-gateway: --workers must be >= 1", file=sys.stderr)
        return 2
    if args.workers > 1:
        if args.demo or cfg.server.port == 0:
            print(
                "llm-gateway: --workers needs a fixed port and cannot run --demo", file=sys.stderr
            )
            return 2
        from gateway.ops.workers import strip_workers_flag, supervise

        return supervise(
            strip_workers_flag(sys.argv[1:] if argv is None else argv),
            args.workers,
            cfg.metrics_dir,
            notifier,
        )
    if args.demo:
        from gateway.demo.run import run_demo

        explicit = bool(args.config or os.environ.get("GATEWAY_CONFIG"))
        serve = functools.partial(_serve, notifier=notifier, reread=reread)
        return run_demo(cfg, serve, explicit_config=explicit)
    _run(_serve(cfg, notifier, reread))
    return 0


def _reread(args: argparse.Namespace) -> config.Config:
    """The config again, as main() loads it: the same file, the environment, the overrides."""
    cfg = config.load(args.config, os.environ)
    return config.with_overrides(cfg, host=args.host, port=args.port)


def _run(main: object) -> None:
    """asyncio.run on uvloop when it is installed (less CPU per request and per chunk)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)  # type: ignore[arg-type]
        return
    uvloop.run(main)  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
