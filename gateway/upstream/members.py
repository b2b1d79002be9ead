"""The replicas of one upstream as a set that changes: who is in, their pools and request
targets, their metric series, their active health probes, and DNS discovery's joins and leaves.

:class:`Members` is the upstream client's (gateway/upstream/client.py) view of its fleet; the
client's request path asks it for the replicas to try (``replicas``, gateway/upstream/replicas.py),
a replica's pool and target paths, and reports each request's start and end to it.

* A static upstream has one replica per ``base_urls`` entry (or the one ``base_url``), each
  with its pool, opened by :meth:`Members.start` and closed by :meth:`Members.close`.
* With ``discover = "dns"`` the replicas are the addresses ``base_url``'s name resolves to
  (gateway/upstream/discovery.py; ``resolve`` replaces the system resolver, for tests):
  :meth:`Members.resolve_now` joins and removes them; a removed replica takes no new request
  and its pool is closed once the requests it holds have finished. A replica's label is
  ``host:port#slot`` with at most ``2 * max_replicas`` slots, so the series stay bounded.
* Active probes (``health_interval``; gateway/upstream/fleet.py runs the rounds) GET each
  replica's health route and report the outcome to :class:`Replicas`.

``metrics`` (gateway/ops/metrics.py), when given, gets the per-replica series: in flight,
healthy, requests by outcome, probes by outcome; a replica that leaves has its series removed
(not under ``--workers``, where the multiprocess files keep them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import structlog

from gateway import errors
from gateway.ops.config import UpstreamConfig
from gateway.upstream import discovery
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Replica, Replicas

_log = structlog.get_logger("gateway.upstream")

# the ``outcome`` label of llm_gateway_upstream_probes_total
PROBE_OUTCOMES = ("ok", "status", "timeout", "error")
# the ``outcome`` label of llm_gateway_upstream_replica_requests_total
REPLICA_OUTCOMES = ("ok", "status_5xx", "connect_error", "timeout", "bad_response")

_CLOSING: set[asyncio.Task[None]] = set()  # strong references to the pools closing

# (replica, its address under DNS discovery, else None) -> the replica's pool
MakePool = Callable[[Replica, str | None], Pool]


class Members:
    """The replicas of one upstream, their pools and series; see the module docstring."""

    def __init__(
        self,
        cfg: UpstreamConfig,
        *,
        make_pool: MakePool,
        metrics: Any = None,
        resolve: discovery.Resolve | None = None,
    ) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.discover = cfg.discover == "dns"
        self._make_pool = make_pool
        self._metrics = metrics
        self._resolve = resolve or discovery.resolve
        urls = () if self.discover else cfg.replica_urls
        self._config_hosts = hosts_of(cfg.replica_urls)
        self.hosts = self._config_hosts
        self.replicas = Replicas(urls, on_health=self._health_changed, balance=cfg.balance)
        # replica index -> (the base URL's path, the engine's root path)
        self.targets = {r.index: _paths(r.base_url) for r in self.replicas.all}
        self.pools: dict[int, Pool] = {}
        # DNS discovery: address -> its replica; replica index -> its label's slot; the
        # removed replicas whose requests are still running (their pools closed after)
        self._addresses: dict[str, Replica] = {}
        self._slots: dict[int, int] = {}
        self._leaving: dict[int, Replica] = {}
        self._resolve_failing = False
        self.started_up = False  # between start() and close() (an attribute: read per request)
        # replica index -> its requests_total children by outcome, and its in-flight child
        # where that is written per request (under --workers; else read at scrape time):
        # made once, kept until its series go (Memo's cache is cleared when any leaves)
        self._requests: dict[int, dict[str, Any]] = {}
        self._in_flight: dict[int, Any] = {}
        if metrics is not None:
            for replica in self.replicas.all:
                self._replica_series(replica)
            metrics.upstream_replicas.labels(self.name).set(len(self.replicas.all))
            for outcome in discovery.RESOLUTION_OUTCOMES if self.discover else ():
                metrics.upstream_resolutions.labels(self.name, outcome)

    def _replica_series(self, replica: Replica) -> None:
        m = self._metrics
        in_flight = m.upstream_replica_in_flight.labels(self.name, replica.label)
        if not in_flight.read_from(lambda: replica.in_flight):
            self._in_flight[replica.index] = in_flight
        m.upstream_replica_healthy.labels(self.name, replica.label).set(1)
        self._requests[replica.index] = {
            outcome: m.upstream_replica_requests.labels(self.name, replica.label, outcome)
            for outcome in REPLICA_OUTCOMES
        }
        if self.cfg.health_interval:
            for outcome in PROBE_OUTCOMES:
                m.upstream_probes.labels(self.name, replica.label, outcome)
        m.upstream_retries.labels(self.name)

    def _drop_series(self, replica: Replica) -> None:
        """A replica that left: its series go (not under --workers, where the multiprocess
        files keep them; its slot's label is bounded all the same)."""
        m = self._metrics
        if m is None or m.process is not None:
            return
        m.upstream_replica_in_flight.remove(self.name, replica.label)
        m.upstream_replica_healthy.remove(self.name, replica.label)
        for outcome in REPLICA_OUTCOMES:
            m.upstream_replica_requests.remove(self.name, replica.label, outcome)
        for outcome in PROBE_OUTCOMES if self.cfg.health_interval else ():
            m.upstream_probes.remove(self.name, replica.label, outcome)

    async def start(self) -> None:
        """Open a pool per replica; under ``discover = "dns"``, resolve the name first (a
        failure or no address leaves no replica: requests get a 529 until one resolves)."""
        self.started_up = True
        self.pools = {r.index: self._make_pool(r, None) for r in self.replicas.all}
        if self.discover:
            await self.resolve_now()
        if self.cfg.health_interval:  # ready means each replica has had one probe
            await self.probe_all()

    async def close(self) -> None:
        self.started_up = False
        pools, self.pools = self.pools, {}
        self._leaving.clear()
        for pool in pools.values():
            await pool.close()

    # Active health probes (gateway/upstream/fleet.py runs them)

    async def probe_all(self) -> None:
        """One probe of every replica at once, each within ``health_timeout``."""
        await asyncio.gather(*(self.probe(r) for r in list(self.replicas.all)))

    async def probe(self, replica: Replica) -> str:
        """GET the replica's health route (``health_path`` at its server root, beside
        ``/v1``) and report the outcome to :class:`Replicas`; -> the outcome."""
        pool = self.pools.get(replica.index)
        if pool is None:
            return "error"
        cfg = self.cfg
        status = 0
        try:
            path = cfg.health_path or ("/api/version" if cfg.kind == "ollama" else "/health")
            status = await pool.probe(self.targets[replica.index][1] + path, cfg.health_timeout)
            outcome = "ok" if 200 <= status < 300 else "status"
        except TimeoutError:
            outcome = "timeout"
        except Exception:  # (refused, reset, TLS, no status line: all "error")
            outcome = "error"
        if replica.index not in self.pools:  # it left while the probe was out
            return outcome
        if self._metrics is not None:
            self._metrics.upstream_probes.labels(self.name, replica.label, outcome).inc()
        was = replica.probe_failed
        # out at least until the next probe has had its chance (a round, then the interval)
        self.replicas.probed(
            replica, outcome == "ok", hold=cfg.health_interval + 2 * cfg.health_timeout
        )
        if replica.probe_failed != was:
            _log.info(
                "upstream_probe",
                upstream=self.name,
                replica=replica.label,
                outcome=outcome,
                **({"status": status} if status else {}),
            )
        return outcome

    # DNS discovery (gateway/upstream/discovery.py)

    async def resolve_now(self) -> None:
        """Resolve the name once and apply the change; a failure keeps the set."""
        host, port = discovery.target(self.cfg.base_url)
        try:
            async with asyncio.timeout(discovery.RESOLVE_TIMEOUT):
                answer = await self._resolve(host, port)
        except Exception as exc:  # (gaierror, OSError, a timeout: all a failure)
            self._resolved("failed", error=type(exc).__name__)
            return
        if not answer:
            self._resolved("empty")
            return
        cap = self.cfg.max_replicas
        change = discovery.diff(list(self._addresses), answer, cap)
        for address in change.leave:
            self._leave(address)
        joined = [a for a in change.join if self._join(address=a)]
        over = change.over + len(change.join) - len(joined)
        self._resolved("ok")
        if change.leave or joined or over:
            _log.info(
                "upstream_replicas_changed",
                upstream=self.name,
                joined=joined,
                left=list(change.leave),
                replicas=len(self.replicas.all),
                **({"over_cap": over} if over else {}),
            )
        if self._metrics is not None:
            self._metrics.upstream_replicas.labels(self.name).set(len(self.replicas.all))

    def _resolved(self, outcome: str, **fields: Any) -> None:
        if self._metrics is not None:
            self._metrics.upstream_resolutions.labels(self.name, outcome).inc()
        failing = outcome != "ok"
        if failing != self._resolve_failing:  # one line per change, not one per interval
            self._resolve_failing = failing
            if failing:
                _log.warning(
                    "upstream_resolve_failed",
                    upstream=self.name,
                    outcome=outcome,
                    replicas=len(self.replicas.all),
                    **fields,
                )
            else:
                _log.info("upstream_resolve_recovered", upstream=self.name)

    def _join(self, *, address: str) -> bool:
        """A new replica at ``address``; False when every label slot is held (replicas
        that left still finishing their requests)."""
        used = set(self._slots.values())
        slot = next((n for n in range(2 * self.cfg.max_replicas) if n not in used), None)
        if slot is None:
            return False
        replica = self.replicas.add(discovery.replica_url(self.cfg.base_url, address))
        netloc = urlsplit(self.cfg.base_url).netloc.rpartition("@")[2]
        replica.label = f"{netloc}#{slot}"
        self._slots[replica.index] = slot
        self._addresses[address] = replica
        self.targets[replica.index] = _paths(replica.base_url)
        if self.started_up:
            self.pools[replica.index] = self._make_pool(replica, address)
        self._members_changed()
        if self._metrics is not None:
            self._replica_series(replica)
        _log.info(
            "upstream_replica_joined", upstream=self.name, replica=replica.label, address=address
        )
        return True

    def _leave(self, address: str) -> None:
        replica = self._addresses.pop(address)
        self.replicas.remove(replica)
        self._members_changed()
        _log.info(
            "upstream_replica_left",
            upstream=self.name,
            replica=replica.label,
            address=address,
            in_flight=replica.in_flight,
        )
        if replica.in_flight > 0:
            self._leaving[replica.index] = replica  # closed when its last request ends
        else:
            self._retire(replica)

    def _retire(self, replica: Replica) -> None:
        """A replica that left and holds no request: its pool closed, its slot free."""
        self._leaving.pop(replica.index, None)
        pool = self.pools.pop(replica.index, None)
        self.targets.pop(replica.index, None)
        self._slots.pop(replica.index, None)
        self._requests.pop(replica.index, None)
        self._in_flight.pop(replica.index, None)
        self._drop_series(replica)
        if pool is not None:
            task = asyncio.get_running_loop().create_task(pool.close())
            _CLOSING.add(task)
            task.add_done_callback(_CLOSING.discard)

    def _members_changed(self) -> None:
        self.hosts = tuple(
            dict.fromkeys(self._config_hosts + hosts_of([r.base_url for r in self.replicas.all]))
        )

    # Each request's start and end on a replica (the client's request path reports them)

    def _series(self, replica: Replica) -> bool:
        """Whether ``replica``'s metric series may be written: not once it has left and its
        series are gone (its slot's label may be another replica's by then)."""
        return self._metrics is not None and (replica.index in self.pools or not self.started_up)

    def _health_changed(self, replica: Replica, healthy: bool) -> None:
        if self._series(replica):
            self._metrics.upstream_replica_healthy.labels(self.name, replica.label).set(
                1 if healthy else 0
            )
        _log.info(
            "upstream_replica_health", upstream=self.name, replica=replica.label, healthy=healthy
        )

    def count(self, replica: Replica, outcome: str) -> None:
        """One request's outcome on ``replica`` (one of ``REPLICA_OUTCOMES``)."""
        requests = self._requests.get(replica.index)  # none once its series are gone
        if requests is not None:
            requests[outcome].inc()

    def started(self, replica: Replica) -> None:
        self.replicas.started(replica)
        in_flight = self._in_flight.get(replica.index)
        if in_flight is not None:
            in_flight.inc()

    def finished(self, replica: Replica, exc: BaseException | None = None) -> None:
        """A request's in-flight count on ``replica`` ends; a body that failed in a way the
        replica is to blame for (a timeout, a lost connection) ejects it."""
        self.replicas.finished(replica)
        in_flight = self._in_flight.get(replica.index)
        if in_flight is not None:
            in_flight.dec()
        if exc is not None and isinstance(exc, errors.UpstreamTimeout | errors.UpstreamUnavailable):
            self.replicas.failed(replica, "request")  # it had taken the request
        if replica.in_flight <= 0 and replica.index in self._leaving:
            self._retire(replica)


def _paths(base_url: str) -> tuple[str, str]:
    """(the base URL's path, the engine's root path) for request targets."""
    path = base_url.split("://", 1)[-1].partition("/")[2].rstrip("/")
    path = "/" + path if path else ""
    # llama.cpp's and vLLM's /tokenize, /apply-template live beside /v1, not under it
    return path, path[:-3] if path.endswith("/v1") else path


def hosts_of(urls: Iterable[str]) -> tuple[str, ...]:
    """What the scrubber removes for these URLs: each host:port, host, and the URL (a
    userinfo in the URL is no part of the host an upstream's text names)."""
    hosts: list[str] = []
    for url in urls:
        netloc = urlsplit(url).netloc
        host = netloc.rpartition("@")[2]
        hosts += [netloc, host, host.rsplit(":", 1)[0], url]
    return tuple(dict.fromkeys(hosts))
