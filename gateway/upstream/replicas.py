"""Replicas of one upstream: which one takes a request, and which are fit to.

An upstream configured with ``base_urls`` has one replica per URL, each with its own pool
(gateway/upstream/members.py). This module holds no I/O: the client asks :meth:`Replicas.order`
for the replicas to try, in order, and reports each attempt's outcome back.

Choice (rendezvous, or highest-random-weight, hashing): every replica scores
``hash(session key, replica URL)`` and the highest score wins. The score depends on the key
and that one replica only, so every gateway process picks the same replica for a session
without shared state, and a replica that leaves (ejected, removed) moves only the sessions it
held: each of those goes to its own second choice, everyone else stays. A request without a
key is given the least busy replica.

``balance`` (the upstream's ``balance`` key) picks another first choice, for comparison or for
replicas that share one cache: ``"round_robin"`` takes the replicas in turn, ``"least_busy"``
the one with fewest requests in flight, both ignoring the session key. Health, spill and
retries apply to every policy alike.

Bounded load: a replica whose in-flight requests exceed ``SPILL_FACTOR`` times the average
plus ``SPILL_SLACK`` is passed over for the session's next choice (it keeps its sessions; the
spill lasts only while it is that far above the rest).

Passive health: a failure a replica is to blame for ejects it for ``BACKOFF_START`` seconds,
doubling with each failure in a row up to ``BACKOFF_MAX``. When the time is up the replica is
*on trial*: it takes one request at a time (the first whose order reaches it) until one
succeeds (its reply read whole, not just its head: back in, back-off reset) or fails (ejected
again, for twice as long). When every replica is out, requests still go to them, the one due
back soonest first: a fleet with nowhere else to go does not refuse (and a lone replica is
never ejected).

Evidence, and what outweighs what. Each ejection has a cause (:data:`CAUSES`):

* ``"connect"``: no connection to the replica (refused, connect timeout). Only the replica
  can be at fault.
* ``"probe"``: its active health probe failed (gateway/upstream/fleet.py).
* ``"request"``: it failed a real request after taking it (a 5xx, a timeout, a reset or a
  cut reply). The strongest evidence that it does not serve, and the weakest that it alone
  is to blame: a request can cause it (a body that makes the engine 500, a generation
  longer than the timeout).

A passing probe says the server is up, not that it answers: it brings back a replica out for
``"probe"`` or ``"connect"``, never one out for ``"request"`` (that one comes back only through
a real trial request, its back-off growing; a probe that kept reinstating it put it back in
rotation at every round, a failed request each time). A ``"request"`` failure (but a 503 or a 529:
the replica saying it is busy) is checked against the request: a request (its body's digest,
computed only when it fails) that has failed on another replica within ``BACKOFF_MAX`` is
the request's fault (a *poison* request):
it ejects no one, the first replica it put out is back in (when that was its only failure),
and the client stops sending it to more replicas. And requests put out at most
:func:`request_cap` replicas (half the fleet) at once: a client sending distinct poison
requests cannot empty the fleet, while a replica that fails everyone's requests is still
ejected (the first one out).

The session key is hashed once per request (:func:`session_digest`: its first
``KEY_BYTES`` and its length, to a fixed-size digest); each replica's score combines that
digest with its URL, so the work per replica does not grow with the key. A key is any
``str`` (a header aiohttp decoded with surrogate escapes included) or ``bytes``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

SPILL_FACTOR = 1.5
SPILL_SLACK = 2
BACKOFF_START = 1.0
BACKOFF_MAX = 60.0
MAX_ATTEMPTS = 3  # replicas one request may try before its head
BALANCE = ("affinity", "round_robin", "least_busy")  # the upstream's ``balance`` settings
CAUSES = ("connect", "probe", "request")  # why a replica is out (see the docstring)
KEY_BYTES = 1024  # a session key's leading bytes that are hashed (and a longer one's length)
POISON_MEMORY = 256  # the failed requests' digests kept (each for BACKOFF_MAX)


def session_digest(key: str | bytes) -> bytes:
    """A fixed-size digest of a session key, the work bounded: a key is hashed as UTF-8 (any
    code point, lone surrogates included, so a ``bytes`` key is the ``str`` it encodes), its
    first ``KEY_BYTES`` only, and a longer key's length with them."""
    head = key[:KEY_BYTES]
    raw = head.encode("utf-8", "surrogatepass") if isinstance(head, str) else head
    h = hashlib.blake2b(raw[:KEY_BYTES], digest_size=16)
    if len(raw) > KEY_BYTES or len(key) > KEY_BYTES:  # cut: the length tells them apart
        h.update(b"\0" + len(key).to_bytes(8, "big"))
    return h.digest()


