"""What a route's upstream takes: images, ``tool_reference`` parts, a named ``tool_choice``.

Per upstream kind, from what each engine really does (docs/local-engines.md, "Upstream errors"):

* llama.cpp refuses every content part type but ``text``, ``image_url`` and ``input_audio``
  with ``400 unsupported content[].type`` (``oaicompat_chat_params_parse``), so
  ``tool_reference`` parts go as text; it reads ``tool_choice`` as a string only
  (``json_value(body, "tool_choice", std::string("auto"))``: the object form is logged as
  "Wrong type supplied" and replaced by ``auto``), so a named choice goes as ``"required"``
  with only that tool offered. Whether it takes images depends on its ``--mmproj``: they are
  sent, and a refusal ("image input is not supported", a 500) teaches the route.
* Ollama's OpenAI route parses ``text`` and ``image_url`` parts only, and has no
  ``tool_choice``: the same as llama.cpp for both.
* vLLM and SGLang take a named choice (guided decoding); images and references are sent
  and a refusal teaches the route.

A route's ``[[models]]`` knobs (``images``, ``tool_references``, ``named_tool_choice``) set
``yes`` or ``no`` over the kind's default; ``auto`` keeps it. What an ``auto`` route has
learnt lives in :class:`Learned`, process-wide and bounded, keyed by the route's configured
name (bounded by the config), so a later request of the session goes straight to text and a
session is never poisoned by an image in its own history.

What is learnt is shared by every client of the route, so a refusal teaches it only when it
is one (the Messages call, :func:`gateway.messages.call.fall_back`): the refused request
held that content (:func:`held`: an ``image_url`` or ``tool_reference`` part in its
messages as sent), the engine's message is the refusal's whole shape
(:func:`gateway.text.refusals.refusal`), and the request's own bytes do not hold the
wording (:func:`gateway.text.refusals.echoed`: the error might then quote the client). It is
forgotten after the route's ``capability_ttl`` seconds: the next request with that content
is sent as it is again, a probe, and a refusal teaches the route anew (an engine restarted
with a projector is noticed; anything learnt wrongly does not last).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

from gateway.ops.config import ModelRoute
from gateway.text import jsonutil
from gateway.text.refusals import CAPABILITIES

__all__ = ["KIND_DEFAULTS", "LEARNED", "Learned", "held", "named_tool_choice", "text_only"]

# THE per-kind table: "no" (sent as text), "auto" (sent; a refusal teaches the route), "yes".
KIND_DEFAULTS: Mapping[str, Mapping[str, str]] = {
    "llamacpp": {"images": "auto", "tool_references": "no", "named_tool_choice": "no"},
    "ollama": {"images": "auto", "tool_references": "no", "named_tool_choice": "no"},
    "vllm": {"images": "auto", "tool_references": "auto", "named_tool_choice": "yes"},
    "sglang": {"images": "auto", "tool_references": "auto", "named_tool_choice": "yes"},
    "openai": {"images": "auto", "tool_references": "auto", "named_tool_choice": "yes"},
}


def setting(route: ModelRoute, capability: str) -> str:
    """The route's knob, else its kind's default: "yes", "no" or "auto"."""
    value: str = getattr(route, capability)
    if value != "auto":
        return value
    return KIND_DEFAULTS.get(route.upstream.kind, KIND_DEFAULTS["openai"])[capability]


def named_tool_choice(route: ModelRoute) -> bool:
    """Whether ``tool_choice: {"type": "function", "function": {"name": ...}}`` is honoured."""
    return setting(route, "named_tool_choice") != "no"


class Learned:
    """Capabilities upstreams refused, per route name, each until a deadline (learnt at +
    the route's ``capability_ttl``); at most ``limit`` routes (the oldest forgotten first).
    One per process (:data:`LEARNED`). ``clock``: seconds, monotonic (tests inject one)."""

    def __init__(self, limit: int = 1024, clock: Callable[[], float] = time.monotonic) -> None:
        self._limit = limit
        self._clock = clock
        # route -> {capability: the deadline past which it is tried again}
        self._refused: OrderedDict[str, Mapping[str, float]] = OrderedDict()

    def refused(self, route: str) -> frozenset[str]:
        known = self._refused.get(route)
        if not known:
            return frozenset()
        now = self._clock()
        return frozenset(c for c, until in known.items() if until > now)

    def learn(self, route: str, capability: str, ttl: float) -> bool:
        """Remember the refusal for ``ttl`` seconds (from now: a refusal of a probe renews
        it); True when it was not known (then it is logged: once per route and ``ttl``)."""
        now = self._clock()
        known = {c: until for c, until in self._refused.get(route, {}).items() if until > now}
        new = capability not in known
        known[capability] = now + ttl
        self._refused[route] = known
        self._refused.move_to_end(route)
        while len(self._refused) > self._limit:
            self._refused.popitem(last=False)
        return new

    def clear(self) -> None:
        self._refused.clear()


LEARNED = Learned()


# route (by identity; the route is held, so its id is not reused) -> what it sets "no": the
# answer of every request while nothing is learnt, made once (each request asked again)
_SET_NO: dict[int, tuple[ModelRoute, frozenset[str]]] = {}
_SET_NO_LIMIT = 1024  # routes remembered (a config's; a reloaded one's replace them)


def text_only(route: ModelRoute, learned: Learned) -> frozenset[str]:
    """The content the route's upstream gets as text: set "no", or learnt refused."""
    # nothing learnt for the route (the usual case): no call to Learned.refused
    refused = learned.refused(route.name) if route.name in learned._refused else None
    if not refused:
        known = _SET_NO.get(id(route))
        if known is not None and known[0] is route:
            return known[1]
        if len(_SET_NO) >= _SET_NO_LIMIT:
            _SET_NO.clear()
        no = frozenset(c for c in CAPABILITIES if setting(route, c) == "no")
        _SET_NO[id(route)] = (route, no)
        return no
    return frozenset(
        c
        for c in CAPABILITIES
        if setting(route, c) == "no" or (c in refused and setting(route, c) != "yes")
    )


# the chat content part types that hold each capability's content, and how the payload's
# encoding (ujson: no spaces) writes one: a payload without it holds no such part
_PART_TYPES = {"image_url": "images", "tool_reference": "tool_references"}
_PART_MARKS = tuple(b'"type":"%s"' % t.encode() for t in _PART_TYPES)


def held(payload: bytes) -> frozenset[str]:
    """The capabilities whose content parts a chat payload's messages hold (as sent: what
    went as text is no longer such a part). Read only when an upstream refused the payload
    (it is decoded again): nothing on the way of a request that is not refused."""
    if not any(mark in payload for mark in _PART_MARKS):
        return frozenset()
    try:
        messages = jsonutil.loads(payload).get("messages")
    except ValueError:
        return frozenset()
    found: set[str] = set()
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind in _PART_TYPES:
                found.add(_PART_TYPES[kind])
    return frozenset(found)


def may_fall_back(route: ModelRoute, capability: str) -> bool:
    """A refusal of ``capability`` may be retried as text (the route did not insist)."""
    return capability in CAPABILITIES and setting(route, capability) == "auto"
