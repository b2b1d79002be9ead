"""A client's limits applied to one request, as the Anthropic API applies its own: what a
request takes from its client's meters, the 429 that refuses it, the ``anthropic-ratelimit-*``
headers of every answer, and the settling of what the reply really used. Pure logic on a
:class:`~gateway.tenancy.counters.CounterStore`; the HTTP layer (gateway/http/charges.py)
wires it and decides what a store error means.

Per request of a client with limits, ONE take from its meters (:class:`Plan`), before the
upstream is called, in the same store call as its concurrency lease
(:meth:`CounterStore.enter_take`; the end's settle and lease return are one call too):

* ``{client}:rpm``: 1 request (``requests_per_minute``);
* ``{client}:itpm``: the request's input tokens, estimated (``input_tokens_per_minute``);
* ``{client}:otpm``: its ``max_tokens`` (``output_tokens_per_minute``): the API estimates
  output from ``max_tokens`` at the start and adjusts at the end;
* ``{client}:tpd``: the estimate plus ``max_tokens`` (``tokens_per_day``, over 86,400 s).

The input estimate is the request body's length over four (the body is already read, so this
costs nothing; :func:`gateway.messages.tokens.estimate_from_bytes`, the rule count_tokens
uses where the engine has no tokenizer route). It over-counts base64 images and documents;
a need is capped at the meter's limit, so such a request waits for a full meter, never for
ever. The reply's usage then settles each token meter by the difference (:meth:`Charge.close`):
input estimate against input used (cache reads included), ``max_tokens`` against output,
and both on the day meter. A request that fails before any reply gives its tokens back (not
its request). A reply whose usage is unknown (a pass-through stream without
``include_usage``) keeps the estimate.

``max_concurrency``: one lease per request in flight (:meth:`CounterStore.enter_take`), held
until the request ends; a lease not returned within :data:`LEASE_TTL` lapses.

A refusal is ``429 rate_limit_error`` naming the limit it would exceed, with ``retry-after``
in whole seconds (the ceiling of the store's wait, at least 1) and the headers below.

Headers (the API's names; only the limits the client has): ``anthropic-ratelimit-
{requests,input-tokens,output-tokens,tokens}-{limit,remaining,reset}``, where ``remaining``
is what is left after this request's take (as the meter is, on a refusal) and ``reset`` the
RFC 3339 UTC time (whole seconds, rounded up) when the meter is full again. The API's
``tokens-*`` is "the most restrictive limit in effect"; here it is the token meter (input,
output or day) with the fewest units left, so a client with only ``tokens_per_day`` sees its
daily budget there. Unlike the API, ``remaining`` is not rounded to the thousand.

**The daily budget** (``tokens_per_day``) is also reported in the ``anthropic-ratelimit-
unified-*`` headers Claude Code reads (gateway/tenancy/unified.py), and a request the day
meter refuses has spent the budget (:meth:`Plan.spent`: ``429 billing_error``, not retried).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from gateway import errors
from gateway.tenancy.clients import Client
from gateway.tenancy.counters import CounterStore, CountersUnavailable, Meter, Reading, SlotLease
from gateway.tenancy.unified import spent_headers, unified, without_claims

__all__ = [
    "LEASE_TTL",
    "Charge",
    "Plan",
    "admit",
    "input_estimate",
    "rfc3339",
    "standing",
]

MINUTE = 60.0
DAY = 86400.0
LEASE_TTL = 900.0  # seconds: the longest a request may last before its lease lapses

# kind -> (header infix, what a refusal calls the limit)
_REQUESTS, _INPUT, _OUTPUT, _DAY = "requests", "input", "output", "day"
_HEADER = {_REQUESTS: "requests", _INPUT: "input-tokens", _OUTPUT: "output-tokens"}
_UNITS = {
    _REQUESTS: "requests per minute",
    _INPUT: "input tokens per minute",
    _OUTPUT: "output tokens per minute",
    _DAY: "tokens per day",
}
_TOKEN_KINDS = frozenset((_INPUT, _OUTPUT, _DAY))


def _names(kind: str) -> tuple[str, str, str]:
    prefix = "anthropic-ratelimit-" + kind
    return (prefix + "-limit", prefix + "-remaining", prefix + "-reset")


_TOKENS = _names("tokens")
_WEIGHTS = {_REQUESTS: (1, 0, 0), _INPUT: (0, 1, 0), _OUTPUT: (0, 0, 1), _DAY: (0, 1, 1)}


def _wait(n: int) -> str:
    """A wait as a person reads it: seconds, minutes, or hours and minutes."""
    if n < 120:
        return _seconds(n)
    minutes = math.ceil(n / 60)
    if minutes < 120:
        return f"{minutes} minutes"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def _clock(t: float) -> str:
    return time.strftime("%H:%M UTC", time.gmtime(math.ceil(t)))


def input_estimate(body_bytes: int) -> int:
    """A request's input tokens before the call: four bytes of request JSON per token (the
    rule of gateway/messages/tokens.py ``estimate_from_bytes``)."""
    return max(1, body_bytes // 4)


def _seconds(n: int) -> str:
    return "1 second" if n == 1 else f"{n} seconds"


_RFC3339: dict[int, str] = {}  # whole second -> its text: a few distinct resets a second


def rfc3339(t: float) -> str:
    """``t`` (epoch seconds) as the API writes a reset: whole seconds, UTC, rounded up."""
    second = math.ceil(t)
    text = _RFC3339.get(second)
    if text is None:
        if len(_RFC3339) >= 256:
            _RFC3339.clear()
        text = _RFC3339[second] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
    return text


@dataclass(frozen=True, slots=True)
class Plan:
    """One client's meters, in a fixed order, and its concurrency limit."""

    client: str
    meters: tuple[Meter, ...]
    kinds: tuple[str, ...]
    max_concurrency: int
    # per meter, what it counts of (requests, input tokens, output tokens)
    weights: tuple[tuple[int, int, int], ...] = ()
    # per meter, its (limit, remaining, reset) header names (None: the day meter, shown
    # only as ``tokens-*``); the token meters' indices
    names: tuple[tuple[str, str, str] | None, ...] = ()
    tokens: tuple[int, ...] = ()
    # the day meter's index (``tokens_per_day``, the budget of the unified headers); -1: none
    budget: int = -1

    @staticmethod
    @lru_cache(maxsize=1024)  # the key set: the configured clients (of every reload seen)
    def of(client: Client) -> Plan:
        name = client.name
        meters: list[Meter] = []
        kinds: list[str] = []
        for kind, limit, suffix, period in (
            (_REQUESTS, client.requests_per_minute, "rpm", MINUTE),
            (_INPUT, client.input_tokens_per_minute, "itpm", MINUTE),
            (_OUTPUT, client.output_tokens_per_minute, "otpm", MINUTE),
            (_DAY, client.tokens_per_day, "tpd", DAY),
        ):
            if limit:
                meters.append(Meter(f"{name}:{suffix}", limit, period))
                kinds.append(kind)
        return Plan(
            name,
            tuple(meters),
            tuple(kinds),
            client.max_concurrency,
            tuple(_WEIGHTS[k] for k in kinds),
            tuple(_names(_HEADER[k]) if k in _HEADER else None for k in kinds),
            tuple(i for i, k in enumerate(kinds) if k in _TOKEN_KINDS),
            kinds.index(_DAY) if _DAY in kinds else -1,
        )

    @property
    def counts_tokens(self) -> bool:
        return bool(self.tokens)

    def amounts(self, requests: int, input_tokens: int, output_tokens: int) -> tuple[int, ...]:
        """What each meter counts of a request of these figures."""
        return tuple(
            r * requests + i * input_tokens + o * output_tokens for r, i, o in self.weights
        )

    def reserved(self, input_tokens: int, max_tokens: int) -> tuple[int, ...]:
        """What a request takes before its call: ``max_tokens`` from the output meters, but
        not from the daily budget, which takes the input estimate alone (a cap refuses once
        it is spent, not a request whose ``max_tokens`` would not fit: Claude Code asks
        32,000 every time); its output comes off when the reply settles."""
        needs = self.amounts(1, input_tokens, max_tokens)
        if self.budget < 0:
            return needs
        return tuple(n - max_tokens if i == self.budget else n for i, n in enumerate(needs))

    def headers(self, reading: Reading, wall: float, *, reply: bool = True) -> dict[str, str]:
        """The ``anthropic-ratelimit-*`` headers of a reading of this plan's meters (and the
        unified ones of its daily budget; ``reply``: see :func:`unified`)."""
        out: dict[str, str] = {}
        if self.budget >= 0:
            i = self.budget
            out = unified(
                self.meters[i].limit, reading.remaining[i], reading.reset[i], wall, reply=reply
            )
        remaining, reset = reading.remaining, reading.reset
        tokens = self.tokens
        tightest = min(tokens, key=remaining.__getitem__) if tokens else -1
        for i, m in enumerate(self.meters):
            names = self.names[i]
            if names is not None or i == tightest:
                left, full = str(remaining[i]), rfc3339(wall + reset[i])
                limit = str(m.limit)
                if names is not None:
                    out[names[0]], out[names[1]], out[names[2]] = limit, left, full
                if i == tightest:  # the token meter with the fewest units left
                    out[_TOKENS[0]], out[_TOKENS[1]], out[_TOKENS[2]] = limit, left, full
        return out

    def refusal(
        self, reading: Reading, needs: Sequence[int], headers: Mapping[str, str], wall: float
    ) -> errors.GatewayError:
        """The 429 for a refused take: the spent budget's (:meth:`spent`) when the day
        meter lacks its share, else the rate limit whose wait is the longest."""
        worst, wait = 0, -1.0
        retry = max(1, math.ceil(reading.retry_after))
        for i, m in enumerate(self.meters):
            level = m.limit - reading.reset[i] * m.rate
            short = min(needs[i], m.limit) - level
            if short > 0 and i == self.budget:
                return self.spent(retry, headers, wall)
            if short > 0 and short / m.rate > wait:
                worst, wait = i, short / m.rate
        limit = self.meters[worst].limit
        return errors.RateLimited(
            f"This request would exceed your rate limit of {limit:,} "
            f"{_UNITS[self.kinds[worst]]}. Retry after {_seconds(retry)}, or reduce the "
            "prompt length or max_tokens.",
            retry_after=retry,
            headers=headers,
        )

    def spent(self, retry: int, headers: Mapping[str, str], wall: float) -> errors.BudgetSpent:
        """The 429 ``billing_error`` of a spent daily budget (not retried by the clients)."""
        limit = self.meters[self.budget].limit
        return errors.BudgetSpent(
            f"Your daily budget of {limit:,} tokens on this gateway is spent \u00b7 this "
            f"request fits again in {_wait(retry)} (at {_clock(wall + retry)}) \u00b7 "
            "for more, ask the gateway's operator to raise your tokens_per_day.",
            retry_after=retry,
            headers={**headers, **spent_headers(retry, wall)},
        )


