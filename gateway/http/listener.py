"""Listening sockets and their accept loop, owned here rather than by the event loop.

asyncio's and uvloop's servers accept on their own, and neither lets a program see an
accept() that fails for lack of file descriptors: asyncio hands each failure to the loop's
exception handler (hundreds of calls a second while it lasts), and libuv (uvloop) closes a
descriptor it keeps in reserve, accepts every pending connection and closes it at once, so
clients see a reset and nothing is logged. Here the listening socket is watched with
``loop.add_reader``, accepted with ``socket.accept()`` and each connection handed to
``loop.connect_accepted_socket`` (public API on both loops; asyncio's own server also
finishes an accept in a task), so that:

* an accept() failing with EMFILE, ENFILE, ENOBUFS or ENOMEM is counted
  (``llm_gateway_accept_errors_total{reason}``), logged as one ``accept_failed`` warning,
  and accepting pauses for :data:`RETRY_AFTER` seconds; pending connections wait in the
  kernel's backlog meanwhile instead of being dropped;
* ``max_connections`` pauses accepting while that many connections are open: the backlog
  holds the next ones (past it the kernel drops SYNs and clients retry), instead of the
  process holding a descriptor and a protocol for each.

With :attr:`Listener.tls` set (``server.tls_cert_file``), the loop runs the TLS handshake
before the protocol is made (``connect_accepted_socket(ssl=..., ssl_handshake_timeout=...)``
on both loops); a connection in its handshake counts against ``max_connections``. Both loops
end a handshake that outlasts its timeout with ``ConnectionAbortedError`` and report a
failed one as the ``ssl.SSLError`` OpenSSL raised (an ``OSError``: neither goes to the loop's
exception handler); OpenSSL's reason for a plain-HTTP request line is ``HTTP_REQUEST``. Each
failure is counted in ``llm_gateway_client_http_errors_total`` (``tls_handshake_timeout``,
``http_on_tls``, else ``tls_handshake``) and logged as one ``tls_handshake_failed`` line. The
context is read for each connection, so replacing it (a renewed certificate on SIGHUP)
serves the next handshakes and leaves open connections as they are.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
from collections.abc import Callable

import structlog

from gateway.ops.metrics import Metrics

_log = structlog.get_logger("gateway.http.listener")

RETRY_AFTER = 1.0  # seconds accepting pauses after a failed accept() (asyncio's delay)
BACKLOG = 2048
_BATCH = 64  # accepts per readiness event, so one listener cannot starve the loop
_ACCEPT_ERRNOS = {
    errno.EMFILE: "emfile",
    errno.ENFILE: "enfile",
    errno.ENOBUFS: "enobufs",
    errno.ENOMEM: "enomem",
}
_CAP_LOG_EVERY = 10.0  # seconds between two max_connections_reached lines


def bind(
    host: str, port: int, *, reuse_port: bool = False, backlog: int = BACKLOG
) -> list[socket.socket]:
    """Non-blocking listening sockets on every address of ``host`` (as asyncio binds them:
    SO_REUSEADDR, IPv6 sockets v6-only, SO_REUSEPORT when asked)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, addr in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


