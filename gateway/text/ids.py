"""Ids the gateway makes: request ids (``req_``), message ids (``msg_``) and tool-use ids
(``toolu_``), each a prefix and 24 random base62 characters, shaped like Anthropic's; and the
``X-Request-Id`` of each upstream attempt.

An upstream attempt's id (:func:`new_upstream_request_id`) is the gateway's own, never the
client's ``x-request-id``: a reply on a reused connection is matched to its request by that id
(gateway/upstream/reuse.py), and clients repeat ids (a proxy that sets a fixed one), so an id
of theirs would let a stray reply to one request pass for another's. It is ``gw-``, a random
per-process prefix and a counter: unique within the process without a random draw per
attempt, and apart from another process's (workers, other gateways before one engine). vLLM
makes it its engine's request id, which must be unique among the requests it is running (a
duplicate is refused, 400 "Request id ... already running"), and its completion id
(``chatcmpl-<id>``, passed through to OpenAI clients: the counter says how many attempts the
process has made, nothing else). Nothing in the gateway reads the completion id back.

An upstream's tool-call id is kept when it is a safe token (Anthropic's clients send it
back as ``tool_use_id``; the upstream then sees its own id again); anything else is
replaced by a new one.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from typing import Any

_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# Random bytes mapped onto base62 with one translate() call (where 24 secrets.choice calls
# cost ~30 us). 256 % 62 leaves a small bias, harmless for ids.
_TO_B62 = bytes(ord(_B62[b % 62]) for b in range(256))
# Characters drawn from os.urandom at once, in slots of 24 (an id's): an id is one slot
# (a request made three ids, each its own urandom call, ~1.5 us of a ~30 us buffered request;
# now one call per 128 ids). The characters are as random as before and held only in this
# process. A longer string is drawn on its own.
_SLOT = 24
_SLOTS = 128


class _Characters:
    """Random base62 characters drawn in bulk, each slot handed out once (again in a forked
    child: the parent's would repeat there). No lock (it cost more than the draw it saves):
    ``drawn`` is replaced whole, and each draw's slot counter is atomic under the GIL, so a
    thread that read an older draw takes that draw's next slot, which nobody else takes."""

    __slots__ = ("drawn",)

    def __init__(self) -> None:
        self.drawn: tuple[str, Iterator[int]] = ("", itertools.count(_SLOTS))

    def reset(self) -> None:
        self.drawn = ("", itertools.count(_SLOTS))  # empty: the next take draws

    def take(self, n: int) -> str:
        if n > _SLOT:
            return os.urandom(n).translate(_TO_B62).decode("ascii")
        text, slots = self.drawn
        slot = next(slots)
        if slot >= _SLOTS:
            text = os.urandom(_SLOT * _SLOTS).translate(_TO_B62).decode("ascii")
            self.drawn = (text, itertools.count(1))
            slot = 0
        start = slot * _SLOT
        return text[start : start + n]


_characters = _Characters()
os.register_at_fork(after_in_child=_characters.reset)
_take = _characters.take  # the ids below call it straight (one call less per id)


def b62(n: int) -> str:
    """n random base62 characters."""
    return _characters.take(n)


def new_request_id() -> str:
    """A request's id when the client sent no usable ``x-request-id``."""
    return "req_" + _take(24)


def new_message_id() -> str:
    return "msg_" + _take(24)


def new_tool_use_id() -> str:
    return "toolu_" + _take(24)


class _UpstreamIds:
    """The attempts' ids: a prefix drawn per process (again in a forked child), a counter."""

    __slots__ = ("count", "prefix")

    def __init__(self) -> None:
        self.prefix = ""
        self.count = itertools.count(1)
        self.reset()

    def reset(self) -> None:
        self.prefix = f"gw-{b62(12)}-"
        self.count = itertools.count(1)


_upstream = _UpstreamIds()
os.register_at_fork(after_in_child=_upstream.reset)


def new_upstream_request_id() -> str:
    """A new ``X-Request-Id`` for one upstream attempt (header-safe: ``[A-Za-z0-9-]``)."""
    return f"{_upstream.prefix}{next(_upstream.count):x}"


_SAFE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def tool_use_id(upstream_id: Any) -> str:
    """Keep an upstream tool-call id when it is a safe token, else make one."""
    if isinstance(upstream_id, str) and _SAFE_ID.fullmatch(upstream_id):
        return upstream_id
    return new_tool_use_id()
