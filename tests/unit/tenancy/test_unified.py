"""The ``anthropic-ratelimit-unified-*`` headers of a client's daily budget: the values
Claude Code's gateway protocol asks for, computed from the day meter."""

from __future__ import annotations

import pytest

from gateway import errors
from gateway.tenancy.clients import Client
from gateway.tenancy.counters import LocalStore, Reading
from gateway.tenancy.limits import Plan, admit, standing
from gateway.tenancy.unified import spent_headers, unified

T0 = 1_700_000_000.0
U = "anthropic-ratelimit-unified-"


# limit, remaining, seconds until full, status, utilization, surpassed threshold
CASES = [
    (1000, 1000, 0.0, "allowed", "0.00", None),
    (1000, 999, 86.4, "allowed", "0.00", None),  # 0.1 %: two decimals, rounded down
    (1000, 260, 10.0, "allowed", "0.74", None),
    (1000, 250, 10.0, "allowed_warning", "0.75", "0.75"),  # a threshold reached is passed
    (1000, 51, 10.0, "allowed_warning", "0.94", "0.75"),
    (1000, 50, 10.0, "allowed_warning", "0.95", "0.95"),
    (1000, 1, 10.0, "allowed_warning", "0.99", "0.95"),
    # all used (settled below zero): still let through, so kept below 1
    (1000, 0, 10.0, "allowed_warning", "0.99", "0.95"),
    (3, 2, 0.5, "allowed", "0.33", None),
]


@pytest.mark.parametrize(("limit", "left", "full_in", "status", "util", "passed"), CASES)
def test_a_reply_reports_the_budget(
    limit: int, left: int, full_in: float, status: str, util: str, passed: str | None
) -> None:
    h = unified(limit, left, full_in, T0, reply=True)
    reset = str(int(T0 + full_in) + (1 if full_in % 1 else 0))
    expected = {
        U + "status": status,
        U + "representative-claim": "overage",
        U + "overage-status": status,
        U + "reset": reset,
        U + "overage-reset": reset,
        U + "overage-utilization": util,
    }
    if passed is not None:
        expected[U + "overage-surpassed-threshold"] = passed
    assert h == expected


@pytest.mark.parametrize(("limit", "left", "full_in", "status", "util", "passed"), CASES)
def test_an_error_leaves_the_claim_off(
    limit: int, left: int, full_in: float, status: str, util: str, passed: str | None
) -> None:
    # with a claim on a 429 Claude Code writes its own "You've hit your limit" line
    h = unified(limit, left, full_in, T0, reply=False)
    assert U + "representative-claim" not in h and U + "overage-status" not in h
    assert h[U + "status"] == status and h[U + "overage-utilization"] == util


@pytest.mark.parametrize(("retry", "reset"), [(1, 1_700_000_001), (37800, 1_700_037_800)])
def test_a_spent_budget_is_the_contracts_rejected_shape(retry: int, reset: int) -> None:
    assert spent_headers(retry, T0 + 0.4) == {
        U + "status": "rejected",
        U + "reset": str(reset + 1),
        U + "overage-reset": str(reset + 1),
        U + "overage-utilization": "1",
        U + "overage-surpassed-threshold": "1",
        U + "overage-period": "daily",
        U + "overage-disabled-reason": "org_spend_cap_reached",
    }


# client, its meters' reading (remaining, seconds to full: 1,000 a day refill 1 in 86.4 s),
# the needs, what refuses it
REFUSED = [
    # the day meter short: the budget is spent, whatever else is
    (Client("d", tokens_per_day=1000), (100,), (77760.0,), (200,), errors.BudgetSpent),
    (
        Client("rd", requests_per_minute=10, tokens_per_day=1000),
        (0, 100),
        (6.0, 77760.0),
        (1, 200),
        errors.BudgetSpent,
    ),
    # only a minute's limit short: a rate limit (retried), the budget's standing on it
    (
        Client("r", requests_per_minute=10, tokens_per_day=1000),
        (0, 900),
        (6.0, 8640.0),
        (1, 50),
        errors.RateLimited,
    ),
]


