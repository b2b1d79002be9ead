"""gateway/tenancy/limits.py on the in-process store: what a request takes, the 429 that
refuses it, the headers, the refill and the settling of what the reply used."""

from __future__ import annotations

import calendar
import time
from collections.abc import Sequence

import pytest

from gateway import errors
from gateway.tenancy.clients import Client
from gateway.tenancy.counters import CountersUnavailable, LocalStore, Meter, Reading
from gateway.tenancy.limits import LEASE_TTL, Charge, Plan, admit, input_estimate, rfc3339, spend

T0 = 1_700_000_000.0  # a whole second, so resets read exactly


def _epoch(stamp: str) -> int:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


async def _admit(
    store: LocalStore, client: Client, body: int, max_tokens: int, now: float, lease: str = "l"
) -> Charge:
    return await admit(
        store, Plan.of(client), input_estimate(body), max_tokens, lease=lease, now=now
    )


# client, (body bytes, max_tokens) of each request, how many pass, the refusal's limit text
# (a spent daily budget: its figure), its retry-after
REFUSALS = [
    (Client("a", requests_per_minute=2), (40, 10), 2, "2 requests per minute", 30),
    # 2000 bytes: 500 tokens; 1000 a minute: two pass, the third waits 30 s for 500
    (Client("b", input_tokens_per_minute=1000), (2000, 10), 2, "1,000 input tokens per minute", 30),
    # max_tokens 60 of 100 a minute: the second finds 40, waits (60 - 40) / (100 / 60) = 12 s
    (Client("c", output_tokens_per_minute=100), (40, 60), 1, "100 output tokens per minute", 12),
    # a day's budget takes the input estimate alone (max_tokens comes off when the reply
    # settles): 100 of 250 a day, two pass; the third finds 50, waits 50 / (250 / 86400) s
    (Client("d", tokens_per_day=250), (400, 90), 2, "budget of 250 tokens", 17280),
    # the longest wait names the limit: rpm is fine, output is short
    (
        Client("e", requests_per_minute=100, output_tokens_per_minute=100),
        (40, 100),
        1,
        "100 output tokens per minute",
        60,
    ),
]


@pytest.mark.parametrize(("client", "request_", "passing", "named", "retry"), REFUSALS)
async def test_take_then_refuse(
    client: Client, request_: tuple[int, int], passing: int, named: str, retry: int
) -> None:
    store = LocalStore()
    for _ in range(passing):
        await _admit(store, client, *request_, now=T0)
    # the day's budget spent is the billing error the clients do not retry; a rate limit not
    refused = errors.BudgetSpent if client.tokens_per_day else errors.RateLimited
    with pytest.raises(refused) as caught:
        await _admit(store, client, *request_, now=T0)
    err = caught.value
    assert err.status == 429
    assert err.error_type == ("billing_error" if client.tokens_per_day else "rate_limit_error")
    assert err.headers.get("x-should-retry") == ("false" if client.tokens_per_day else None)
    assert named in err.message
    assert err.headers["retry-after"] == str(retry)
    # the wait is real: a moment before it still refused, at it the request passes
    with pytest.raises(refused):
        await _admit(store, client, *request_, now=T0 + retry - 1.5)
    await _admit(store, client, *request_, now=T0 + retry)


@pytest.mark.parametrize(
    ("wait", "shown"), [(0.01, "1"), (0.999, "1"), (1.0, "1"), (1.2, "2"), (59.5, "60")]
)
def test_retry_after_is_whole_seconds_at_least_one(wait: float, shown: str) -> None:
    plan = Plan.of(Client("r", requests_per_minute=60))
    refusal = plan.refusal(Reading(False, (0,), (60.0,), wait), (1,), {}, T0)
    assert refusal.headers["retry-after"] == shown