class Charge:
    """What one request took from its client's meters, settled once when it ends
    (:meth:`close`): by the reply's usage (:meth:`ended`), or given back (no reply)."""

    __slots__ = (
        "_ended",
        "_usage",
        "error_headers",
        "headers",
        "input_tokens",
        "lease",
        "max_tokens",
        "plan",
        "store",
    )

    def __init__(
        self,
        store: CounterStore,
        plan: Plan,
        input_tokens: int,
        max_tokens: int,
        headers: dict[str, str],
        lease: SlotLease | None,
    ) -> None:
        self.store = store
        self.plan = plan
        self.input_tokens = input_tokens
        self.max_tokens = max_tokens
        self.headers = headers  # the answer's anthropic-ratelimit-* headers
        # an error answer's: without the unified claim (see the module docstring)
        self.error_headers = without_claims(headers) if plan.budget >= 0 else headers
        self.lease = lease  # the concurrency lease held, if any
        self._ended = False
        self._usage: tuple[int, int] | None = None

    def ended(self, usage: tuple[int, int] | None) -> None:
        """The reply ended: (input, output) tokens used, or None when not reported (the
        estimate stands)."""
        self._ended = True
        self._usage = usage

    def settlement(self) -> tuple[int, ...] | None:
        """What to take more (negative: give back) per meter; None: nothing to settle."""
        plan = self.plan
        if not plan.counts_tokens:
            return None
        est, cap = self.input_tokens, self.max_tokens
        if not self._ended:  # no reply: the tokens go back, the request stays counted
            return _less_request(plan, est, cap)
        if self._usage is None:  # the estimate stands: max_tokens as the budget's output
            if plan.budget < 0:
                return None
            return tuple(cap if i == plan.budget else 0 for i in range(len(plan.meters)))
        used_in, used_out = self._usage
        amounts = plan.amounts(0, used_in - est, used_out - cap)
        if plan.budget < 0:
            return amounts
        return tuple(a + cap if i == plan.budget else a for i, a in enumerate(amounts))

    async def close(self, now: float | None = None) -> None:
        """Settle and return the lease; a store error is not the client's (the redis
        store logs it)."""
        now = time.time() if now is None else now
        amounts = self.settlement()
        lease, self.lease = self.lease, None
        meters: tuple[Meter, ...] = ()
        if amounts is not None and any(amounts):
            meters = self.plan.meters
        else:
            amounts = ()
        if not meters and lease is None:
            return
        try:
            await self.store.settle_leave(meters, amounts, now, lease)
        except CountersUnavailable:
            if lease is not None:  # the settle is lost; the lease goes back if it can
                await _leave(self.store, lease)


