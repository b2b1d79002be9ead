"""The pass-through's byte work (pure): the model rewrite and the stream relay.

Replies come back byte for byte except ``model``, which is set back to the
alias. The rewrite is a byte replace of the compact ``"model":"<upstream_model>"``
pair (a JSON string cannot contain that sequence unescaped, so text is never
touched); an upstream that reports another model name (llama.cpp reports its
file path) has that name learned from its first event; a reply in another
spelling is re-encoded. The name is at the top level of a reply, a chat or
completions chunk, and inside ``response`` in a Responses event
(``response.created``, ``response.completed``); the byte replace finds it
either way.

What a stream's events say is read from bytes without a JSON parse, per
dialect (:class:`Dialect`): chat and completions chunks are bare ``data:``
events ended by a ``data: [DONE]`` line, with ``prompt_tokens`` /
``completion_tokens`` usage; a Responses stream is named events
(``event: response.output_text.delta``) ended by ``response.completed``,
``response.incomplete`` or ``response.failed``, with ``input_tokens`` /
``output_tokens`` usage and no ``[DONE]``. Compact key pairs cannot occur
unescaped inside a JSON string, so every match is a field.

An event that reports an error is written again, scrubbed (see :mod:`.inband`); only
blocks that could hide one (:func:`.inband.suspect`) are decoded, so every other event
keeps its bytes, less any upstream secret.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

from gateway import errors
from gateway.openai.inband import InbandErrors, suspect
from gateway.text import jsonutil
from gateway.text.redact import NO_SECRETS, Redactor
from gateway.text.sse import MAX_EVENT_BYTES, SSEDecoder, SSEEventTooLarge

# what a stream's decoded events go through, where one is set: an event in, the event
# (changed in place or not) or the events that go out in its place
Indexer = Callable[[dict[str, Any]], "dict[str, Any] | list[dict[str, Any]]"]

__all__ = [
    "CHAT_CHUNKS",
    "COMPLETION_CHUNKS",
    "RESPONSE_EVENTS",
    "Dialect",
    "ModelRewriter",
    "Relay",
]


class ModelRewriter:
    __slots__ = ("_alias", "_compact", "_needle")

    def __init__(self, upstream_model: str, alias: str) -> None:
        self._alias = alias
        # each route's pair encoded once, not per request (a pattern route may name many)
        self._needle, self._compact = _pairs(upstream_model, alias)

    def block(self, data: bytes) -> bytes | None:
        """Whole SSE events at once; None when one needs :meth:`__call__` (another name
        or spelling of ``model``). Each event names its model at most once, and the
        compact pair cannot occur inside a JSON string, so every match is one."""
        if data.find(self._needle) >= 0:  # find(), not ``in``: see inband.suspect
            return data.replace(self._needle, self._compact)
        if data.find(b'"model"') < 0:
            return data
        return None

    def __call__(self, payload: bytes) -> bytes:
        if payload.find(self._needle) >= 0:
            return payload.replace(self._needle, self._compact, 1)
        if payload.find(b'"model"') < 0:
            return payload
        try:
            obj = jsonutil.loads_upstream(payload)
        except ValueError:
            return payload
        holder = _model_holder(obj)
        if holder is None:
            return payload
        reported = holder["model"]
        if isinstance(reported, str):
            # the upstream names its model its own way (llama.cpp: the file path);
            # learn it, so the following events take the byte-replace path again
            needle = b'"model":' + jsonutil.dumpb_upstream(reported)
            if needle in payload:
                self._needle = needle
                return payload.replace(needle, self._compact, 1)
        holder["model"] = self._alias
        return jsonutil.dumpb_upstream(obj)


@functools.lru_cache(maxsize=256)
def _pairs(upstream_model: str, alias: str) -> tuple[bytes, bytes]:
    """The compact ``"model":`` pairs of the upstream's name and of the alias."""
    return (
        b'"model":' + jsonutil.dumpb_str(upstream_model),
        b'"model":' + jsonutil.dumpb_str(alias),
    )


def _model_holder(obj: Any) -> dict[str, Any] | None:
    """The object that names the model: the top level, or a Responses event's ``response``."""
    if not isinstance(obj, dict):
        return None
    if "model" in obj:
        return obj
    inner = obj.get("response")
    if isinstance(inner, dict) and "model" in inner:
        return inner
    return None