async def test_headers_of_every_limit_the_client_has() -> None:
    client = Client(
        "h",
        requests_per_minute=10,
        input_tokens_per_minute=1000,
        output_tokens_per_minute=600,
        tokens_per_day=100_000,
    )
    charge = await _admit(LocalStore(), client, 400, 300, now=T0)  # 100 in, 300 out
    h = charge.headers
    assert {k: v for k, v in h.items() if not k.endswith("-reset")} == {
        "anthropic-ratelimit-requests-limit": "10",
        "anthropic-ratelimit-requests-remaining": "9",
        "anthropic-ratelimit-input-tokens-limit": "1000",
        "anthropic-ratelimit-input-tokens-remaining": "900",
        "anthropic-ratelimit-output-tokens-limit": "600",
        "anthropic-ratelimit-output-tokens-remaining": "300",
        # the tightest token meter: output's 300 left
        "anthropic-ratelimit-tokens-limit": "600",
        "anthropic-ratelimit-tokens-remaining": "300",
        # the day's budget, as Claude Code's gateway protocol reports a cap: 100 of 100,000
        "anthropic-ratelimit-unified-status": "allowed",
        "anthropic-ratelimit-unified-representative-claim": "overage",
        "anthropic-ratelimit-unified-overage-status": "allowed",
        "anthropic-ratelimit-unified-overage-utilization": "0.00",
    }
    # full again after what was taken refills: 1 of 10/min: 6 s; 100 of 1000/min: 6 s;
    # 300 of 600/min: 30 s
    assert _epoch(h["anthropic-ratelimit-requests-reset"]) == T0 + 6
    assert _epoch(h["anthropic-ratelimit-input-tokens-reset"]) == T0 + 6
    assert _epoch(h["anthropic-ratelimit-output-tokens-reset"]) == T0 + 30
    assert h["anthropic-ratelimit-tokens-reset"] == h["anthropic-ratelimit-output-tokens-reset"]
    # the budget full again in unix seconds: it took the input estimate alone, 100 of
    # 100,000 a day, which refill in 86.4 s
    assert h["anthropic-ratelimit-unified-reset"] == str(int(T0) + 87)
    assert h["anthropic-ratelimit-unified-overage-reset"] == str(int(T0) + 87)


@pytest.mark.parametrize(
    ("client", "present"),
    [
        (Client("o1", requests_per_minute=5), {"requests"}),
        (Client("o2", input_tokens_per_minute=5000), {"input-tokens", "tokens"}),
        (Client("o3", tokens_per_day=5000), {"tokens"}),  # the day budget is tokens-*
        (Client("o4", max_concurrency=3), set()),
    ],
)
async def test_only_the_limits_the_client_has_are_sent(client: Client, present: set[str]) -> None:
    charge = await _admit(LocalStore(), client, 40, 10, now=T0)
    plain = [k for k in charge.headers if not k.startswith("anthropic-ratelimit-unified-")]
    kinds = {k.removeprefix("anthropic-ratelimit-").rsplit("-", 1)[0] for k in plain}
    assert kinds == present
    assert len(plain) == 3 * len(present)
    # the unified headers: a daily budget's alone
    assert (len(charge.headers) > len(plain)) == bool(client.tokens_per_day)


def test_rfc3339_rounds_up_to_the_second() -> None:
    assert rfc3339(T0) == "2023-11-14T22:13:20Z"
    assert rfc3339(T0 + 0.2) == "2023-11-14T22:13:21Z"


BOTH = Client(
    "s", input_tokens_per_minute=10_000, output_tokens_per_minute=10_000, tokens_per_day=1_000_000
)


# how the request ended -> (input, output, day) units still taken after settling, for a
# request of estimate 1000 (4000 bytes) and max_tokens 500
SETTLED = [
    ("reply", (300, 20), (300, 20, 320)),  # the usage replaces the estimate
    ("reply", (1500, 700), (1500, 700, 2200)),  # more than estimated: taken
    ("unknown", None, (1000, 500, 1500)),  # a reply without usage: the estimate stands
    ("failed", None, (0, 0, 0)),  # no reply: the tokens go back
]


