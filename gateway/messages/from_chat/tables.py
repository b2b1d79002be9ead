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
from typing import Any, NamedTuple

FINISH_TO_STOP: Mapping[str, str] = {
    "stop": "end_turn",
    "eos": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}

_MATCHED_STOP_FIELDS = ("stop_reason", "matched_stop", "stopping_word")
# dict first: a decoded body's objects are dicts, found without the ABC's check
_MAPPING = (dict, Mapping)

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


def stop_reason(finish_reason: str | None, matched: str | None, has_tool_calls: bool) -> str | None:
    """Anthropic stop_reason for an OpenAI finish_reason (None if there was none)."""
    if finish_reason is None:
        return None
    if has_tool_calls and finish_reason in ("stop", "tool_calls", "function_call"):
        return "tool_use"
    if matched is not None and finish_reason == "stop":
        return "stop_sequence"
    return FINISH_TO_STOP.get(finish_reason, "end_turn")


class Usage(NamedTuple):
    """An upstream's usage as the Anthropic API counts it."""

    input_tokens: int  # prompt tokens not read from the prompt cache
    output_tokens: int
    cache_read: int | None  # prompt tokens read from the cache; None: not reported
    prompt_reported: bool  # the upstream said how long the prompt was

    @property
    def prompt_tokens(self) -> int:
        """The whole prompt, cached part included (what the upstream calls prompt_tokens)."""
        return self.input_tokens + (self.cache_read or 0)


_new_tuple = tuple.__new__


def usage_from_chat(usage: Any, timings: Any = None) -> Usage | None:
    """THE usage table: an OpenAI usage object (and llama.cpp's ``timings`` beside it) ->
    :class:`Usage`; None when there is no usage object.

    Cached prompt tokens: ``usage.prompt_tokens_details.cached_tokens`` (vLLM with
    ``--enable-prompt-tokens-details``, SGLang, llama.cpp: its ``n_prompt_tokens_cache``),
    else llama.cpp's ``timings.cache_n``. Ollama's ``/v1`` reports neither (its Usage is
    prompt/completion/total only). ``prompt_tokens`` counts the cached part too; Anthropic's
    ``input_tokens`` does not, so it is taken out.
    """
    if not isinstance(usage, _MAPPING):
        return None
    reported: Any = usage.get("prompt_tokens")
    # counts: ints, not bools, not negative (as _is_count), read inline: per reply
    counted = type(reported) is int and reported >= 0
    prompt: int = reported if counted else 0
    cached = (
        _cached(usage, timings) if timings is not None or "prompt_tokens_details" in usage else None
    )
    if cached is not None:
        cached = min(cached, prompt)
        prompt -= cached
    output: Any = usage.get("completion_tokens")
    # Usage(...) made without its Python __new__ (per reply, per chunk where usage streams)
    return _new_tuple(
        Usage, (prompt, output if type(output) is int and output >= 0 else 0, cached, counted)
    )


def anthropic_usage(usage: Usage | None) -> dict[str, int]:
    """A Message's ``usage`` (also a final ``message_delta``'s): ``cache_read_input_tokens``
    only when the upstream reported cached tokens; ``cache_creation_input_tokens`` never
    (no upstream says what it wrote to its cache)."""
    if usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    if usage.cache_read is None:
        return {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}
    return {
        "input_tokens": usage.input_tokens,
        "cache_read_input_tokens": usage.cache_read,
        "output_tokens": usage.output_tokens,
    }


def _cached(usage: Mapping[str, Any], timings: Any) -> int | None:
    details = usage.get("prompt_tokens_details")
    if (
        details is not None
        and isinstance(details, _MAPPING)
        and _is_count(details.get("cached_tokens"))
    ):
        return int(details["cached_tokens"])
    if timings is not None and isinstance(timings, _MAPPING) and _is_count(timings.get("cache_n")):
        return int(timings["cache_n"])
    return None


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


_HIDDEN_DISPLAYS = frozenset(("omitted", "updates"))


def hides_thinking(req: Mapping[str, Any]) -> bool:
    """``thinking.display`` is ``"omitted"`` (or the ``"updates"`` beta): reasoning stays hidden.

    Anthropic then returns each thinking block with an empty ``thinking`` and only its
    signature; streamed, the block opens and closes with a ``signature_delta`` and no
    ``thinking_delta``.
    """
    thinking = req.get("thinking")
    return (
        thinking is not None
        and isinstance(thinking, _MAPPING)
        and thinking.get("display") in _HIDDEN_DISPLAYS
    )


_THINKING_SWITCHES = ("enable_thinking", "thinking")


def shows_thinking(req: Mapping[str, Any]) -> bool:
    """Thinking was asked for: ``thinking.type`` is not ``disabled``, or the client's own
    ``chat_template_kwargs`` turned the template's switch on.

    Without it the API returns no thinking block at all, so reasoning an upstream sends
    anyway is not shown (and is counted); ``display: "omitted"`` (:func:`hides_thinking`) is
    another thing: the block is there, with an empty ``thinking`` and its signature.
    """
    thinking = req.get("thinking")
    if (
        thinking is not None
        and isinstance(thinking, _MAPPING)
        and thinking.get("type") != "disabled"
    ):
        return True
    kwargs = req.get("chat_template_kwargs")
    return (
        kwargs is not None
        and isinstance(kwargs, _MAPPING)
        and any(kwargs.get(k) is True for k in _THINKING_SWITCHES)
    )
