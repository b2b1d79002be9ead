"""The one Messages call: a validated request made ready for its upstream, sent, and read back.

Used by ``/v1/messages`` and ``count_tokens`` (:mod:`gateway.http.anthropic`) and by the batch
scheduler (:mod:`gateway.batches.scheduler`), so a batch request is exactly what the same
interactive request would be: reasoning replayed from signatures restored (bounded), PDFs made text
(in worker processes), the request translated once
(:func:`~gateway.messages.to_chat.translate.to_chat`),
the call made through :func:`gateway.upstream.send.send`, and the reply translated back by the
same code (buffered: ``from_chat``; streamed upstream: the :class:`StreamTranslator`).

Content the upstream cannot take (:mod:`gateway.local.capabilities`): what the route is set
or has learnt to send as text goes as text from the start; an ``auto`` route's upstream
refusing an image or a ``tool_reference`` part (:mod:`gateway.text.refusals`) is answered by
sending the request again at once with that content as text, before any byte reached the
client (the refusal is the reply's head), and the route remembers it (``LEARNED``) for its
``capability_ttl``, so the session's later requests, whose history still holds that image, go
straight to text. Only a real refusal does either (:func:`fall_back`): the request held that
content, the engine's whole message is the refusal, and, to teach the route every client
shares, the request itself does not hold the refusal's wording (the engine may be quoting
it). Counted in ``llm_gateway_capability_fallbacks_total`` and logged once per route,
capability and ``capability_ttl``.

Fallbacks (``[[models]] fallbacks``, off by default): when the route's upstream failed before
any byte of a reply on every replica it tried (no connection, a reset before the head, a
timeout, a 502/503/504/529: :func:`falls_over`), the same request is translated for each
fallback route in turn (its upstream, ``upstream_model`` and capabilities) and sent there;
the call is the fallback's from then on (the reply's figures carry its name), and the reply
keeps the ``model`` the client asked for. Counted in ``llm_gateway_fallbacks_total{model,
fallback}``. Nothing falls back once a byte has been read: a cut stream is continued on the
route that began it (gateway/messages/continuation.py), never on another model.

Nothing here knows HTTP: what the call needs comes in as
:class:`~gateway.messages.deps.MessagesDeps`. Before the call, :func:`prepare` makes the request
ready (:mod:`gateway.messages.ready`: replayed reasoning restored, PDFs made text).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from gateway import errors
from gateway.local.capabilities import held, may_fall_back, named_tool_choice
from gateway.local.capabilities import text_only as route_text_only
from gateway.local.normalise import ContentNormaliser, LazyNormaliser
from gateway.local.tool_args import RepairBudget
from gateway.messages import tokens
from gateway.messages.continuation import relay
from gateway.messages.deps import MessagesDeps
from gateway.messages.from_chat.aggregate import aggregate
from gateway.messages.from_chat.figures import Figures
from gateway.messages.from_chat.message import from_chat
from gateway.messages.from_chat.tables import LOCAL_STOP_KINDS, hides_thinking, shows_thinking
from gateway.messages.ready import make_ready
from gateway.messages.session_key import session_key
from gateway.messages.stream.pump import Cut, Timing, pump
from gateway.messages.stream.translator import StreamTranslator
from gateway.messages.to_chat.translate import offered_tools, to_chat
from gateway.ops.budget import Lease
from gateway.ops.config import ModelRoute
from gateway.ops.telemetry import CURRENT
from gateway.tenancy.fair import engine_priority
from gateway.text import ids, jsonutil
from gateway.text.refusals import echoed
from gateway.text.sse import SSEEventTooLarge
from gateway.upstream.client import UpstreamClient, UpstreamResponse
from gateway.upstream.send import send

__all__ = [
    "Call",
    "Cut",
    "Timing",
    "count_input_tokens",
    "prepare",
    "pump",
]

_log = structlog.get_logger("gateway.messages")


async def prepare(
    deps: MessagesDeps,
    req: dict[str, Any],
    route: ModelRoute,
    lease: Lease | None = None,
    *,
    weight: float | None = None,
) -> Call:
    """A validated request's replayed reasoning restored and its PDFs made text
    (:func:`~gateway.messages.ready.make_ready`), made a :class:`Call`.

    The restored reasoning counts in ``lease`` (of ``deps.memory``), which the caller
    holds until the reply has ended; without one, in a lease of its own until the upstream
    payload is built. ``weight``: the client's, sent as the engine's priority where the
    upstream says so (``send_priority``)."""
    if lease is not None:
        return Call(deps, await make_ready(deps, req, lease), route, weight)
    with deps.memory.lease() as own:
        return Call(deps, await make_ready(deps, req, own), route, weight)


class Call:
    """One Messages request made ready for its upstream, and how its reply is read back."""

    __slots__ = (
        "_session",
        "_session_of",
        "as_text",
        "client",
        "deps",
        "match_stops",
        "payload",
        "req",
        "route",
        "stops",
        "stream",
        "upstream_stream",
        "weight",
    )

    def __init__(
        self,
        deps: MessagesDeps,
        req: dict[str, Any],
        route: ModelRoute,
        weight: float | None = None,
    ) -> None:
        self.deps = deps
        self.req = req
        self.weight = weight
        self.stream = req.get("stream") is True
        self.stops = _stops(req) if "stop_sequences" in req else ()
        self._session: str | None = None
        self._session_of: Callable[[], str] | None = None
        self._bind(route, deps.upstreams.metrics.drop_field)

    def _bind(self, route: ModelRoute, on_drop: Callable[[str], None] | None = None) -> None:
        """Make the call ``route``'s: its upstream, its model, what it takes (a
        translation that fails raises, and the call stays as it was)."""
        # An upstream that cannot say which stop string matched is streamed even for a
        # buffered reply: the gateway matches the stop sequences itself and cuts it there.
        match_stops = bool(self.stops) and route.upstream.kind in LOCAL_STOP_KINDS
        upstream_stream = self.stream or match_stops
        as_text = route_text_only(route, self.deps.learned)
        telemetry = CURRENT.get()
        if telemetry is None:
            payload = self._translate(route, upstream_stream, as_text, on_drop)
        else:
            with telemetry.span("translate", {"gateway.model": route.name}):
                payload = self._translate(route, upstream_stream, as_text, on_drop)
        self.route = route
        self.match_stops = match_stops
        self.upstream_stream = upstream_stream
        self.as_text = as_text
        self.payload = payload
        self.client: UpstreamClient = self.deps.upstreams.client(route)

    def _translate(
        self,
        route: ModelRoute,
        upstream_stream: bool,
        as_text: frozenset[str],
        on_drop: Callable[[str], None] | None = None,
    ) -> bytes:
        req = self.req
        out = to_chat(
            req if upstream_stream == self.stream else {**req, "stream": True},
            route,
            keep_billing_header=self.deps.keep_billing_header,
            on_drop=on_drop,
            as_text=as_text,
            # read only for a tool_choice (a route's setting: two calls otherwise)
            named_choice=req.get("tool_choice") is None or named_tool_choice(route),
        )
        if self.weight is not None:  # else _prioritised adds nothing
            out = self._prioritised(out, route)
        return jsonutil.dumpb(out)

    def _prioritised(self, out: dict[str, Any], route: ModelRoute) -> dict[str, Any]:
        """The client's weight as the engine's ``priority`` (``upstreams.NAME.send_priority``)."""
        if self.weight is not None and route.upstream.send_priority:
            out["priority"] = engine_priority(self.weight, route.upstream.kind)
        return out

    def chat_request(self) -> dict[str, Any]:
        """The streamed chat request this call sends, made again from the client's request
        (a mid-stream continuation adds its prefill to it: gateway/messages/continuation.py);
        cheaper than decoding :attr:`payload`, which the text of a long prompt makes long."""
        return self._prioritised(
            to_chat(
                {**self.req, "stream": True},
                self.route,
                keep_billing_header=self.deps.keep_billing_header,
                as_text=self.as_text,
                named_choice=named_tool_choice(self.route),
            ),
            self.route,
        )

    @property
    def session(self) -> str:
        """The request's session key (:func:`~gateway.messages.session_key.session_key`),
        made the first time it is asked for: only an upstream with several replicas and
        affinity reads it."""
        session = self._session
        if session is None:
            of = self._session_of
            session = self._session = of() if of is not None else session_key(None, self.req)
        return session

    async def send(
        self,
        request_id: str | None,
        session: str | Callable[[], str] | None = None,
        *,
        fall_back: bool = True,
    ) -> UpstreamResponse:
        """Call the upstream (counted); a failure raises its GatewayError. A refusal of
        content the route may send as text is answered by one more call with it as text.
        When every replica of the upstream failed before replying, the route's fallbacks
        are tried in order (see :func:`falls_over`); the call is then the fallback's.
        ``fall_back=False``: not (a later call of a reply part of which the client already
        has, e.g. a web search's next round: another model would finish it).

        ``session``: the request's session key (:attr:`session`), or what makes it when an
        upstream needs it (the client's session header and request: a hash of a prompt's
        prefix is not made for one replica); None: made from the request alone."""
        if session is None or isinstance(session, str):
            self._session, self._session_of = session, None
        else:
            self._session, self._session_of = None, session
        telemetry = CURRENT.get()
        if telemetry is not None:  # a span wants the key: made now (telemetry on only)
            telemetry.annotate({"gateway.session": self.session})
        try:
            try:  # the route's upstream
                return await self._send(request_id)
            except errors.GatewayError as refused:
                return await self._as_text(request_id, refused)
        except errors.GatewayError as err:
            if not fall_back or not self.route.fallback_routes or not falls_over(err):
                raise
            failed = err
        primary = self.route
        for fallback in primary.fallback_routes:
            try:
                self._bind(fallback)
            except errors.GatewayError:  # the request does not translate for it
                continue
            self.deps.metrics.fallbacks.labels(primary.name, fallback.name).inc()
            _log.warning(
                "model_fallback",
                model=primary.name,
                fallback=fallback.name,
                upstream=fallback.upstream.name,
                failed_status=failed.status,
                request_id=request_id,
            )
            try:
                if telemetry is None:
                    return await self._send_or_as_text(request_id)
                with telemetry.span(
                    "fallback",
                    {"gateway.model": primary.name, "gateway.fallback": fallback.name},
                ):
                    return await self._send_or_as_text(request_id)
            except errors.GatewayError as err:
                if not falls_over(err):
                    raise
                failed = err
        raise failed

    async def _send_or_as_text(self, request_id: str | None) -> UpstreamResponse:
        try:
            return await self._send(request_id)
        except errors.GatewayError as err:
            return await self._as_text(request_id, err)

    async def _as_text(self, request_id: str | None, err: errors.GatewayError) -> UpstreamResponse:
        """After the call failed with ``err``: a refusal of content the route may send as
        text is answered by one more call with it as text; anything else raises ``err``."""
        refused = err.refused
        if refused is None or not fall_back(self.deps, self.route, self.as_text, err, self.payload):
            raise err
        self.as_text = self.as_text | {refused}
        self.payload = self._translate(self.route, self.upstream_stream, self.as_text)
        return await self._send(request_id)

    def _send(self, request_id: str | None) -> Awaitable[UpstreamResponse]:
        """The upstream call's coroutine (a plain method: no coroutine layer of its own)."""
        return send(
            self.deps.upstreams,
            self.route,
            "/chat/completions",
            self.payload,
            stream=self.upstream_stream,
            max_tokens=self.req.get("max_tokens"),
            request_id=request_id,
            session=self.session if self.client.replicas.keyed else None,
        )

    def translator(self) -> StreamTranslator:
        deps = self.deps
        # only a route that continues cut streams keeps their text (for the prefill)
        return StreamTranslator(
            model=self.req["model"],
            message_id=ids.new_message_id(),
            signing_key=deps.signing_key,
            stop_sequences=self.stops,
            match_stops=self.match_stops,
            input_tokens=tokens.estimate_from_bytes(len(self.payload)),
            hosts=self.client.hosts,
            secrets=deps.upstreams.secrets,
            hide_thinking=hides_thinking(self.req),
            show_thinking=shows_thinking(self.req),
            normaliser=self.normaliser(),
            keep_streamed=self.route.upstream.max_continuations > 0,
        )

    def normaliser(self) -> ContentNormaliser | None:
        """What reads the engine's content for inline reasoning and text tool calls (one
        per reply: it holds state), per the upstream's settings; None: nothing to look for."""
        upstream = self.route.upstream
        names = _tool_names(self.req) if upstream.text_tool_calls else ()
        if upstream.inline_thinking == "off" and not names:
            return None
        return ContentNormaliser(thinking=upstream.inline_thinking, tool_names=names)

    async def reply(
        self, up: UpstreamResponse, figures: Figures, request_id: str | None = None
    ) -> dict[str, Any]:
        """The buffered reply (a ``message`` object) from the upstream's answer; a failure
        raises its GatewayError. What was fixed, and the time the translation took (the
        gateway's own), go into ``figures`` (the caller writes them)."""
        if self.upstream_stream:
            translator = self.translator()
            events = await _collect(self, up, translator, request_id)
            figures.add_translator(translator)
            t1 = time.perf_counter()
            message = aggregate(events)
        else:
            raw = up.read_ready()  # a body that came with its head: no wait
            if raw is None:
                raw = await up.read()
            t1 = time.perf_counter()
            off_loop = self.deps.loads_off_loop
            try:  # a large body decodes in the decoder child, not on the loop
                completion = (
                    await off_loop(raw)
                    if off_loop is not None and len(raw) > self.deps.decode_offload_bytes
                    else jsonutil.loads_upstream(raw)
                )
            except ValueError:
                raise errors.StreamProcessingError() from None
            del raw
            message = self._from_chat(completion, figures)
        figures.add_overhead(time.perf_counter() - t1)
        return message

    def _from_chat(self, completion: Any, figures: Figures) -> dict[str, Any]:
        deps = self.deps
        fixes = _Fixes(figures)
        upstream = self.route.upstream
        req = self.req
        names = _tool_names(req) if upstream.text_tool_calls and req.get("tools") else ()
        if "thinking" in req or "chat_template_kwargs" in req:
            hide, show = hides_thinking(req), shows_thinking(req)
        else:  # neither asked for: what both say then, without their calls
            hide = show = False
        lazy = (
            LazyNormaliser(thinking=upstream.inline_thinking, tool_names=names)
            if upstream.inline_thinking != "off" or names
            else None
        )
        budget = RepairBudget()
        message = from_chat(
            completion,
            model=self.req["model"],
            stop_sequences=self.stops,
            signing_key=deps.signing_key,
            on_bad_tool_args=fixes.count_unrepairable,
            on_repaired=fixes.count_repaired,
            normaliser=lazy,
            hide_thinking=hide,
            show_thinking=show,
            on_reasoning_hidden=fixes.count_hidden,
            hosts=self.client.hosts,
            secrets=deps.upstreams.secrets,
            repair_budget=budget,
        )
        normaliser = lazy.built if lazy is not None else None
        figures.add_fixes(
            repaired=fixes.repaired,
            unrepairable=fixes.unrepairable,
            normaliser=normaliser,
            over_budget=budget.refused,
            text_calls=normaliser.calls_found if normaliser is not None else 0,
        )
        return message


class _Fixes:
    """What one buffered reply's translation fixed, counted as it goes (one object, not a
    closure per counter)."""

    __slots__ = ("figures", "repaired", "unrepairable")

    def __init__(self, figures: Figures) -> None:
        self.figures = figures
        self.repaired = 0
        self.unrepairable = 0

    def count_repaired(self) -> None:
        self.repaired += 1

    def count_unrepairable(self) -> None:
        self.unrepairable += 1

    def count_hidden(self) -> None:
        self.figures.reasoning_hidden += 1


# what the upstream answers when it cannot take the request now, here (as the client's retries
# across replicas): the request may go to a fallback model
_FALLBACK_STATUSES = frozenset((502, 503, 504, 529))


def falls_over(err: errors.GatewayError) -> bool:
    """Whether a failed call (every replica tried, before any byte of a reply) goes to the
    route's fallbacks: no connection or one lost before the reply's head, a timeout, or a
    502/503/504/529 answer. Anything else (a 4xx, a 500) the fallback would answer alike."""
    return isinstance(err, errors.UpstreamUnavailable | errors.UpstreamTimeout) or (
        err.upstream_status in _FALLBACK_STATUSES
    )


def fall_back(
    deps: MessagesDeps,
    route: ModelRoute,
    as_text: frozenset[str],
    err: errors.GatewayError,
    request: bytes,
) -> bool:
    """Whether ``err`` is a refusal to answer by sending its content as text: the refused
    request (``request``, the payload sent) held that content (:func:`held`).
    Counted; learnt for the route (and logged the first time) unless the request's own bytes
    hold the refusal's wording: the engine may be quoting them, and what the route learns
    changes how every client's content is sent."""
    capability = err.refused
    if (
        capability is None
        or capability in as_text
        or not may_fall_back(route, capability)
        or capability not in held(request)
    ):
        return False
    deps.metrics.capability_fallbacks.labels(route.name, capability).inc()
    if echoed(capability, request):
        return True
    if deps.learned.learn(route.name, capability, route.capability_ttl):
        _log.warning(
            "capability_fallback",
            model=route.name,
            upstream=route.upstream.name,
            capability=capability,
            detail=f"the upstream refused {capability.replace('_', ' ')}: sent as "
            f"text for capability_ttl = {route.capability_ttl:g} s, then tried again "
            f'(set {capability} = "no" on this model to skip the refused tries)',
        )
    return True


async def count_input_tokens(
    deps: MessagesDeps, req: dict[str, Any], route: ModelRoute, request_id: str | None
) -> tuple[int, bool]:
    """``count_tokens``: (input_tokens, exact?) of a validated request, translated as the
    Messages call would send it (its content as text where the route's upstream needs it)."""
    as_text = route_text_only(route, deps.learned)

    def translate(on_drop: Callable[[str], None] | None = None) -> dict[str, Any]:
        return to_chat(
            req,
            route,
            keep_billing_header=deps.keep_billing_header,
            count_tokens=True,
            on_drop=on_drop,
            as_text=as_text,
            named_choice=named_tool_choice(route),
        )

    off = tokens.OffLoop(deps.run_off_loop, deps.decode_offload_bytes)
    chat_req = translate(deps.metrics.drop_field)
    try:
        return await tokens.count(deps.upstreams, route, chat_req, request_id, off=off)
    except errors.GatewayError as err:
        if err.refused is None or not fall_back(
            deps, route, as_text, err, jsonutil.dumpb(chat_req)
        ):
            raise
        as_text = as_text | {err.refused}
    return await tokens.count(deps.upstreams, route, translate(), request_id, off=off)


def _tool_names(req: dict[str, Any]) -> tuple[str, ...]:
    """The names of the tools the request offers (what a call written as text may name)."""
    if not req.get("tools"):
        return ()
    if req.get("tool_choice", {}).get("type") == "none":
        return ()
    # a deferred tool not loaded yet is not offered: a call to it stays text
    return tuple(t["name"] for t in offered_tools(req) if isinstance(t.get("name"), str))


def _stops(req: dict[str, Any]) -> tuple[str, ...]:
    stops = req.get("stop_sequences")
    if isinstance(stops, str):
        return (stops,)
    return tuple(stops or ())


async def _collect(
    call: Call, up: UpstreamResponse, translator: StreamTranslator, request_id: str | None
) -> bytes:
    """Translate a whole upstream stream for a buffered reply (a cut stream continued); a
    failure raises."""
    metrics, route = call.deps.metrics, call.route
    events: list[bytes] = []

    async def keep(data: bytes) -> None:
        events.append(data)

    try:
        await relay(
            call,
            up,
            translator,
            keep,
            Timing(0.0),
            metrics.inter_chunk.labels(route.name),
            request_id=request_id,
        )
    except SSEEventTooLarge:
        raise errors.StreamProcessingError() from None
    if translator.error is not None:
        raise translator.error
    return b"".join(events)