class Listener:
    """Accepts on ``sockets`` and serves each connection with ``factory()``'s protocol.

    The protocol calls :meth:`opened` and :meth:`closed` (the connection count the cap
    reads).
    """

    def __init__(
        self,
        name: str,
        sockets: list[socket.socket],
        factory: Callable[[], asyncio.Protocol],
        *,
        max_connections: int,
        metrics: Metrics,
        tls: ssl.SSLContext | None = None,
        handshake_timeout: float = 30.0,
    ) -> None:
        self.name = name
        self.tls = tls  # read for each new connection
        self._handshake_timeout = handshake_timeout
        self._sockets = sockets
        self._factory = factory
        self._cap = max_connections
        self._metrics = metrics
        self._loop = asyncio.get_running_loop()
        self._open = 0  # connections whose protocol is made and not yet lost
        self._pending = 0  # accepted, protocol not yet made
        self._reading = False
        self._closed = False
        self._retry: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._cap_logged = -_CAP_LOG_EVERY

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [sock.getsockname()[:2] for sock in self._sockets]

    @property
    def connections(self) -> int:
        return self._open + self._pending

    def start(self) -> None:
        self._resume()

    def close(self) -> None:
        """Stop accepting and close the listening sockets (open connections stay)."""
        self._closed = True
        self._pause()
        if self._retry is not None:
            self._retry.cancel()
        for sock in self._sockets:
            sock.close()
        for task in self._tasks:
            task.cancel()

    def opened(self) -> None:
        self._open += 1

    def closed(self) -> None:
        self._open -= 1
        if not self._reading and self._retry is None and not self._full():
            self._resume()

    def _full(self) -> bool:
        return bool(self._cap) and self._open + self._pending >= self._cap

    def _resume(self) -> None:
        if self._reading or self._closed:
            return
        self._reading = True
        for sock in self._sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _pause(self) -> None:
        if not self._reading:
            return
        self._reading = False
        for sock in self._sockets:
            self._loop.remove_reader(sock.fileno())

    def _retry_now(self) -> None:
        self._retry = None
        if not self._full():
            self._resume()

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(_BATCH):
            if self._full():
                self._pause()
                self._log_cap()
                return
            try:
                conn, _addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # the client gave up while in the backlog
            except OSError as exc:
                self._failed(exc)
                return
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._pending += 1
            task = self._loop.create_task(self._connect(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connect(self, conn: socket.socket) -> None:
        tls = self.tls
        try:
            if tls is None:
                await self._loop.connect_accepted_socket(self._factory, conn)
            else:
                await self._loop.connect_accepted_socket(
                    self._factory,
                    conn,
                    ssl=tls,
                    ssl_handshake_timeout=self._handshake_timeout,
                )
        except asyncio.CancelledError:
            conn.close()
        except OSError as exc:
            conn.close()
            if tls is not None:
                self._handshake_failed(exc)
        finally:
            self._pending -= 1
            if not self._reading and self._retry is None and not self._full():
                self._resume()

    def _handshake_failed(self, exc: OSError) -> None:
        kind = handshake_failure(exc)
        self._metrics.client_http_errors.labels(kind).inc()
        # OpenSSL's mnemonic (e.g. WRONG_VERSION_NUMBER), never its message or peer bytes
        reason = exc.reason if isinstance(exc, ssl.SSLError) else type(exc).__name__
        _log.info("tls_handshake_failed", listener=self.name, kind=kind, reason=reason)

    def _failed(self, exc: OSError) -> None:
        reason = _ACCEPT_ERRNOS.get(exc.errno or 0, "other")
        self._metrics.accept_errors.labels(reason).inc()
        _log.warning(
            "accept_failed",
            listener=self.name,
            reason=reason,
            errno=exc.errno,
            open_connections=self._open,
            retry_in_s=RETRY_AFTER,
        )
        self._pause()
        if self._retry is None and not self._closed:
            self._retry = self._loop.call_later(RETRY_AFTER, self._retry_now)

    def _log_cap(self) -> None:
        now = self._loop.time()
        if now - self._cap_logged >= _CAP_LOG_EVERY:
            self._cap_logged = now
            _log.warning(
                "max_connections_reached",
                listener=self.name,
                max_connections=self._cap,
                detail="accepting paused; new connections wait in the backlog",
            )


def handshake_failure(exc: OSError) -> str:
    """The ``client_http_errors`` kind of a failed TLS handshake."""
    if isinstance(exc, ConnectionAbortedError | TimeoutError):
        return "tls_handshake_timeout"
    if isinstance(exc, ssl.SSLError) and exc.reason == "HTTP_REQUEST":
        return "http_on_tls"
    return "tls_handshake"
