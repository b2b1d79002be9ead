"""Tool calls an engine wrote as text, parsed on the OpenAI pass-through (pure).

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

On ``/v1/responses`` (:class:`ResponsesTextCalls`) a call becomes a ``function_call`` output
item after its message, with the Responses stream's events for it (see the class).

Routes without the knob pay nothing: their replies are relayed as bytes. With it, each
streamed event is decoded and encoded again (the relay's event-by-event path), and the
content goes once through the normaliser: linear in the content, what it holds bounded by
:data:`gateway.local.text_tools.MAX_HELD`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, TypeGuard

from gateway.local.normalise import CALL_PIECE, TEXT_PIECE, ContentNormaliser
from gateway.local.tool_args import RepairBudget, repair_arguments
from gateway.text import ids, jsonutil

__all__ = ["ChatTextCalls", "ResponsesTextCalls", "offered_names", "offered_response_names"]


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

    __slots__ = ("_next_index", "_norm", "calls", "names")

    def __init__(self, names: Collection[str]) -> None:
        self.names = names
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
        text, calls = self.split(pieces)
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
        text, calls = self.split(self._norm.whole(content))
        if not calls:
            return data
        for call in calls:
            del call["index"]  # a message's calls have no index
        message["content"] = text or None
        message["tool_calls"] = [*(engine_calls or ()), *calls]
        choice["finish_reason"] = "tool_calls"
        return jsonutil.dumpb_upstream(reply)

    def split(self, pieces: list[tuple[int, Any]]) -> tuple[str, list[dict[str, Any]]]:
        """The normaliser's pieces -> (their text, the calls among them, chat-shaped)."""
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


# ---------------------------------------------------------------- the Responses API


