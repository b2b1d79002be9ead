"""Tool calls an engine wrote as text, parsed on the chat pass-through (pure).

An engine started without its tool parser (llama.cpp without ``--jinja``, vLLM without
``--enable-auto-tool-choice``) leaves a call in ``content`` in the model's native format
(Hermes ``<tool_call>{…}</tool_call>``, Qwen3-Coder, Mistral, Llama's JSON: the readers of
:mod:`gateway.local.text_tools`). ``/v1/messages`` turns it into a ``tool_use`` block; on
``/v1/chat/completions`` an OpenAI SDK client would get the text. Where the route's upstream
says so (``upstreams.X.passthrough_text_tool_calls``, with ``text_tool_calls``) and the
request offered tools, a call to an offered tool becomes what a tool parser would have sent:

* buffered: ``message.tool_calls`` (after any the engine parsed), the call's text taken out
  of ``message.content`` (``null`` when nothing else is left), ``finish_reason`` ``tool_calls``;
* streamed: each chunk's ``delta.content`` holds only what is certainly text (a possible
  call's start is held, as :class:`~gateway.local.normalise.ContentNormaliser` does); a call
  goes out as a ``delta.tool_calls`` entry, whole (its arguments strict JSON: repaired as
  :mod:`gateway.local.tool_args` does), in the chunk where it ends; the finishing
  chunk's ``finish_reason`` ``stop`` becomes ``tool_calls`` once a call went out.

Routes without the knob pay nothing: their replies are relayed as bytes. With it, each
streamed event is decoded and encoded again (the relay's event-by-event path), and the
content goes once through the normaliser: linear in the content, what it holds bounded by
:data:`gateway.local.text_tools.MAX_HELD`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from gateway.local.normalise import CALL_PIECE, TEXT_PIECE, ContentNormaliser
from gateway.local.tool_args import RepairBudget, repair_arguments
from gateway.text import ids, jsonutil

__all__ = ["ChatTextCalls", "offered_names"]


def offered_names(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The function names a chat request offers (none under ``tool_choice: "none"``)."""
    tools = body.get("tools")
    if not isinstance(tools, list) or body.get("tool_choice") == "none":
        return ()
    names = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return tuple(names)


class ChatTextCalls:
    """One reply's text calls: :meth:`event` per streamed chunk, or :meth:`body` once."""

    __slots__ = ("_names", "_next_index", "_norm", "calls")

    def __init__(self, names: Collection[str]) -> None:
        self._names = names
        self._norm = ContentNormaliser(thinking="off", tool_names=names)
        self._next_index = 0  # the index the next call written as text takes
        self.calls = 0  # calls found in text

    def event(self, event: dict[str, Any]) -> dict[str, Any]:
        """One decoded chunk, its content and calls as a tool parser would have sent them."""
        choice = _first_choice(event)
        if choice is None:
            return event
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return event
        engine_calls = delta.get("tool_calls")
        if isinstance(engine_calls, list):  # the engine's own parser: ours follow its indexes
            for call in engine_calls:
                if isinstance(call, dict) and type(call.get("index")) is int:
                    self._next_index = max(self._next_index, call["index"] + 1)
        content = delta.get("content")
        finish = choice.get("finish_reason")
        if not isinstance(content, str) and finish is None:
            return event
        pieces = self._norm.feed(content) if isinstance(content, str) and content else []
        if finish is not None:
            pieces += self._norm.flush()
        text, calls = self._split(pieces)
        if isinstance(content, str) or text:
            delta["content"] = text
        if calls:
            delta["tool_calls"] = [*(engine_calls or ()), *calls]
        if finish == "stop" and self.calls:
            choice["finish_reason"] = "tool_calls"
        return event

    def body(self, data: bytes) -> bytes:
        """A buffered reply's bytes; the same bytes when its content holds no call."""
        try:
            reply = jsonutil.loads_upstream(data)
        except ValueError:
            return data
        choice = _first_choice(reply)
        message = choice.get("message") if choice is not None else None
        if choice is None or not isinstance(message, dict):
            return data
        content = message.get("content")
        if not isinstance(content, str) or not content:
            return data
        engine_calls = message.get("tool_calls")
        if isinstance(engine_calls, list):
            self._next_index = len(engine_calls)
        text, calls = self._split(self._norm.whole(content))
        if not calls:
            return data
        for call in calls:
            del call["index"]  # a message's calls have no index
        message["content"] = text or None
        message["tool_calls"] = [*(engine_calls or ()), *calls]
        choice["finish_reason"] = "tool_calls"
        return jsonutil.dumpb_upstream(reply)

    def _split(self, pieces: list[tuple[int, Any]]) -> tuple[str, list[dict[str, Any]]]:
        text: list[str] = []
        calls: list[dict[str, Any]] = []
        for kind, value in pieces:
            if kind == TEXT_PIECE:
                text.append(value)
            elif kind == CALL_PIECE:
                calls.append(
                    {
                        "index": self._next_index,
                        "id": "call_" + ids.new_tool_use_id().removeprefix("toolu_"),
                        "type": "function",
                        "function": {"name": value.name, "arguments": _arguments(value.arguments)},
                    }
                )
                self._next_index += 1
                self.calls += 1
        return "".join(text), calls


def _arguments(raw: str) -> str:
    """Strict JSON object text, as a tool parser sends (a model's loose JSON repaired,
    bounded; what cannot be repaired is ``{}``)."""
    repaired = repair_arguments(raw, RepairBudget())
    if repaired.outcome == "ok" and raw.strip():
        return raw
    return jsonutil.dumps(repaired.value)


def _first_choice(obj: Any) -> dict[str, Any] | None:
    if not isinstance(obj, dict):
        return None
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    return choices[0]
