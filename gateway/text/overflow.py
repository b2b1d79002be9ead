"""Upstream context-overflow errors, rewritten into the two forms Claude Code acts on.

Claude Code parses ``prompt is too long: P tokens > M maximum`` (the prompt alone
does not fit: it offers compaction) and ``input length and `max_tokens` exceed
context limit: P + C > M`` (it retries at once with a smaller ``max_tokens``).
vLLM, SGLang and llama.cpp each word the overflow their own way; the patterns
below read the numbers out of every wording found in their sources.

Wordings recognised (checked against the servers' sources):

  - vLLM <= 0.10: "This model's maximum context length is M tokens. However,
    you requested T tokens (P in the messages, C in the completion)." and
    "... However, your request has P input tokens." and "'max_tokens' or
    'max_completion_tokens' is too large: C. This model's maximum context
    length is M tokens and your request has P input tokens (C > M - P)."
  - vLLM renderer (0.11-0.17): "You passed P input tokens and requested C
    output tokens. However, the model's context length is only M tokens, ..."
    and the same with "input characters" (then only a bound on P is known).
  - vLLM >= 0.18: "This model's maximum context length is M tokens. However,
    you requested C output tokens and your prompt contains [at least ]P input
    tokens, for a total of [at least ]T tokens." (or "... contains N
    characters (more than X characters, which is the upper bound for Y input
    tokens)"), and "max_tokens=C cannot be greater than
    max_model_len=max_total_tokens=M".
  - vLLM engine: "The decoder prompt (length P) is longer than the maximum
    model length of M."
  - SGLang: "The input (P tokens) is longer than the model's context length
    (M tokens)." and "Requested token count exceeds the model's maximum
    context length of M tokens. You requested a total of T tokens: P tokens
    from the input messages and C tokens for the completion." and (scheduler)
    "Input length (P tokens) exceeds the maximum allowed length (X tokens)".
  - llama.cpp: ``{"error":{"code":400,"message":"request (P tokens) exceeds
    the available context size (M tokens), try increasing it","type":
    "exceed_context_size_error","n_prompt_tokens":P,"n_ctx":M}}``, and the
    older "input (P tokens) is larger than the max context size (M tokens)".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Named groups: ctx (the window), prompt, completion; max_input when only a bound
# on the prompt is known (it was measured in characters, or the tokenizer stopped
# at the limit), so the prompt is at least max_input + 1 tokens.
_CONTEXT_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        # vLLM <= 0.10, prompt + completion.
        r"maximum context length is (?P<ctx>\d+) tokens\. However, you requested \d+ tokens"
        r" \((?P<prompt>\d+) in the messages, (?P<completion>\d+) in the completion\)",
        # vLLM <= 0.10: the prompt alone ("However, your request has P input tokens"), or
        # max_tokens too large for it ("... and your request has P input tokens (C > M - P)").
        r"maximum context length is (?P<ctx>\d+) tokens(?:\. However,| and) your request has"
        r" (?P<prompt>\d+) input tokens(?: \((?P<completion>\d+) > \d+ - \d+\))?",
        # vLLM >= 0.18, the prompt measured in characters before tokenizing.
        r"maximum context length is (?P<ctx>\d+) tokens\. However, you requested"
        r" (?P<completion>\d+) output tokens and your prompt contains (?:at least )?\d+"
        r" characters \(more than \d+ characters, which is the upper bound for"
        r" (?P<max_input>\d+) input tokens\)",
        # vLLM >= 0.18, tokens ("at least P" when the tokenizer stopped at the limit).
        r"maximum context length is (?P<ctx>\d+) tokens\. However, you requested"
        r" (?P<completion>\d+) output tokens and your prompt contains (?:at least )?"
        r"(?P<prompt>\d+) input tokens",
        # vLLM renderer (0.11-0.17), characters, then tokens.
        r"You passed \d+ input characters and requested (?P<completion>\d+) output tokens\."
        r" However, the model's context length is only (?P<ctx>\d+) tokens, resulting in a"
        r" maximum input length of (?P<max_input>\d+) tokens",
        r"You passed (?P<prompt>\d+) input tokens and requested (?P<completion>\d+) output"
        r" tokens\. However, the model's context length is only (?P<ctx>\d+) tokens",
        # vLLM >= 0.16: max_tokens alone exceeds the window, checked before the prompt is
        # counted. No prompt count: it is reported as 0, so that Claude Code retries with
        # a max_tokens that fits the window (it asks for M - P - 1000); a real overflow,
        # if there is one, then comes back with real numbers.
        r"(?:max_tokens|max_completion_tokens)=(?P<completion>\d+)\s*cannot be greater than"
        r" max_model_len(?:=max_total_tokens)?=(?P<ctx>\d+)",
        # vLLM engine.
        r"prompt \(length (?P<prompt>\d+)\) (?:plus the number of requested output tokens"
        r" \(at least 1\) )?is longer than the maximum model length of (?P<ctx>\d+)",
        # SGLang, prompt + completion; prompt alone; the scheduler's input limit.
        r"maximum context length of (?P<ctx>\d+) tokens\. You requested a total of \d+ tokens:"
        r" (?P<prompt>\d+) tokens from the input messages and (?P<completion>\d+) tokens for"
        r" the completion",
        r"The input \((?P<prompt>\d+) tokens\) is longer than the model's context length"
        r" \((?P<ctx>\d+) tokens\)",
        r"Input length \((?P<prompt>\d+) tokens\) exceeds the maximum allowed length"
        r" \((?P<ctx>\d+) tokens\)",
        # llama.cpp, current and older (its JSON fields are preferred when present).
        r"request \((?P<prompt>\d+) tokens\) exceeds the available context size"
        r" \((?P<ctx>\d+) tokens\)",
        r"input \((?P<prompt>\d+) tokens\) is larger than the max context size"
        r" \((?P<ctx>\d+) tokens\)",
    )
)


def _numbers(m: re.Match[str]) -> tuple[int, int, int | None]:
    """(context, prompt, completion or None) from a context-pattern match."""
    found = {k: int(v) for k, v in m.groupdict().items() if v is not None}
    if "prompt" in found:
        prompt = found["prompt"]
    elif "max_input" in found:
        prompt = found["max_input"] + 1
    else:
        prompt = 0
    return found["ctx"], prompt, found.get("completion")


def _llamacpp_numbers(body: Mapping[str, Any] | None) -> tuple[int, int] | None:
    err = body.get("error") if body is not None else None
    if not isinstance(err, Mapping) or err.get("type") != "exceed_context_size_error":
        return None
    prompt, ctx = err.get("n_prompt_tokens"), err.get("n_ctx")
    if isinstance(prompt, int) and isinstance(ctx, int) and prompt >= 0 and ctx > 0:
        return ctx, prompt
    return None


def context_overflow_message(
    body: Mapping[str, Any] | None, text: str, max_tokens: int | None
) -> str | None:
    """Claude Code's two wordings for a context overflow, or None if this is not one.

    ``prompt is too long: P tokens > M maximum`` when the prompt alone does not fit
    (P >= M: not one output token would fit), ``input length and `max_tokens`
    exceed context limit: P + C > M`` otherwise. ``max_tokens`` (what the gateway
    sent upstream) stands in for C when the upstream does not state it.
    """
    ctx = prompt = completion = None
    if numbers := _llamacpp_numbers(body):
        ctx, prompt = numbers
    else:
        for pattern in _CONTEXT_PATTERNS:
            if m := pattern.search(text):
                ctx, prompt, completion = _numbers(m)
                break
    if ctx is None or prompt is None:
        return None
    if prompt >= ctx:
        return f"prompt is too long: {prompt} tokens > {ctx} maximum"
    if completion is None:
        completion = max_tokens
    if completion is None or prompt + completion <= ctx:
        return None  # numbers that do not show an overflow: say nothing rather than guess
    return (
        "input length and `max_tokens` exceed context limit: "
        f"{prompt} + {completion} > {ctx}, decrease input length or `max_tokens` and try again"
    )
