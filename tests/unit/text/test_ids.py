"""gateway/text/ids.py: ids are shaped like Anthropic's, unique, drawn from os.urandom in bulk,
and a forked child never repeats its parent's."""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable

import pytest

from gateway.text import ids

SHAPES: list[tuple[Callable[[], str], str]] = [
    (ids.new_request_id, r"req_[0-9A-Za-z]{24}"),
    (ids.new_message_id, r"msg_[0-9A-Za-z]{24}"),
    (ids.new_tool_use_id, r"toolu_[0-9A-Za-z]{24}"),
    (lambda: ids.b62(7), r"[0-9A-Za-z]{7}"),
    (lambda: ids.b62(5000), r"[0-9A-Za-z]{5000}"),  # longer than one draw
]


@pytest.mark.parametrize(("make", "shape"), SHAPES)
def test_shape(make: Callable[[], str], shape: str) -> None:
    for _ in range(300):  # across a refill
        assert re.fullmatch(shape, make())


def test_unique() -> None:
    made = [ids.new_message_id() for _ in range(5000)]
    assert len(set(made)) == len(made)


def test_random_bytes_drawn_in_bulk(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def counted(real: Callable[[int], bytes]) -> Callable[[int], bytes]:
        def urandom(n: int) -> bytes:
            calls.append(n)
            return real(n)

        return urandom

    monkeypatch.setattr(os, "urandom", counted(os.urandom))
    monkeypatch.setattr(random, "_urandom", counted(random._urandom))  # type: ignore[attr-defined]
    for _ in range(1000):
        ids.new_request_id()
    assert 1 <= len(calls) <= 1000 // 100  # one draw per ~128 ids, not one per id


def test_forked_child_draws_its_own() -> None:
    ids.new_request_id()  # the parent holds characters not handed out yet
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, ids.new_request_id().encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        child = os.read(read, 64).decode()
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert re.fullmatch(r"req_[0-9A-Za-z]{24}", child)
    assert child != ids.new_request_id()