async def admit(
    store: CounterStore,
    plan: Plan,
    input_tokens: int,
    max_tokens: int,
    *,
    lease: str,
    now: float | None = None,
) -> Charge:
    """Take a request from ``plan``'s meters (and a concurrency lease): the :class:`Charge`
    to close when it ends. Raises :class:`~gateway.errors.RateLimited` when a limit refuses
    it (nothing taken), :class:`CountersUnavailable` when the store fails (nothing held)."""
    now = time.time() if now is None else now
    held: SlotLease | None = None
    if plan.max_concurrency:
        held = SlotLease(f"{plan.client}:concurrency", plan.max_concurrency, lease, LEASE_TTL)
    if held is None and not plan.meters:
        return Charge(store, plan, input_tokens, max_tokens, {}, None)
    needs = plan.reserved(input_tokens, max_tokens)
    try:
        reading = await store.enter_take(plan.meters, needs, now, held)
    except BaseException:
        if held is not None:  # a reply lost after the script ran: the lease goes back
            await _leave(store, held)
        raise
    if reading is None:
        raise errors.RateLimited(
            f"This request would exceed your limit of {plan.max_concurrency} "
            "concurrent requests. Retry after 1 second.",
            retry_after=1,
            headers={},
        )
    headers: dict[str, str] = {}
    if plan.meters:
        if not reading.ok:
            raise plan.refusal(reading, needs, plan.headers(reading, now, reply=False), now)
        headers = plan.headers(reading, now)
    return Charge(store, plan, input_tokens, max_tokens, headers, held)


