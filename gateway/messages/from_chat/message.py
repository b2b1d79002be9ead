"""A buffered OpenAI chat completion -> an Anthropic Message (pure).

Protocol facts relied on:

* Anthropic's Message is ``{id, type:"message", role:"assistant", model, content,
  stop_reason, stop_sequence, usage}``; ``stop_sequence`` is always present
  (null unless ``stop_reason`` is ``stop_sequence``), ``stop_reason`` is never
  null in a finished buffered reply, and ``usage`` needs ``input_tokens`` and
  ``output_tokens``; ``cache_read_input_tokens`` is added when the upstream
  reported cached prompt tokens (``tables.usage_from_chat``: the one usage table).
* Content order: a ``thinking`` block first, then ``text``, then ``tool_use``
  blocks. The Python SDK's strict validation requires ``thinking.signature``
  to be a string, so the gateway seals the thinking text into one (:mod:`.signatures`).
* Reasoning arrives as ``message.reasoning_content`` (vLLM <= 0.10 with a
  reasoning parser, llama.cpp, SGLang) or ``message.reasoning`` (Ollama, newer
  vLLM). Some servers send ``content: null`` next to tool calls, or an empty
  string; llama.cpp may report ``finish_reason: "stop"`` for a tool-call reply.
* ``tool_calls[i].function.arguments`` is a JSON string (a few servers send
  the object itself). Anthropic's ``tool_use.input`` must be an object: arguments that are
  not one are repaired (:mod:`gateway.local.tool_args`), as the stream repairs them, within
  one repair budget for the whole reply (past it a call's input is ``{}``, unrepairable).
* Local engines leave ``<think>`` reasoning and tool calls written as text in ``content``
  when their parsers are off: a ``normaliser`` (:mod:`gateway.local.normalise`, the
  stream's own) turns the content into thinking, text and tool_use blocks, in order.
* An upstream may answer 200 with an error object instead of a completion
  (``{"error": {...}}``, or SGLang's ``{"object": "error", ...}``).

Only ``choices[0]`` is read: the gateway never asks for ``n > 1``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gateway import errors
from gateway.local.normalise import CALL_PIECE, THINKING_PIECE, ContentNormaliser, LazyNormaliser
from gateway.local.tool_args import RepairBudget, repair_arguments
from gateway.messages.from_chat import signatures, tables
from gateway.text import ids
from gateway.text.redact import NO_SECRETS, Redactor

_REASONING_FIELDS = ("reasoning_content", "reasoning")
# dict first: a decoded completion's objects are dicts, found without the ABC's check
_MAPPING = (dict, Mapping)


def from_chat(
    completion: Mapping[str, Any],
    *,
    model: str,
    stop_sequences: Sequence[str] = (),
    signing_key: bytes,
    message_id: str | None = None,
    on_bad_tool_args: Callable[[], None] | None = None,
    on_repaired: Callable[[], None] | None = None,
    normaliser: ContentNormaliser | LazyNormaliser | None = None,
    hide_thinking: bool = False,
    show_thinking: bool = True,
    on_reasoning_hidden: Callable[[], None] | None = None,
    hosts: Sequence[str] = (),
    secrets: Redactor = NO_SECRETS,
    repair_budget: RepairBudget | None = None,
) -> dict[str, Any]:
    """Pure: OpenAI chat completion (already JSON-decoded) -> Anthropic Message dict.

    ``model`` is the name the client sent (echoed). ``message_id`` is injected by
    tests (else a fresh ``msg_`` id). ``repair_budget``: what the repairs of the reply's tool
    calls may spend together (None: a fresh one; the caller's, to read what it refused).
    Without ``show_thinking`` (no thinking was asked for) reasoning gets no block at all and
    ``on_reasoning_hidden`` is called; with ``hide_thinking`` (display "omitted") its block
    has only the signature. Raises
    :class:`errors.UpstreamError` for an in-band error object (scrubbed of ``hosts``
    and ``secrets``) and :class:`errors.StreamProcessingError` (500) for anything
    that is not a completion with a choice.
    """
    if not isinstance(completion, _MAPPING):
        raise errors.StreamProcessingError()
    choices = completion.get("choices")
    choice: Mapping[str, Any]
    if type(choices) is list and choices and type(choices[0]) is dict:
        choice = choices[0]  # the usual completion: no calls to find out
    else:
        if choices is None and _is_error_object(completion):
            raise errors.from_inband(completion, hosts=hosts, secrets=secrets)
        choice = _first_choice(completion)
    message = choice.get("message")
    if not isinstance(message, _MAPPING):
        raise errors.StreamProcessingError()

    # (kind, value) in order: "thinking" and "text" strings, "tool_use" blocks
    parts: list[tuple[str, Any]] = []
    budget = repair_budget or RepairBudget()  # the repairs of this reply's calls, together
    # (vLLM sends "reasoning_content": null and "tool_calls": [] with every answer)
    reasoning = (
        _reasoning(message) if message.get("reasoning_content") or message.get("reasoning") else ""
    )
    text = message.get("content")
    if type(text) is not str or not text:
        text = _text(message)
    if isinstance(normaliser, LazyNormaliser):  # built only if the content needs it
        normaliser = normaliser.for_whole(text, reasoning=bool(reasoning)) if text else None
    if reasoning:
        parts.append(("thinking", reasoning))
        if normaliser is not None and normaliser.reasoning_parsed():
            normaliser = None  # the engine parses reasoning: content is text (as streamed)
    if text and normaliser is None:
        parts.append(("text", text))
    elif text and normaliser is not None:
        seen: set[str] = set()
        for kind, value in normaliser.whole(text):
            if kind == CALL_PIECE:
                parts.append(
                    (
                        "tool_use",
                        _tool_use(
                            None,
                            value.name,
                            value.arguments,
                            seen,
                            budget,
                            on_bad_tool_args,
                            on_repaired,
                        ),
                    )
                )
            else:
                parts.append(("thinking" if kind == THINKING_PIECE else "text", value))
    if message.get("tool_calls") or message.get("function_call") is not None:
        for block in _tool_uses(message, budget, on_bad_tool_args, on_repaired):
            parts.append(("tool_use", block))
    if not show_thinking:
        for part_kind, _ in parts:
            if part_kind == "thinking":
                # no thinking was asked for: none is shown, as the API shows none (counted)
                parts = [part for part in parts if part[0] != "thinking"]
                if on_reasoning_hidden is not None:
                    on_reasoning_hidden()
                break
    content = _blocks(parts, signing_key, hide_thinking)
    has_tools = False
    for block in content:
        if block["type"] == "tool_use":
            has_tools = True
            break
    if not content:
        # Never an empty content array: one empty text block says "nothing was said".
        content.append({"type": "text", "text": ""})

    finish = choice.get("finish_reason")
    matched = tables.matched_stop_sequence(choice, stop_sequences) if stop_sequences else None
    # A buffered reply is finished: a missing finish_reason means a natural end.
    reason = tables.stop_reason(finish if isinstance(finish, str) else "stop", matched, has_tools)
    usage = tables.usage_from_chat(completion.get("usage"), completion.get("timings"))
    return {
        "id": message_id or ids.new_message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": matched if reason == "stop_sequence" else None,
        "usage": tables.anthropic_usage(usage),
    }


def _blocks(
    parts: list[tuple[str, Any]], signing_key: bytes, hide_thinking: bool
) -> list[dict[str, Any]]:
    """Content blocks from ordered parts, adjacent text (or thinking) joined into one block,
    as the stream's blocks are."""
    merged: list[tuple[str, Any]] = []
    for kind, value in parts:
        if merged and kind != "tool_use" and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + value)
        else:
            merged.append((kind, value))
    content: list[dict[str, Any]] = []
    for kind, value in merged:
        if kind == "thinking":
            content.append(
                {
                    "type": "thinking",
                    "thinking": "" if hide_thinking else value,
                    "signature": signatures.for_block(signing_key, value, hide_thinking),
                }
            )
        elif kind == "text":
            content.append({"type": "text", "text": value})
        else:
            content.append(value)
    return content