@pytest.mark.parametrize(("client", "left", "full_in", "needs", "kind"), REFUSED)
def test_which_refusal(
    client: Client,
    left: tuple[int, ...],
    full_in: tuple[float, ...],
    needs: tuple[int, ...],
    kind: type[errors.GatewayError],
) -> None:
    plan = Plan.of(client)
    reading = Reading(False, left, full_in, 30.0)
    err = plan.refusal(reading, needs, plan.headers(reading, T0, reply=False), T0)
    assert type(err) is kind and err.status == 429
    h = err.headers
    assert h["retry-after"] == "30"
    assert U + "representative-claim" not in h and U + "overage-status" not in h
    if kind is errors.BudgetSpent:
        assert err.error_type == "billing_error" and h["x-should-retry"] == "false"
        assert h[U + "status"] == "rejected" and h[U + "reset"] == str(int(T0) + 30)
        assert "1,000 tokens" in err.message and "30 seconds" in err.message
    else:
        assert err.error_type == "rate_limit_error" and "x-should-retry" not in h
        assert h[U + "status"] == "allowed" and h[U + "overage-utilization"] == "0.10"


async def test_a_client_without_a_budget_gets_no_unified_header() -> None:
    charge = await admit(
        LocalStore(), Plan.of(Client("m", requests_per_minute=5)), 10, 10, lease="l"
    )
    assert charge.headers and not any(k.startswith(U) for k in charge.headers)


async def test_an_error_after_the_take_leaves_the_claim_off() -> None:
    plan = Plan.of(Client("e", tokens_per_day=1000))
    charge = await admit(LocalStore(), plan, 10, 10, lease="l", now=T0)
    assert charge.headers[U + "representative-claim"] == "overage"
    assert U + "representative-claim" not in charge.error_headers
    assert charge.error_headers[U + "overage-utilization"] == "0.01"


async def test_standing_reads_without_taking() -> None:
    store = LocalStore()
    plan = Plan.of(Client("s", requests_per_minute=10, tokens_per_day=1000))
    await admit(store, plan, 100, 400, lease="l", now=T0)  # 1 request, 100 tokens of input
    for _ in range(3):  # reading is free: the same figures each time
        h = await standing(store, plan, now=T0)
        assert h["anthropic-ratelimit-requests-remaining"] == "9"
        assert h[U + "overage-utilization"] == "0.10"
        assert U + "representative-claim" not in h
    assert await standing(store, Plan.of(Client("none")), now=T0) == {}


@pytest.mark.parametrize(
    ("retry", "said"),
    [
        (1, "1 second"),
        (59, "59 seconds"),
        (119, "119 seconds"),
        (120, "2 minutes"),
        (7140, "119 minutes"),
        (7199, "2 h 00 min"),
        (7200, "2 h 00 min"),
        (37800, "10 h 30 min"),
    ],
)
def test_the_spent_message_says_when(retry: int, said: str) -> None:
    plan = Plan.of(Client("w", tokens_per_day=50_000))
    err = plan.spent(retry, {}, T0)
    assert f"fits again in {said} (at " in err.message


# the request's figures (input estimate, max_tokens), how it ended (usage, or None: not
# reported; "none": no reply), what the day's budget counts of it in the end
BUDGET_SETTLES = [
    ((100, 32000), (80, 500), 580),  # what was used, in and out
    ((100, 32000), None, 32100),  # unknown: the estimate stands, max_tokens as the output
    ((100, 32000), "none", 0),  # no reply: all of it given back
]


@pytest.mark.parametrize(("figures", "usage", "counted"), BUDGET_SETTLES)
async def test_the_budget_counts_what_was_used(
    figures: tuple[int, int], usage: tuple[int, int] | str | None, counted: int
) -> None:
    store = LocalStore()
    plan = Plan.of(Client("b", tokens_per_day=100_000, output_tokens_per_minute=50_000))
    charge = await admit(store, plan, *figures, lease="l", now=T0)
    # taken before the call: the input alone from the budget, max_tokens from the minute's
    assert charge.headers[U + "overage-utilization"] == "0.00"
    assert charge.headers["anthropic-ratelimit-output-tokens-remaining"] == "18000"
    if usage != "none":
        charge.ended(usage if isinstance(usage, tuple) else None)
    await charge.close(now=T0)
    reading = await store.take(plan.meters, (0, 0), T0)
    assert reading.remaining[plan.budget] == 100_000 - counted