class Dialect:
    """What one stream protocol's bytes say: generated output, usage, the end, an error.

    ``token_keys``: compact ``"key":"`` prefixes whose non-empty string value is generated
    output; ``token_marker``: bytes that are output whatever follows (a tool call).
    """

    __slots__ = (
        "_completion",
        "_completion_key",
        "_prompt",
        "_token_keys",
        "_token_marker",
        "ended",
        "inband_error",
        "prompt_key",
        "responses",
    )

    def __init__(
        self,
        *,
        token_keys: tuple[bytes, ...],
        token_marker: bytes | None,
        usage_keys: tuple[bytes, bytes],
        ended: Callable[[bytes], bool],
        inband_error: Callable[[errors.GatewayError], bytes],
        responses: bool = False,
    ) -> None:
        self._token_keys = token_keys
        self._token_marker = token_marker
        self.prompt_key, self._completion_key = usage_keys  # every usage has prompt_key
        self._prompt = re.compile(re.escape(self.prompt_key) + rb"\s*:\s*(\d+)")
        self._completion = re.compile(re.escape(self._completion_key) + rb"\s*:\s*(\d+)")
        self.ended = ended  # does this block hold the stream's last event?
        self.inband_error = inband_error  # the event that ends a failed stream
        self.responses = responses  # the Responses API's error shapes (see .inband)

    def has_token(self, payload: bytes) -> bool:
        """Do these events carry generated output (for time to first token)? No JSON parse."""
        for key in self._token_keys:
            i = payload.find(key)
            while i >= 0:
                i += len(key)
                if payload[i : i + 1] != b'"':
                    return True
                i = payload.find(key, i)
        return self._token_marker is not None and payload.find(self._token_marker) >= 0

    def usage(self, payload: bytes) -> tuple[int, int] | None:
        """(prompt, completion) tokens of the last usage in a body or a block of events.

        The last one counts (a block may hold several events, and a later
        ``"usage":null`` must not hide an earlier count).
        """
        prompt = _last(self._prompt, payload, self.prompt_key)
        completion = _last(self._completion, payload, self._completion_key)
        if prompt is None and completion is None:
            return None
        return (prompt or 0, completion or 0)


def _last(pattern: re.Pattern[bytes], payload: bytes, key: bytes) -> int | None:
    at = payload.rfind(key)
    while at >= 0:
        match = pattern.match(payload, at)
        if match is not None:
            return int(match[1])
        at = payload.rfind(key, 0, at)
    return None


def _has_done_line(block: bytes) -> bool:
    """A whole ``data: [DONE]`` (or ``data:[DONE]``) line in these events?

    Found from ``[DONE]`` backwards: a regex scan of a whole block costs a millisecond
    on a bulk stream. A model writing that text puts it inside a JSON string, where it
    never starts a line (JSON strings hold no raw newline).
    """
    i = block.find(b"[DONE]")
    while i >= 0:
        for prefix in (b"data: ", b"data:"):
            start = i - len(prefix)
            if (
                start >= 0
                and block[start:i] == prefix
                and (start == 0 or block[start - 1 : start] == b"\n")
                and (block[i + 6 : i + 7] in (b"", b"\n"))
            ):
                return True
        i = block.find(b"[DONE]", i + 6)
    return False


_LAST_RESPONSE_EVENTS = (b'"response.completed"', b'"response.incomplete"', b'"response.failed"')


def _has_last_response_event(block: bytes) -> bool:
    """The event that ends a Responses stream, found by its type as a JSON string.

    Generated text holds that string only escaped (``\\"response.completed\\"``), where
    the closing quote follows a backslash, so an unescaped match is the event's type.
    """
    return any(name in block for name in _LAST_RESPONSE_EVENTS)


_CHUNK_USAGE = (b'"prompt_tokens"', b'"completion_tokens"')

CHAT_CHUNKS = Dialect(
    token_keys=(b'"content":"', b'"reasoning_content":"', b'"reasoning":"'),
    token_marker=b'"tool_calls":[',
    usage_keys=_CHUNK_USAGE,
    ended=_has_done_line,
    inband_error=errors.openai_sse_error,
)
COMPLETION_CHUNKS = Dialect(
    token_keys=(b'"text":"',),
    token_marker=None,
    usage_keys=_CHUNK_USAGE,
    ended=_has_done_line,
    inband_error=errors.openai_sse_error,
)
# output_text, reasoning_text and function_call_arguments deltas all carry "delta"
RESPONSE_EVENTS = Dialect(
    token_keys=(b'"delta":"',),
    token_marker=None,
    usage_keys=(b'"input_tokens"', b'"output_tokens"'),
    ended=_has_last_response_event,
    inband_error=errors.responses_sse_error,
    responses=True,
)


def _frame(name: bytes, data: bytes) -> bytes:
    if name:
        return b"event: " + name + b"\ndata: " + data + b"\n\n"
    return b"data: " + data + b"\n\n"


