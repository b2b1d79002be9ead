"""The weighted fair order of requests waiting for a saturated model (gateway/tenancy/fair.py)."""

from __future__ import annotations

import pytest

from gateway.tenancy.fair import FairQueue, engine_priority

# (what happens, in order; the admission order expected). Steps: "join C" (weight 1),
# "join C/W" (weight W), "next" (a slot frees: the next request admitted, recorded),
# "leave N" (the N-th joined request leaves before its turn).
ORDERS = [
    (
        "one client alone is served in arrival order",
        ["join a", "join a", "join a", "next", "next", "next"],
        ["a1", "a2", "a3"],
    ),
    (
        "a newcomer goes before a client with thirty waiting (behind its head only)",
        [*["join heavy"] * 30, "join light", "next", "next", "next"],
        ["heavy1", "light31", "heavy2"],
    ),
    (
        "a newcomer after some turns still joins at the virtual time",
        [*["join heavy"] * 10, "next", "next", "next", "join light", "next", "next"],
        ["heavy1", "heavy2", "heavy3", "light11", "heavy4"],
    ),
    (
        "weight 2 gets twice the slots of weight 1 while both wait",
        [*["join a/2"] * 8, *["join b"] * 8, *["next"] * 9],
        ["a1", "b9", "a2", "a3", "b10", "a4", "a5", "b11", "a6"],
    ),
    (
        "equal weights alternate",
        [*["join a"] * 3, *["join b"] * 3, *["next"] * 6],
        ["a1", "b4", "a2", "b5", "a3", "b6"],
    ),
    (
        "a request that left is skipped",
        ["join a", "join a", "join b", "leave 1", "next", "next"],
        ["b3", "a2"],
    ),
    (
        "a client whose waiting requests all left joins again at the virtual time",
        [*["join a"] * 5, "join b", *[f"leave {i}" for i in range(1, 6)], "join a", "next", "next"],
        ["b6", "a7"],
    ),
]


def _run(steps: list[str]) -> tuple[list[str], FairQueue[str]]:
    queue: FairQueue[str] = FairQueue()
    joined = []
    admitted: list[str] = []
    for step in steps:
        verb, _, arg = step.partition(" ")
        if verb == "join":
            client, _, weight = arg.partition("/")
            waiter = queue.join(client, float(weight or 1), f"{client}{len(joined) + 1}")
            assert waiter is not None
            joined.append(waiter)
        elif verb == "leave":
            queue.leave(joined[int(arg) - 1])
        else:
            taken = queue.next()
            assert taken is not None
            admitted.append(taken.item)
    return admitted, queue


@pytest.mark.parametrize(("case", "steps", "expected"), ORDERS, ids=[o[0] for o in ORDERS])
def test_admission_order(case: str, steps: list[str], expected: list[str]) -> None:
    admitted, _ = _run(steps)
    assert admitted == expected, case


def test_long_run_shares_follow_weights() -> None:
    # three clients always waiting (weights 1, 2, 4): 700 slots split 100/200/400
    queue: FairQueue[str] = FairQueue()
    weights = {"a": 1.0, "b": 2.0, "c": 4.0}
    for name, w in weights.items():
        for _ in range(5):
            queue.join(name, w, name)
    got = dict.fromkeys(weights, 0)
    for _ in range(700):
        taken = queue.next()
        assert taken is not None
        got[taken.item] += 1
        queue.join(taken.item, weights[taken.item], taken.item)  # keeps waiting
    assert got == {"a": 100, "b": 200, "c": 400}


def test_cap_refuses_past_it_and_a_leave_makes_room() -> None:
    queue: FairQueue[int] = FairQueue(cap=3)
    waiters = [queue.join("a", 1.0, i) for i in range(3)]
    assert all(w is not None for w in waiters)
    assert queue.join("b", 1.0, 99) is None
    assert len(queue) == 3
    first = waiters[0]
    assert first is not None
    queue.leave(first)
    assert queue.join("b", 1.0, 99) is not None
    assert len(queue) == 3


def test_leave_is_idempotent_and_next_on_empty_is_none() -> None:
    queue: FairQueue[int] = FairQueue()
    w = queue.join("a", 1.0, 1)
    assert w is not None
    queue.leave(w)
    queue.leave(w)
    assert len(queue) == 0 and queue.waiting("a") == 0
    assert queue.next() is None
    w2 = queue.join("a", 1.0, 2)
    taken = queue.next()
    assert taken is w2
    queue.leave(w2)  # already taken: nothing changes
    assert len(queue) == 0


def test_dead_entries_are_dropped_from_the_heap() -> None:
    # every request times out without a slot freeing: the heap stays within twice the live
    queue: FairQueue[int] = FairQueue()
    live = [queue.join("a", 1.0, i) for i in range(10)]
    for i in range(5000):
        w = queue.join("b", 1.0, i)
        assert w is not None
        queue.leave(w)
    assert len(queue) == 10
    assert len(queue._heap) <= max(2 * len(queue), 10 + 65)
    assert [queue.next().item for _ in range(10)] == list(range(10))  # type: ignore[union-attr]
    assert all(w is not None for w in live)


PRIORITIES = [
    (1.0, "vllm", 0),
    (2.0, "vllm", -10),
    (0.5, "vllm", 10),
    (1000.0, "vllm", -100),
    (1.0, "sglang", 0),
    (2.0, "sglang", 10),
    (0.25, "sglang", -20),
]


@pytest.mark.parametrize(("weight", "kind", "priority"), PRIORITIES)
def test_engine_priority(weight: float, kind: str, priority: int) -> None:
    assert engine_priority(weight, kind) == priority