def _is_error_object(completion: Mapping[str, Any]) -> bool:
    if "choices" in completion:
        return False
    return completion.get("error") is not None or completion.get("object") == "error"


def _first_choice(completion: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], _MAPPING):
        raise errors.StreamProcessingError()
    return choices[0]


def _reasoning(message: Mapping[str, Any]) -> str:
    for field in _REASONING_FIELDS:
        value = message.get(field)
        if isinstance(value, str) and value:
            return value
    return ""


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
        text = "".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    else:
        text = ""
    if not text:
        # OpenAI puts a model's refusal beside an empty content; it is what was said.
        refusal = message.get("refusal")
        if isinstance(refusal, str):
            text = refusal
    return text


def _tool_uses(
    message: Mapping[str, Any],
    budget: RepairBudget,
    on_bad_tool_args: Callable[[], None] | None,
    on_repaired: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        calls = []
    legacy = message.get("function_call")
    if not calls and legacy is not None and isinstance(legacy, _MAPPING):
        calls = [{"function": legacy}]
    blocks: list[dict[str, Any]] = []
    seen: set[str] = set()
    for call in calls:
        if not isinstance(call, _MAPPING):
            continue
        function = call.get("function")
        if not isinstance(function, _MAPPING):
            function = {}
        blocks.append(
            _tool_use(
                call.get("id"),
                function.get("name"),
                function.get("arguments"),
                seen,
                budget,
                on_bad_tool_args,
                on_repaired,
            )
        )
    return blocks


def _tool_use(
    upstream_id: Any,
    name: Any,
    arguments: Any,
    seen: set[str],
    budget: RepairBudget,
    on_bad_tool_args: Callable[[], None] | None,
    on_repaired: Callable[[], None] | None,
) -> dict[str, Any]:
    block_id = ids.tool_use_id(upstream_id)
    while block_id in seen:  # ids must be unique within a message
        block_id = ids.new_tool_use_id()
    seen.add(block_id)
    if isinstance(arguments, Mapping):  # a few servers send the object itself
        tool_input = dict(arguments)
    elif arguments is not None and not isinstance(arguments, str):  # a list, a number
        tool_input = {}
        if on_bad_tool_args is not None:
            on_bad_tool_args()
    else:
        repaired = repair_arguments(arguments, budget)
        tool_input = repaired.value
        if repaired.outcome == "failed" and on_bad_tool_args is not None:
            on_bad_tool_args()
        elif repaired.outcome == "repaired" and on_repaired is not None:
            on_repaired()
    return {
        "type": "tool_use",
        "id": block_id,
        "name": name if isinstance(name, str) else "",
        "input": tool_input,
    }