def _less_request(plan: Plan, input_tokens: int, max_tokens: int) -> tuple[int, ...]:
    """What a request that got no reply gives back: what it reserved, but the request."""
    requests = plan.amounts(1, 0, 0)
    return tuple(
        r - n for r, n in zip(requests, plan.reserved(input_tokens, max_tokens), strict=True)
    )


async def standing(store: CounterStore, plan: Plan, now: float | None = None) -> dict[str, str]:
    """The headers of an error answered before the take (a 400, 403 or 404): the meters as
    they are, read by a take of nothing. Raises :class:`CountersUnavailable`."""
    now = time.time() if now is None else now
    if not plan.meters:
        return {}
    reading = await store.take(plan.meters, (0,) * len(plan.meters), now)
    return plan.headers(reading, now, reply=False)


async def _leave(store: CounterStore, lease: SlotLease) -> None:
    try:
        await store.leave(lease.key, lease.name)
    except CountersUnavailable:
        pass


async def spend(store: CounterStore, plan: Plan, usage: tuple[int, int], now: float) -> None:
    """A batch request's tokens, taken from its owner's token meters after it ran (a batch
    is never refused: it spends the budget its owner's interactive requests then wait for)."""
    if not plan.counts_tokens:
        return
    amounts = plan.amounts(0, usage[0], usage[1])
    if any(amounts):
        await store.settle(plan.meters, amounts, now)
