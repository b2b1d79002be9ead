"""The tables both reply paths share: stop reasons, usage, shown and hidden thinking.

Buffered replies (``from_chat``) and streams (``stream.StreamTranslator``) read
the same functions here, so a finish_reason maps to the same stop_reason on
both paths.

Upstreams report a matched stop string in different fields: vLLM in
``choices[0].stop_reason`` (a string; an int is a stop *token id*), SGLang in
``matched_stop``, llama.cpp in ``stopping_word`` on its native routes. A
reported string counts only if it is one of the sequences the client asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

FINISH_TO_STOP: Mapping[str, str] = {
    "stop": "end_turn",
    "eos": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}

_MATCHED_STOP_FIELDS = ("stop_reason", "matched_stop", "stopping_word")

# Upstreams whose OpenAI routes never say which stop string ended a generation
# (llama.cpp only in a server-wide debug field, Ollama not at all). For them the
# gateway does not forward ``stop``: it matches the sequences in the streamed text
# itself, ends the message there and closes the upstream request.
LOCAL_STOP_KINDS = frozenset({"llamacpp", "ollama"})

def matched_stop_sequence(choice: Mapping[str, Any], stop_sequences: Sequence[str]) -> str | None:
    if not stop_sequences:
        return None
    for key in _MATCHED_STOP_FIELDS:
        value = choice.get(key)
        if isinstance(value, str) and value in stop_sequences:
            return value
    return None


def stop_reason(
    finish_reason: str | None, matched: str | None, has_tool_calls: bool
) -> str | None:
    """Anthropic stop_reason for an OpenAI finish_reason (None if there was none)."""
    if finish_reason is None:
        return None
    if has_tool_calls and finish_reason in ("stop", "tool_calls", "function_call"):
        return "tool_use"
    if matched is not None and finish_reason == "stop":
        return "stop_sequence"
    return FINISH_TO_STOP.get(finish_reason, "end_turn")


def usage_tokens(usage: Any) -> tuple[int, int] | None:
    """(input_tokens, output_tokens) from an OpenAI usage object, if it has one."""
    if not isinstance(usage, Mapping):
        return None
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    return _count(prompt), _count(completion)


def _count(value: Any) -> int:
    # bool is an int subclass: `true` is not a token count
    return value if type(value) is int and value >= 0 else 0


_HIDDEN_DISPLAYS = frozenset(("omitted", "updates"))


def hides_thinking(req: Mapping[str, Any]) -> bool:
    """``thinking.display`` is ``"omitted"`` (or the ``"updates"`` beta): reasoning stays hidden.

    Anthropic then returns each thinking block with an empty ``thinking`` and only its
    signature; streamed, the block opens and closes with a ``signature_delta`` and no
    ``thinking_delta``.
    """
    thinking = req.get("thinking")
    return isinstance(thinking, Mapping) and thinking.get("display") in _HIDDEN_DISPLAYS


_THINKING_SWITCHES = ("enable_thinking", "thinking")


def shows_thinking(req: Mapping[str, Any]) -> bool:
    """Thinking was asked for: ``thinking.type`` is not ``disabled``, or the client's own
    ``chat_template_kwargs`` turned the template's switch on.

    Without it the API returns no thinking block at all, so reasoning an upstream sends
    anyway is not shown (and is counted); ``display: "omitted"`` (:func:`hides_thinking`) is
    another thing: the block is there, with an empty ``thinking`` and its signature.
    """
    thinking = req.get("thinking")
    if isinstance(thinking, Mapping) and thinking.get("type") != "disabled":
        return True
    kwargs = req.get("chat_template_kwargs")
    return isinstance(kwargs, Mapping) and any(kwargs.get(k) is True for k in _THINKING_SWITCHES)