def offered_response_names(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The function names a Responses request offers (its tools are flat:
    ``{"type": "function", "name": ...}``; none under ``tool_choice: "none"``)."""
    tools = body.get("tools")
    if not isinstance(tools, list) or body.get("tool_choice") == "none":
        return ()
    return tuple(
        tool["name"]
        for tool in tools
        if isinstance(tool, dict)
        and tool.get("type") == "function"
        and isinstance(tool.get("name"), str)
    )


class ResponsesTextCalls:
    """One Responses reply's text calls, as ``function_call`` output items.

    Buffered (:meth:`body`): each call written in a ``message`` item's ``output_text`` is taken
    out of the text and becomes a ``function_call`` item right after that message. Streamed
    (:meth:`event`, one upstream event in, the events to send out): each
    ``response.output_text.delta`` keeps only what is certainly text (a possible call's start
    held, as on chat); at the message's ``response.output_item.done`` (its text, and that of
    its ``output_text.done`` and ``content_part.done``, the text without the calls) each call
    follows as the events of a function call: ``response.output_item.added`` (``arguments``
    empty, ``in_progress``), one ``response.function_call_arguments.delta`` with the whole
    arguments, ``response.function_call_arguments.done``, ``response.output_item.done``; the
    final ``response`` (``completed``/``incomplete``) lists them after the message. Items the
    upstream sends after them have their ``output_index`` moved up; ``sequence_number`` is
    counted again over what goes out (where the upstream sends none, the indexer after this
    one fills in the indexes, as for any llama.cpp stream).
    """

    __slots__ = ("_chat", "_made", "_norms", "_seq", "_shift", "_texts", "calls")

    def __init__(self, names: Collection[str]) -> None:
        self._chat = ChatTextCalls(names)  # the parser and the calls' shape
        self._norms: dict[str, ContentNormaliser] = {}  # message item id -> its normaliser
        self._texts: dict[str, list[str]] = {}  # message item id -> its text, calls out
        self._made: dict[str, list[dict[str, Any]]] = {}  # message item id -> its calls
        self._shift = 0  # function_call items inserted so far
        self._seq: int | None = None  # the next sequence_number, once the upstream sends one
        self.calls = 0

    # ------------------------------------------------------------ buffered

    def body(self, data: bytes) -> bytes:
        """A buffered reply's bytes; the same bytes when no message text holds a call."""
        try:
            reply = jsonutil.loads_upstream(data)
        except ValueError:
            return data
        output = reply.get("output") if isinstance(reply, dict) else None
        if not isinstance(output, list):
            return data
        out: list[Any] = []
        for item in output:
            out.append(item)
            if not _is_message(item):
                continue
            calls = []
            for part in item.get("content") or ():
                if isinstance(part, dict) and part.get("type") == "output_text":
                    text = part.get("text")
                    if isinstance(text, str) and text:
                        kept, found = self._split(self._chat_norm().whole(text))
                        part["text"] = kept
                        calls += found
            out += [_call_item(call, "completed") for call in calls]
        if not self.calls:
            return data
        reply["output"] = out
        return jsonutil.dumpb_upstream(reply)

    # ------------------------------------------------------------ streamed

    def event(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """One upstream event -> the events that go out in its place."""
        if isinstance(event.get("sequence_number"), int) and self._seq is None:
            self._seq = event["sequence_number"]
        index = event.get("output_index")
        if type(index) is int and self._shift:
            event["output_index"] = index + self._shift
        kind = event.get("type")
        item_id = event.get("item_id")
        out = [event]
        if kind == "response.output_text.delta" and isinstance(item_id, str):
            delta = event.get("delta")
            if isinstance(delta, str):
                norm = self._norms.get(item_id)
                if norm is None:
                    norm = self._norms[item_id] = self._chat_norm()
                    self._texts[item_id] = []
                    self._made[item_id] = []
                event["delta"] = self._take(item_id, norm.feed(delta))
        elif kind == "response.output_text.done" and item_id in self._norms:
            out = self._held(item_id, self._norms.pop(item_id), event) + out
            event["text"] = "".join(self._texts[item_id])
        elif kind == "response.content_part.done" and item_id in self._texts:
            part = event.get("part")
            if isinstance(part, dict) and part.get("type") == "output_text":
                part["text"] = "".join(self._texts[item_id])
        elif kind == "response.output_item.done":
            item = event.get("item")
            if _is_message(item) and item.get("id") in self._texts:
                norm = self._norms.pop(item["id"], None)
                if norm is not None:  # no output_text.done came: what it held is sent now
                    out = self._held(item["id"], norm, event) + out
                out += self._call_events(item, event.get("output_index"))
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            response = event.get("response")
            if isinstance(response, dict) and isinstance(response.get("output"), list):
                response["output"] = self._final_output(response["output"])
        if self._seq is not None:
            for e in out:
                e["sequence_number"] = self._seq
                self._seq += 1
        return out

    def _held(
        self, item_id: str, norm: ContentNormaliser, event: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """The end of a message's text: what the normaliser held, as a last delta event
        (when any of it is text; its calls are kept for after the message)."""
        rest = self._take(item_id, norm.flush())
        if not rest:
            return []
        at: dict[str, Any] = {
            k: event[k] for k in ("item_id", "output_index", "content_index") if k in event
        }
        at.setdefault("item_id", item_id)
        return [{"type": "response.output_text.delta", **at, "delta": rest, "logprobs": []}]

    def _take(self, item_id: str, pieces: list[tuple[int, Any]]) -> str:
        text, calls = self._split(pieces)
        self._texts[item_id].append(text)
        self._made[item_id] += [_call_item(call, "completed") for call in calls]
        return text

    def _call_events(self, message: dict[str, Any], index: Any) -> list[dict[str, Any]]:
        item_id = message["id"]
        self._fix_message(message)
        made = self._made.get(item_id) or []
        events: list[dict[str, Any]] = []
        for i, call in enumerate(made):
            at = {"output_index": index + 1 + i} if type(index) is int else {}
            events += [
                {
                    "type": "response.output_item.added",
                    **at,
                    "item": {**call, "arguments": "", "status": "in_progress"},
                },
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": call["id"],
                    **at,
                    "delta": call["arguments"],
                },
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": call["id"],
                    **at,
                    "arguments": call["arguments"],
                },
                {"type": "response.output_item.done", **at, "item": dict(call)},
            ]
        self._shift += len(made)
        return events

    def _fix_message(self, message: dict[str, Any]) -> None:
        text = "".join(self._texts.get(message["id"]) or ())
        for part in message.get("content") or ():
            if isinstance(part, dict) and part.get("type") == "output_text":
                part["text"] = text

    def _final_output(self, output: list[Any]) -> list[Any]:
        out: list[Any] = []
        for item in output:
            out.append(item)
            if _is_message(item) and item.get("id") in self._texts:
                self._fix_message(item)
                out += self._made.get(item["id"]) or []
        return out

    def _chat_norm(self) -> ContentNormaliser:
        return ContentNormaliser(thinking="off", tool_names=self._chat.names)

    def _split(self, pieces: list[tuple[int, Any]]) -> tuple[str, list[dict[str, Any]]]:
        text, calls = self._chat.split(pieces)
        self.calls += len(calls)
        return text, calls


def _is_message(item: Any) -> TypeGuard[dict[str, Any]]:
    return isinstance(item, dict) and item.get("type") == "message" and "id" in item


def _call_item(call: dict[str, Any], status: str) -> dict[str, Any]:
    """A chat tool call (as :class:`ChatTextCalls` makes it) as a ``function_call`` item."""
    call_id = call["id"]
    return {
        "id": "fc_" + call_id.removeprefix("call_"),
        "type": "function_call",
        "status": status,
        "arguments": call["function"]["arguments"],
        "call_id": call_id,
        "name": call["function"]["name"],
    }
