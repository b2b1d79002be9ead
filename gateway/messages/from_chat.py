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
  the object itself). Anthropic's ``tool_use.input`` must be an object.
* An upstream may answer 200 with an error object instead of a completion
  (``{"error": {...}}``, or SGLang's ``{"object": "error", ...}``).

Only ``choices[0]`` is read: the gateway never asks for ``n > 1``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gateway import errors
from gateway.messages import signatures, tables
from gateway.text import ids, jsonutil
from gateway.text.redact import NO_SECRETS, Redactor

_REASONING_FIELDS = ("reasoning_content", "reasoning")


def from_chat(
    completion: Mapping[str, Any],
    *,
    model: str,
    stop_sequences: Sequence[str] = (),
    signing_key: bytes,
    message_id: str | None = None,
    on_bad_tool_args: Callable[[], None] | None = None,
    hide_thinking: bool = False,
    show_thinking: bool = True,
    on_reasoning_hidden: Callable[[], None] | None = None,
    hosts: Sequence[str] = (),
    secrets: Redactor = NO_SECRETS,
) -> dict[str, Any]:
    """Pure: OpenAI chat completion (already JSON-decoded) -> Anthropic Message dict.

    ``model`` is the name the client sent (echoed). ``message_id`` is injected by
    tests (else a fresh ``msg_`` id). Without ``show_thinking`` (no thinking was asked
    for) reasoning gets no block at all and ``on_reasoning_hidden`` is called; with
    ``hide_thinking`` (display "omitted") its block has only the signature. Raises
    :class:`errors.UpstreamError` for an in-band error object (scrubbed of ``hosts``
    and ``secrets``) and :class:`errors.StreamProcessingError` (500) for anything
    that is not a completion with a choice.
    """
    if not isinstance(completion, Mapping):
        raise errors.StreamProcessingError()
    if _is_error_object(completion):
        raise errors.from_inband(completion, hosts=hosts, secrets=secrets)
    choice = _first_choice(completion)
    message = choice.get("message")
    if not isinstance(message, Mapping):
        raise errors.StreamProcessingError()

    content: list[dict[str, Any]] = []
    reasoning = _reasoning(message)
    if reasoning and not show_thinking:
        if on_reasoning_hidden is not None:
            on_reasoning_hidden()
    elif reasoning:
        content.append(
            {
                "type": "thinking",
                "thinking": "" if hide_thinking else reasoning,
                "signature": signatures.seal(signing_key, reasoning),
            }
        )
    text = _text(message)
    if text:
        content.append({"type": "text", "text": text})
    tool_uses = _tool_uses(message, on_bad_tool_args)
    content.extend(tool_uses)
    if not content:
        # Never an empty content array: one empty text block says "nothing was said".
        content.append({"type": "text", "text": ""})

    finish = choice.get("finish_reason")
    matched = tables.matched_stop_sequence(choice, stop_sequences)
    # A buffered reply is finished: a missing finish_reason means a natural end.
    reason = tables.stop_reason(
        finish if isinstance(finish, str) else "stop", matched, bool(tool_uses)
    )
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


def _is_error_object(completion: Mapping[str, Any]) -> bool:
    if "choices" in completion:
        return False
    return completion.get("error") is not None or completion.get("object") == "error"


def _first_choice(completion: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
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
    message: Mapping[str, Any], on_bad_tool_args: Callable[[], None] | None
) -> list[dict[str, Any]]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        calls = []
    legacy = message.get("function_call")
    if not calls and isinstance(legacy, Mapping):
        calls = [{"function": legacy}]
    blocks: list[dict[str, Any]] = []
    seen: set[str] = set()
    for call in calls:
        if not isinstance(call, Mapping):
            continue
        function = call.get("function")
        if not isinstance(function, Mapping):
            function = {}
        name = function.get("name")
        block_id = ids.tool_use_id(call.get("id"))
        while block_id in seen:  # ids must be unique within a message
            block_id = ids.new_tool_use_id()
        seen.add(block_id)
        tool_input = _tool_input(function.get("arguments"))
        if tool_input is None:
            if on_bad_tool_args is not None:
                on_bad_tool_args()
            tool_input = {}
        blocks.append(
            {
                "type": "tool_use",
                "id": block_id,
                "name": name if isinstance(name, str) else "",
                "input": tool_input,
            }
        )
    return blocks


def _tool_input(arguments: Any) -> dict[str, Any] | None:
    """The arguments as an object; None when they are not one."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}  # a call without parameters
    value = arguments
    # A string is JSON text; some models double-encode it, so a string may hold another.
    for _ in range(2):
        if not isinstance(value, str):
            break
        try:
            value = jsonutil.loads(value)
        except ValueError:
            return None
    return dict(value) if isinstance(value, Mapping) else None