def score(digest: bytes, replica: str) -> int:
    """The rendezvous weight of ``replica`` for a key's ``digest`` (64 bits, the same in
    every process)."""
    h = hashlib.blake2b(digest, digest_size=8, key=replica.encode()[:64])
    return int.from_bytes(h.digest(), "big")


def rendezvous(key: str | bytes, replicas: Sequence[str]) -> list[int]:
    """Indices of ``replicas``, best first for ``key``."""
    digest = session_digest(key)
    return sorted(range(len(replicas)), key=lambda i: score(digest, replicas[i]), reverse=True)


def request_digest(path: str, body: bytes) -> bytes:
    """What names a request when it fails (its route and whole body; bounded by the body
    limit, and computed only on a failure)."""
    h = hashlib.blake2b(path.encode(), digest_size=16)
    h.update(body)
    return h.digest()


def request_cap(replicas: int) -> int:
    """How many of ``replicas`` failed requests may have out at once: half, at least one."""
    return max(1, replicas // 2)


def backoff(failures: int) -> float:
    """Seconds a replica stays out after ``failures`` failures in a row (1, 2, 4, ... 60)."""
    return min(BACKOFF_START * 2.0 ** max(failures - 1, 0), BACKOFF_MAX)


def overloaded(in_flight: int, total: int, count: int) -> bool:
    """``in_flight`` far above the average of ``total`` over ``count`` replicas."""
    return in_flight > SPILL_FACTOR * (total / max(count, 1)) + SPILL_SLACK


@dataclass(eq=False)
class Replica:
    """One replica's live state."""

    index: int
    base_url: str
    in_flight: int = 0
    failures: int = 0  # in a row
    ejected_until: float = 0.0
    trial: bool = False  # a trial request is out
    label: str = field(init=False)
    probe_failed: bool = False  # its last active probe failed (gateway/upstream/fleet.py)
    cause: str = ""  # why it is out (one of CAUSES; "" when in): the strongest seen
    ejected_by: bytes = b""  # the failed request's digest that put it out, if one did

    def __post_init__(self) -> None:
        self.label = urlsplit(self.base_url).netloc.rpartition("@")[2]

    def state(self, now: float) -> str:
        """``healthy``, ``ejected`` (its back-off running) or ``trial`` (due a trial)."""
        if not self.failures:
            return "healthy"
        return "ejected" if now < self.ejected_until else "trial"


class Replicas:
    """The replicas of one upstream: choice, load and passive health.

    ``on_health(replica, healthy)`` is called on each change (a gauge, a log line).
    """

    def __init__(
        self,
        base_urls: Sequence[str],
        *,
        clock: Callable[[], float] = time.monotonic,
        on_health: Callable[[Replica, bool], None] | None = None,
        balance: str = "affinity",
    ) -> None:
        if balance not in BALANCE:
            raise ValueError(f"balance must be one of {', '.join(BALANCE)}, got {balance!r}")
        self.balance = balance
        self._turn = 0  # round_robin: the next replica's index
        self.all = [Replica(i, url) for i, url in enumerate(base_urls)]
        self._urls = [r.base_url for r in self.all]
        self._clock = clock
        self._on_health = on_health
        self.attempts = min(len(self.all), MAX_ATTEMPTS)
        self._serial = len(self.all)  # the next added replica's index
        # a failed request's digest -> the replica it failed on, or None: it failed on two
        # (a poison request); oldest first, at most POISON_MEMORY, each for BACKOFF_MAX
        self._failed_requests: dict[bytes, tuple[int | None, float]] = {}

    @property
    def keyed(self) -> bool:
        """Whether :meth:`order` reads a request's session key (several replicas, affinity):
        a caller makes the key only then."""
        return self.balance == "affinity" and len(self.all) > 1

    def order(self, key: str | bytes | None) -> list[Replica]:
        """The replicas to try for a request, best first (see the module docstring)."""
        replicas = self.all
        if len(replicas) <= 1:  # one, or none yet (a DNS name with no address)
            return list(replicas)
        if self.balance == "round_robin":
            start, self._turn = self._turn, (self._turn + 1) % len(replicas)
            ranked = replicas[start:] + replicas[:start]
        elif key is None or self.balance == "least_busy":
            ranked = sorted(replicas, key=lambda r: r.in_flight)
        else:
            ranked = [replicas[i] for i in rendezvous(key, self._urls)]
        now = self._clock()
        usable = [r for r in ranked if r.failures == 0 or (now >= r.ejected_until and not r.trial)]
        if not usable:  # everyone is out: the soonest back first
            return sorted(ranked, key=lambda r: r.ejected_until)
        total = sum(r.in_flight for r in usable)
        fit = [r for r in usable if not overloaded(r.in_flight, total, len(usable))]
        rest = [r for r in ranked if r not in fit]
        return fit + rest

    def started(self, replica: Replica) -> None:
        replica.in_flight += 1
        if replica.failures and not replica.trial:
            replica.trial = True

    def finished(self, replica: Replica) -> None:
        replica.in_flight -= 1

    def succeeded(self, replica: Replica) -> None:
        replica.trial = False
        if replica.failures:
            replica.failures = 0
            replica.ejected_until = 0.0
            replica.cause = ""
            replica.ejected_by = b""
            if self._on_health is not None:
                self._on_health(replica, True)

    def failed(
        self, replica: Replica, cause: str = "connect", *, request: bytes | None = None
    ) -> bool:
        """A failure of ``replica`` (``cause``, one of :data:`CAUSES`); ``request``: the
        failed request's digest (:func:`request_digest`), for a ``"request"`` failure.

        -> True when the failure is the request's (a poison request: see the module
        docstring): the replica is not ejected, and the request should go to no other."""
        replica.trial = False
        if len(self.all) == 1:  # nowhere else to send its requests: nothing to eject
            return False
        if cause == "request":
            if request is not None and self._poison(replica, request):
                return True
            if not replica.failures and self._out_for_requests() >= request_cap(len(self.all)):
                return False  # enough of the fleet is out for what requests did
            if not replica.failures and request is not None:
                replica.ejected_by = request
        replica.failures += 1
        replica.ejected_until = self._clock() + backoff(replica.failures)
        if replica.cause != "request":  # only a real request's success outweighs that
            replica.cause = cause
        if replica.failures == 1 and self._on_health is not None:
            self._on_health(replica, False)
        return False

    def _poison(self, replica: Replica, request: bytes) -> bool:
        """Whether ``request`` failing on ``replica`` is the request's fault: it failed on
        another replica (or was judged so) within BACKOFF_MAX. Remembers it otherwise."""
        now = self._clock()
        memory = self._failed_requests
        while memory and (
            len(memory) >= POISON_MEMORY or next(iter(memory.values()))[1] <= now - BACKOFF_MAX
        ):
            del memory[next(iter(memory))]
        seen = memory.pop(request, None)
        if seen is None or seen[0] == replica.index:
            memory[request] = (replica.index, now)
            return False
        memory[request] = (None, now)  # judged: it ejects no one while remembered
        first = next((r for r in self.all if r.index == seen[0]), None)
        if first is not None and first.failures == 1 and first.ejected_by == request:
            self.succeeded(first)  # the request put it out, nothing else did
        return True

    def _out_for_requests(self) -> int:
        return sum(1 for r in self.all if r.failures and r.cause == "request")

    # Membership (DNS discovery, gateway/upstream/discovery.py). A removed replica takes no
    # new request; the ones it holds finish (their outcomes still reported, harmlessly).

    def add(self, base_url: str) -> Replica:
        """A new replica, healthy, with an index no other replica of this set has had."""
        replica = Replica(self._serial, base_url)
        self._serial += 1
        self.all.append(replica)
        self._members_changed()
        return replica

    def remove(self, replica: Replica) -> None:
        self.all.remove(replica)
        self._members_changed()

    def _members_changed(self) -> None:
        self._urls = [r.base_url for r in self.all]
        self.attempts = min(len(self.all), MAX_ATTEMPTS)

    def probed(self, replica: Replica, ok: bool, hold: float) -> None:
        """An active probe's outcome (gateway/upstream/fleet.py).

        A failed probe ejects the replica as a failed request does (the same back-off), and
        for at least ``hold`` seconds (until the next probe has had its chance), so no trial
        request reaches it while its probes fail. A passing probe brings back a replica out
        for its probes or refused connections; one out for failed *requests* is left to its
        back-off and trial (a health route that answers says the server is up, not that it
        generates).
        """
        if not ok:
            replica.probe_failed = True
            if len(self.all) > 1:
                self.failed(replica, "probe")
                replica.ejected_until = max(replica.ejected_until, self._clock() + hold)
            return
        replica.probe_failed = False
        if replica.failures and replica.cause != "request":
            self.succeeded(replica)
