"""The ``anthropic-ratelimit-unified-*`` headers of a client's daily budget.

A client's daily budget (``tokens_per_day``, metered by gateway/tenancy/limits.py) is
reported in the ``anthropic-ratelimit-unified-*`` headers of the Claude Code gateway protocol
(its "Usage-limit headers": the contract Claude Code 2.1.332 serves at ``GET /protocol`` from
``claude gateway``), so Claude Code shows "You've used NN% of your usage credits" past 75 %
and 95 % (:func:`unified`):

* ``-status`` ``allowed``, or ``allowed_warning`` once past a threshold;
  ``-representative-claim: overage`` (the window-agnostic claim: ``5h``/``7d`` are rolling
  windows the client does its own time arithmetic on) and ``-overage-status`` (= status);
* ``-overage-utilization``: the fraction of the budget in use (``tpd`` meter's
  ``limit - remaining`` over ``limit``) with two decimals, kept below 1 while requests pass;
* ``-overage-surpassed-threshold``: ``0.75`` or ``0.95`` once passed (what makes the client
  show its notice); absent below 75 %;
* ``-reset`` and ``-overage-reset``: unix seconds when the meter is full again.

A request the day meter refuses has spent the budget
(:meth:`gateway.tenancy.limits.Plan.spent`): ``429 billing_error`` with ``x-should-retry:
false`` (the SDKs and Claude Code do not retry it),
``retry-after`` in seconds until the request fits again, and ``-status: rejected``,
``-reset``/``-overage-reset`` at that time, ``-overage-utilization: 1``,
``-overage-surpassed-threshold: 1``, ``-overage-period: daily`` and
``-overage-disabled-reason: org_spend_cap_reached``. As the contract says, every answer
that is not a reply (a 429 above all) leaves ``-representative-claim`` and ``-overage-status``
off: Claude Code then prints the error's message, which says when the budget allows the
request again and what to do. A refusal by a per-minute limit stays ``rate_limit_error``
(retried by the clients).
"""

from __future__ import annotations

import math

__all__ = ["CLAIMS", "THRESHOLDS", "UNIFIED", "spent_headers", "unified", "without_claims"]

UNIFIED = "anthropic-ratelimit-unified-"
# the thresholds whose passing the client notices (the contract's 75 % and 95 %), highest first
THRESHOLDS = (0.95, 0.75)
# the two headers with which a 429 would make Claude Code compose its own "You've hit your
# limit" line, dropping the gateway's message; only replies carry them
CLAIMS = (UNIFIED + "representative-claim", UNIFIED + "overage-status")


def unified(
    limit: int, remaining: int, full_in: float, wall: float, *, reply: bool
) -> dict[str, str]:
    """The ``anthropic-ratelimit-unified-*`` headers of a daily budget of ``limit`` tokens
    with ``remaining`` left, full again in ``full_in`` seconds from ``wall``. ``reply``:
    the answer is a reply (not an error), which alone names the claim."""
    used = max(0, limit - remaining) / limit
    passed = next((t for t in THRESHOLDS if used >= t), None)
    status = "allowed" if passed is None else "allowed_warning"
    reset = str(math.ceil(wall + full_in))
    out = {UNIFIED + "status": status}
    if reply:
        out[CLAIMS[0]] = "overage"
        out[CLAIMS[1]] = status
    out[UNIFIED + "reset"] = reset
    out[UNIFIED + "overage-reset"] = reset
    out[UNIFIED + "overage-utilization"] = f"{math.floor(min(used, 0.99) * 100) / 100:.2f}"
    if passed is not None:
        out[UNIFIED + "overage-surpassed-threshold"] = f"{passed:.2f}"
    return out


def spent_headers(retry: int, wall: float) -> dict[str, str]:
    """The unified headers of a 429 for a spent budget, the request fitting again in
    ``retry`` seconds (the contract's shape for a reached cap, its claim left off)."""
    reset = str(math.ceil(wall) + retry)
    return {
        UNIFIED + "status": "rejected",
        UNIFIED + "reset": reset,
        UNIFIED + "overage-reset": reset,
        UNIFIED + "overage-utilization": "1",
        UNIFIED + "overage-surpassed-threshold": "1",
        UNIFIED + "overage-period": "daily",
        UNIFIED + "overage-disabled-reason": "org_spend_cap_reached",
    }


def without_claims(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` without the two :data:`CLAIMS` (what an answer that is not a reply sends)."""
    return {k: v for k, v in headers.items() if k not in CLAIMS}