class Relay:
    """What to write for each read of one stream (pure).

    Fast path: the bytes up to the last blank line of a read are whole events, relayed as
    one block with ``model`` replaced in place; the rest waits for the next read. A stream
    framed with CR, or whose ``model`` is spelt another way, goes event by event through
    the SSE decoder (each event framed again as ``event: ...`` if it was named, and
    ``data: ...``) until the decoder is between events again (CR framing: to the end).
    Either way the relay notes the stream's end, the first generated token and the usage,
    and writes an event that reports an error again, scrubbed with ``hosts`` and ``secrets``.
    ``termination`` says how the stream ended (``end()`` or ``fail()``), for
    :class:`gateway.http.streaming.RelayedStream`.
    """

    __slots__ = (
        "_decoder",
        "_dialect",
        "_ended",
        "_framed_cr",
        "_has_token",
        "_inband",
        "_indexer",
        "_rewrite",
        "_secrets",
        "_tail",
        "_usage_key",
        "done",
        "first_token",
        "termination",
        "usage",
    )

    def __init__(
        self,
        rewrite: ModelRewriter,
        dialect: Dialect,
        *,
        hosts: Sequence[str] = (),
        secrets: Redactor = NO_SECRETS,
        indexer: Indexer | None = None,
    ) -> None:
        self._rewrite = rewrite
        # events re-encoded with what the SDKs need (llama.cpp's Responses stream): every
        # event then goes through the decoder
        self._indexer = indexer
        self._dialect = dialect
        self._inband = InbandErrors(responses=dialect.responses, hosts=hosts, secrets=secrets)
        self._secrets = secrets  # every relayed byte: no key, whatever the event says
        # looked up once: _observe runs on every block
        self._has_token = dialect.has_token
        self._ended = dialect.ended
        self._usage_key = dialect.prompt_key  # a block without it holds no usage
        self._decoder: SSEDecoder | None = None
        self._framed_cr = False  # CR line ends seen: event by event to the end
        self._tail = b""  # an event begun in a read, not yet ended
        self.done = False
        self.first_token = False
        self.usage: tuple[int, int] | None = None
        self.termination: str | None = None  # how the stream ended, once it has

    def feed(self, chunk: bytes) -> bytes:
        """One upstream read -> the bytes to write (b"" while an event is incomplete)."""
        if self._decoder is None and self._indexer is not None:
            self._decoder = SSEDecoder()
            self._framed_cr = True  # event by event to the end
        if self._decoder is None:
            data = self._tail + chunk if self._tail else chunk
            if chunk.find(b"\r") < 0:
                end = data.rfind(b"\n\n") + 2
                if end == 1:  # no whole event yet
                    if len(data) > MAX_EVENT_BYTES:
                        raise SSEEventTooLarge("SSE event exceeds the size limit")
                    self._tail = data
                    return b""
                block = data if end == len(data) else data[:end]
                out = self._rewrite.block(block)
                if out is not None:
                    self._tail = data[end:]
                    self._observe(block)
                    out = self._inband.block(out) if suspect(out) else out
                    return self._secrets.redact_bytes(out)
            self._tail = b""
            self._framed_cr = chunk.find(b"\r") >= 0
            self._decoder = SSEDecoder()
            chunk = data
        out = self._events(self._decoder.feed_named(chunk))
        if not self._framed_cr and self._decoder.idle:
            # between events, and model's name now learned (llama.cpp reports its own):
            # whole blocks again
            self._decoder = None
        return out

    def end(self) -> bytes:
        """The body ended: what is left (an event without its blank line still counts)."""
        decoder = self._decoder or SSEDecoder()
        rest = decoder.feed_named(self._tail) + decoder.flush_named()
        self._tail = b""
        out = self._events(rest)
        self.termination = "completed" if self.done else "upstream_truncated"
        return out

    def fail(self, err: errors.GatewayError, reason: str) -> bytes:
        """The stream fails with ``err`` (client-safe): the dialect's error event."""
        self.termination = reason
        return self._dialect.inband_error(err)

    def _observe(self, block: bytes) -> None:
        if not self.first_token and self._has_token(block):
            self.first_token = True
        if self._usage_key in block:
            self.usage = self._dialect.usage(block) or self.usage
        if not self.done and self._ended(block):
            self.done = True

    def _index(self, name: bytes, data: bytes) -> list[tuple[bytes, bytes]]:
        """One event through the indexer: the (name, data) of each event it gives back
        (a named event's new siblings named by their ``type``)."""
        assert self._indexer is not None
        try:
            event = jsonutil.loads(data)
        except ValueError:
            return [(name, data)]
        if not isinstance(event, dict):
            return [(name, data)]
        out = self._indexer(event)
        if isinstance(out, dict):
            return [(name, jsonutil.dumpb(out))]
        return [
            (
                name if e is event or not name else str(e.get("type", "")).encode(),
                jsonutil.dumpb(e),
            )
            for e in out
        ]

    def _events(self, events: list[tuple[bytes, bytes]]) -> bytes:
        """Decoded events framed again (an error scrubbed), then observed like a block."""
        frames = []
        for name, payload in events:
            data = self._rewrite(payload)
            pairs = [(name, data)] if self._indexer is None else self._index(name, data)
            for name_, data_ in pairs:
                scrubbed = (
                    self._inband.event(name_, data_)
                    if name_ == b"error" or suspect(b"data: " + data_)
                    else None
                )
                frames.append(scrubbed or _frame(name_, data_))
        block = b"".join(frames)
        self._observe(block)
        return self._secrets.redact_bytes(block)
