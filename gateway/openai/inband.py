"""In-band errors of pass-through replies (pure): found without a parse, scrubbed as on every
route.

Protocol facts relied on:

* A chat or completions stream reports a failure as a ``data:`` event holding
  ``{"error": {...}}`` (vLLM, llama.cpp, Ollama) or a bare ``{"object": "error", ...}``
  (SGLang, older vLLM); a buffered reply, as a body of that shape with status 200.
* A Responses stream reports one as an ``error`` event (``type``, ``code``, ``message``,
  ``param``, ``sequence_number``), or ends with ``response.failed``, whose
  ``response.error`` holds ``code`` and ``message``; a buffered Response, as
  ``status: "failed"`` with that ``error``.
* Every ``data:`` of these streams is a JSON object, or ``[DONE]`` on chat and completions.
  An event is decoded, and judged by what it decodes to, when its bytes could hide an error:
  they hold ``"error"``, a ``\\u00`` escape (``"\\u0065rror"`` is the same key), an event
  named ``error``, or a ``data:`` that does not open an object (``data: {``) and is not
  ``[DONE]``. Anything else cannot decode to an error, so it keeps its bytes unparsed (the
  hot path: a few ``bytes.count`` per block). What decodes to no JSON object, and any event
  named ``error``, is an error (a 5xx: replaced whole); so is ``{"type": "error"}`` on
  every route (the Anthropic shape some proxies send).
* Secrets are exact strings: every relayed byte passes :meth:`Redactor.redact_bytes`, so
  an upstream's key never reaches a client in an event that reports no error either.

Scrubbing is the Anthropic route's (:func:`errors.from_inband`): a 4xx code keeps its
message, scrubbed; no code, or a 5xx one, is replaced whole. An error is written again in
its route's shape: on chunks a ``data:`` error body; on a Responses stream an ``error``
event keeping its ``sequence_number``, or the ``response.failed`` event with only its
``error`` replaced. Every other event keeps its bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway import errors
from gateway.text import jsonutil
from gateway.text.redact import NO_SECRETS, Redactor

__all__ = ["NEEDLE", "InbandErrors", "suspect"]

NEEDLE = b'"error"'
_ESCAPE = b"\\u00"  # how a letter of "error" can be spelt in JSON (\u0065, \u0072, \u006f)
_DONE = b"[DONE]"


def suspect(block: bytes) -> bool:
    """Whether ``block`` (whole events, or one event's data) may report an error: only those
    are decoded (see the module doc)."""
    # find(), not ``in``: on bytes ``in`` first tries its operand as an int and raises and
    # clears a TypeError inside (about 2 K instructions a test on Python 3.11)
    if block.find(NEEDLE) >= 0 or block.find(_ESCAPE) >= 0:
        return True
    # one search for what chunk streams never hold, the two spellings only where found
    if block.find(b"event:") >= 0 and (
        block.find(b"event: error") >= 0 or block.find(b"event:error") >= 0
    ):
        return True
    data = block.count(b"data:")
    objects = block.count(b"data: {")
    # every [DONE] is a data: that opens no object, so data == objects means none: one
    # count fewer on the blocks that end no stream
    return data != objects and data != objects + block.count(b"data: [DONE]")


class InbandErrors:
    """Finds one route's in-band errors and writes them again, scrubbed."""

    __slots__ = ("_hosts", "_responses", "_secrets")

    def __init__(
        self, *, responses: bool, hosts: Sequence[str] = (), secrets: Redactor = NO_SECRETS
    ) -> None:
        self._responses = responses  # the Responses API's shapes, else chat and completions
        self._hosts = hosts
        self._secrets = secrets

    def block(self, block: bytes) -> bytes:
        """Whole events framed with LF: error events written again, the rest byte for byte."""
        if not suspect(block):
            return block
        events = block.split(b"\n\n")
        changed = False
        for i, event in enumerate(events):
            if suspect(event):
                frame = self.event(*_fields(event))
                if frame is not None:
                    events[i] = frame[:-2]  # the join puts the blank line back
                    changed = True
        return b"\n\n".join(events) if changed else block

    def event(self, name: bytes, payload: bytes | None) -> bytes | None:
        """The frame that replaces this event (its name, its data) if it reports an error;
        ``payload`` None: the event has no data (a comment), nothing to replace."""
        if payload is None or (not self._responses and payload.strip() == _DONE):
            return None
        obj = _object(payload)
        if obj is None or name == b"error":
            err = self._error(obj)
            if self._responses:
                seq = None if obj is None else obj.get("sequence_number")
                return errors.responses_sse_error(
                    err, seq if isinstance(seq, int) and not isinstance(seq, bool) else None
                )
            return errors.openai_sse_error(err)
        if not self._responses:
            found = errors.inband_error(obj, hosts=self._hosts, secrets=self._secrets)
            return None if found is None else errors.openai_sse_error(found)
        kind = obj.get("type")
        if kind == "response.failed":
            response = obj.get("response")
            if not isinstance(response, dict) or response.get("error") is None:
                return None
            response["error"] = self._failure(response["error"])
            data = jsonutil.dumpb_upstream(obj)
            return (b"event: " + name + b"\ndata: " if name else b"data: ") + data + b"\n\n"
        if kind == "error":
            err = errors.from_inband(obj, hosts=self._hosts, secrets=self._secrets)
        else:
            found = errors.inband_error(obj, hosts=self._hosts, secrets=self._secrets)
            if found is None:
                return None
            err = found
        seq = obj.get("sequence_number")
        return errors.responses_sse_error(
            err, seq if isinstance(seq, int) and not isinstance(seq, bool) else None
        )

    def body(self, data: bytes) -> bytes:
        """A buffered 200 reply: an error body raises its error, scrubbed, and so does one
        that is no JSON object; a failed Response comes back with only its ``error``
        replaced; anything else as it is, without secrets."""
        obj = _object(data)
        if obj is None:
            raise self._error(None)
        if self._responses and obj.get("object") == "response":
            if obj.get("error") is None:
                return data
            obj["error"] = self._failure(obj["error"])
            return jsonutil.dumpb_upstream(obj)
        err = errors.inband_error(obj, hosts=self._hosts, secrets=self._secrets)
        if err is not None:
            raise err
        return self._secrets.redact_bytes(data)

    def _error(self, obj: dict[str, Any] | None) -> errors.UpstreamError:
        """An event that is an error whatever it holds: scrubbed if an object, else a 5xx."""
        if obj is None:
            return errors.from_inband({}, hosts=self._hosts, secrets=self._secrets)
        found = errors.inband_error(obj, hosts=self._hosts, secrets=self._secrets)
        return found or errors.from_inband({"error": obj}, hosts=self._hosts, secrets=self._secrets)

    def _failure(self, error: Any) -> dict[str, Any]:
        err = errors.from_inband({"error": error}, hosts=self._hosts, secrets=self._secrets)
        return errors.responses_failure(err)


def _object(payload: bytes) -> dict[str, Any] | None:
    """The JSON object of a payload; None for anything else."""
    try:
        obj = jsonutil.loads_upstream(payload)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _fields(event: bytes) -> tuple[bytes, bytes | None]:
    """(name, data) of one event framed with LF, read as :class:`gateway.text.sse.SSEDecoder`
    reads them (data lines joined with LF, one space after the colon dropped); data None
    for an event without a ``data`` line."""
    name = b""
    data: list[bytes] = []
    for line in event.split(b"\n"):
        field, _, value = line.partition(b":")
        if not field:
            continue  # a comment, or a blank line
        if value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            data.append(value)
        elif field == b"event":
            name = value
    return name, b"\n".join(data) if data else None
