"""How a continuation's stream is spliced into the reply it continues
(:mod:`gateway.messages.continuation` decides when to continue and sends the request).

:class:`Continued` hands the *same* translator the continuation's chunks as if they were the
cut stream's: the role-only first chunk dropped, the usage made the whole reply's.
:class:`Regenerated` does the same for a reply cut while a tool call's arguments streamed:
the new stream's first call goes into the open block, in place of the held arguments.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import structlog

from gateway.messages.stream.translator import StreamTranslator
from gateway.text import jsonutil
from gateway.text.sse import SSEDecoder
from gateway.upstream.client import UpstreamResponse

__all__ = ["Continued", "Regenerated"]

_log = structlog.get_logger("gateway.messages")


class Continued:
    """A continuation's response as the translator should read it: its role-only first
    chunk dropped, its usage made the whole reply's (output tokens: the part before the cut
    added; the prompt: the first part's as reported, else left out). Read on the failure
    path only: each payload is decoded here once more."""

    __slots__ = ("_before", "_cache", "_ended", "_prompt", "_up", "progress")

    def __init__(self, up: UpstreamResponse, translator: StreamTranslator) -> None:
        self._up = up
        self.progress = up.progress
        self._before = self._generated(translator)
        self._ended = False
        prompt, _ = translator.usage
        reported = translator.prompt_reported
        self._prompt = prompt if reported else None
        self._cache = translator.cache_read if reported else None

    def release_if_complete(self, *, ended: bool = False) -> None:
        self._up.release_if_complete(ended=ended)

    @staticmethod
    def _generated(translator: StreamTranslator) -> int:
        """Output tokens of the reply before this part."""
        return translator.tokens_so_far

    async def chunks(self) -> AsyncIterator[bytes]:
        decoder = SSEDecoder()
        first = True
        async for raw in self._up.chunks():
            out: list[bytes] = []
            for payload in decoder.feed(raw):
                if first and _role_only(payload):
                    first = False
                    continue
                first = False
                spliced = self._splice(payload)
                if self._ended:
                    break
                if spliced is not None:
                    out.append(b"data: " + spliced + b"\n\n")
            if out:
                yield b"".join(out)
            if self._ended:
                return  # what follows does not fit the reply: a cut (no finish)
        # a partial last event is dropped: without a finish it is a cut like any other

    @property
    def ended(self) -> bool:
        """This part was ended here, its answer not fitting the reply (not cut)."""
        return self._ended

    def _splice(self, payload: bytes) -> bytes | None:
        """The payload as the translator should read it; None: dropped. Setting ``_ended``
        ends this part there (what follows does not fit the reply)."""
        return self._rewrite(payload)

    def _rewrite(self, payload: bytes) -> bytes:
        if payload.find(b'"usage"') < 0:  # (find, not in: see gateway/text/sse.py)
            return payload
        try:
            chunk = jsonutil.loads_upstream(payload)
        except ValueError:
            return payload
        usage = chunk.get("usage") if type(chunk) is dict else None
        if type(usage) is not dict:
            return payload
        usage = dict(usage)
        count = usage.get("completion_tokens")
        if isinstance(count, int):
            usage["completion_tokens"] = count + self._before
        usage.pop("prompt_tokens_details", None)
        if self._prompt is None:
            usage.pop("prompt_tokens", None)
        else:
            usage["prompt_tokens"] = self._prompt
            if self._cache is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": self._cache}
        if isinstance(usage.get("prompt_tokens"), int) and isinstance(
            usage.get("completion_tokens"), int
        ):
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        chunk = {**chunk, "usage": usage}
        chunk.pop("timings", None)  # llama.cpp's cache figures are the continuation's
        return jsonutil.dumpb_upstream(chunk)


class Regenerated(Continued):
    """A continuation that generates the cut reply's tool calls again whole.

    The client has seen the open call's ``content_block_start`` (its id and name) and none
    of its arguments. The new stream's text and reasoning before its first call are dropped
    while they are blank (reasoning always: the client's thinking block has closed); its
    first call must name the same tool, and it takes the open call's index and id, so its
    arguments go into the open block, in place of the ones held (the translator forgets
    those, and the calls that waited behind it, at that moment); later calls keep their
    order. Anything else (text, another tool, a finish before any call) ends this part as a
    cut: another continuation within the budget, else the stream's envelope, with the first
    arguments held (nothing was forgotten)."""

    __slots__ = ("_first", "_model", "_offset", "_open", "_translator")

    def __init__(
        self,
        up: UpstreamResponse,
        translator: StreamTranslator,
        open_call: tuple[int, str | None, str],
        *,
        model: str = "",
    ) -> None:
        super().__init__(up, translator)
        self._translator = translator
        self._open = open_call
        self._model = model
        self._first: tuple[Any, Any] | None = None  # the new first call's (index, id)
        self._offset = 0  # added to a later call's index

    @staticmethod
    def _generated(translator: StreamTranslator) -> int:
        return translator.tokens_before_calls

    def _splice(self, payload: bytes) -> bytes | None:
        if self._first is not None:
            if payload.find(b'"tool_calls"') >= 0:
                payload = self._map_calls(payload)
            return self._rewrite(payload)
        try:
            chunk = jsonutil.loads_upstream(payload)
        except ValueError:
            return payload  # the translator ends the stream as malformed
        if (
            type(chunk) is not dict
            or chunk.get("error") is not None
            or chunk.get("object") == "error"
        ):
            return payload  # an in-band error: a cut, or the translator's envelope
        choices = chunk.get("choices")
        if type(choices) is not list or not choices or type(choices[0]) is not dict:
            return None  # a usage chunk before any call: the reply's is at its end
        choice = choices[0]
        delta = choice.get("delta")
        delta = delta if type(delta) is dict else {}
        content = delta.get("content")
        if content and (type(content) is not str or content.strip()):
            return self._mismatch("text")
        calls = delta.get("tool_calls")
        if not calls:
            return self._mismatch("finish") if choice.get("finish_reason") is not None else None
        first = calls[0] if type(calls) is list else None
        function = first.get("function") if type(first) is dict else None
        name = function.get("name") if type(function) is dict else None
        index, _, open_name = self._open
        if name != open_name:
            return self._mismatch("another_tool")
        assert type(first) is dict
        self._first = (first.get("index"), first.get("id"))
        if type(first.get("index")) is int:
            self._offset = index - first["index"]
        self._translator.restart_tool_calls()
        delta = {
            key: value
            for key, value in delta.items()
            if key not in ("content", "reasoning_content", "reasoning")
        }
        chunk = {**chunk, "choices": [{**choice, "delta": delta}, *choices[1:]]}
        return self._rewrite(self._map_calls(jsonutil.dumpb_upstream(chunk)))

    def _map_calls(self, payload: bytes) -> bytes:
        """The new calls' indexes (and the first call's id) as the open reply knows them."""
        try:
            chunk = jsonutil.loads_upstream(payload)
        except ValueError:
            return payload
        choices = chunk.get("choices") if type(chunk) is dict else None
        if type(choices) is not list or not choices or type(choices[0]) is not dict:
            return payload
        delta = choices[0].get("delta")
        if type(delta) is not dict or type(delta.get("tool_calls")) is not list:
            return payload
        calls = delta["tool_calls"]
        assert self._first is not None
        first_index, first_id = self._first
        index, upstream_id, _ = self._open
        mapped = []
        for call in calls:
            if type(call) is not dict:
                mapped.append(call)
                continue
            call = dict(call)
            same = call.get("index") == first_index and (
                call.get("id") is None or call.get("id") == first_id
            )
            if same:
                call["index"] = index
                if "id" in call:
                    if upstream_id is None:
                        del call["id"]
                    else:
                        call["id"] = upstream_id
            elif type(call.get("index")) is int:
                call["index"] += self._offset
            mapped.append(call)
        choice = {**choices[0], "delta": {**delta, "tool_calls": mapped}}
        return jsonutil.dumpb_upstream({**chunk, "choices": [choice, *choices[1:]]})

    def _mismatch(self, what: str) -> bytes | None:
        """This part ends here: it does not regenerate the open call."""
        _log.warning("tool_call_regeneration_mismatch", model=self._model, found=what)
        self._ended = True
        return None


def _role_only(payload: bytes) -> bool:
    """A first chunk carrying only the assistant role (and empty content)."""
    if payload.find(b'"role"') < 0:
        return False
    try:
        chunk = jsonutil.loads_upstream(payload)
    except ValueError:
        return False
    if type(chunk) is not dict or chunk.get("usage") or chunk.get("error") is not None:
        return False
    choices = chunk.get("choices")
    if type(choices) is not list or len(choices) != 1 or type(choices[0]) is not dict:
        return False
    choice = choices[0]
    delta = choice.get("delta")
    if choice.get("finish_reason") is not None or type(delta) is not dict:
        return False
    return all(key == "role" or not value for key, value in delta.items())