@pytest.mark.parametrize(("how", "usage", "taken"), SETTLED)
async def test_settle_from_the_reply(
    how: str, usage: tuple[int, int] | None, taken: tuple[int, int, int]
) -> None:
    store = LocalStore()
    charge = await _admit(store, BOTH, 4000, 500, now=T0)
    if how != "failed":
        charge.ended(usage)
    await charge.close(now=T0)
    plan = Plan.of(BOTH)
    reading = await store.take(plan.meters, (0, 0, 0), T0)
    assert (
        tuple(m.limit - left for m, left in zip(plan.meters, reading.remaining, strict=True))
        == taken
    )


async def test_a_failed_request_keeps_its_request_counted() -> None:
    client = Client("f", requests_per_minute=1, output_tokens_per_minute=100)
    store = LocalStore()
    await (await _admit(store, client, 40, 100, now=T0)).close(now=T0)  # no reply
    with pytest.raises(errors.RateLimited) as caught:
        await _admit(store, client, 40, 100, now=T0)
    assert "1 requests per minute" in caught.value.message
    assert caught.value.headers["anthropic-ratelimit-output-tokens-remaining"] == "100"


async def test_concurrency_lease_held_until_close() -> None:
    client = Client("k", max_concurrency=2)
    store = LocalStore()
    first = await _admit(store, client, 40, 10, now=T0, lease="1")
    await _admit(store, client, 40, 10, now=T0, lease="2")
    with pytest.raises(errors.RateLimited) as caught:
        await _admit(store, client, 40, 10, now=T0, lease="3")
    assert "2 concurrent requests" in caught.value.message
    assert caught.value.headers["retry-after"] == "1"
    await first.close(now=T0)
    await _admit(store, client, 40, 10, now=T0, lease="3")
    # a lease never returned (a crashed process) lapses after LEASE_TTL
    await _admit(store, client, 40, 10, now=T0 + LEASE_TTL + 1, lease="4")


async def test_a_rate_refusal_returns_the_lease() -> None:
    client = Client("q", max_concurrency=1, requests_per_minute=1)
    store = LocalStore()
    await (await _admit(store, client, 40, 10, now=T0, lease="1")).close(now=T0)
    with pytest.raises(errors.RateLimited):
        await _admit(store, client, 40, 10, now=T0, lease="2")  # the rpm refuses
    await _admit(store, client, 40, 10, now=T0 + 60, lease="3")  # the lease is free


class _Down(LocalStore):
    """A store that fails on ``fail`` (the redis one, with Redis down)."""

    def __init__(self, fail: str) -> None:
        super().__init__()
        self.fail = fail

    async def take(self, meters: Sequence[Meter], needs: Sequence[int], now: float) -> Reading:
        if self.fail == "take":
            raise CountersUnavailable()
        return await super().take(meters, needs, now)

    async def settle(self, meters: Sequence[Meter], amounts: Sequence[int], now: float) -> None:
        if self.fail == "settle":
            raise CountersUnavailable()
        await super().settle(meters, amounts, now)


async def test_store_errors() -> None:
    client = Client("x", max_concurrency=1, output_tokens_per_minute=100)
    down = _Down("take")
    with pytest.raises(CountersUnavailable):  # the caller decides: open or closed
        await _admit(down, client, 40, 10, now=T0, lease="1")
    down.fail = ""
    charge = await _admit(down, client, 40, 10, now=T0, lease="2")  # the lease was returned
    down.fail = "settle"
    await charge.close(now=T0)  # a settle failure is not the client's
    await _admit(down, client, 40, 10, now=T0, lease="3")  # and the lease still returned


async def test_a_batch_spends_its_owners_budget() -> None:
    client = Client("b", output_tokens_per_minute=100, requests_per_minute=5)
    store = LocalStore()
    await spend(store, Plan.of(client), (30, 80), T0)
    with pytest.raises(errors.RateLimited) as caught:
        await _admit(store, client, 40, 50, now=T0)
    assert "output tokens" in caught.value.message
    assert caught.value.headers["anthropic-ratelimit-requests-remaining"] == "5"  # not a request
