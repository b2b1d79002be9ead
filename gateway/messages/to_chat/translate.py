"""Pure translation: a validated Anthropic Messages request -> an OpenAI chat request.

The conversation (system prompt and turns -> chat messages: tool results, merged turns,
prior reasoning, replayed searches, images and references as text, the billing header) is
:mod:`.chat_turns`; this module builds the rest of the body around it.

Protocol facts relied on:

- A final assistant turn is a prefill. vLLM/SGLang continue it with
  ``continue_final_message: true``, which vLLM refuses together with
  ``add_generation_prompt: true`` (its default). A turn ending in a search's result is no
  prefill: the model answers that ``tool`` message.
- Chat templates (Qwen3, DeepSeek, GLM, ...) read the reasoning switch from
  ``chat_template_kwargs`` as ``enable_thinking`` or ``thinking``. vLLM, SGLang and
  llama-server pass ``chat_template_kwargs`` to the template; so without ``thinking`` in the
  request (the API then does not think) both switches go up off unless the client set its
  own. Ollama's ``/v1`` ignores unknown fields; its switch is ``reasoning_effort``
  (``high``, ``medium``, ``low`` or ``none``: ``none`` turns thinking off; openai/openai.go,
  ``FromChatRequest``).
- Anthropic-defined client tools (``bash_*``, ``text_editor_*``, ``memory_*``,
  ``computer_*``) carry no schema; they go up as function tools under the client's name,
  with the schema Anthropic documents (:mod:`.client_tools`). Server tools never get here
  (validation refuses them), except web search when the gateway runs it: a function
  ``web_search(query)`` (:mod:`.web_search`).
- vLLM and SGLang accept ``stream_options.continuous_usage_stats`` (usage on every chunk,
  so the first one carries the prompt's token count); other servers may refuse it.
  llama.cpp instead takes ``return_progress: true``: its first chunks carry
  ``prompt_progress.total``, the prompt's token count.
- A system turn may set this turn's ``output_config`` fields (:mod:`.turn_control`): the
  merged output_config is what is translated.
- A tool with ``defer_loading: true`` is not in the model's context until a tool search
  loads it: a ``tool_reference`` naming it in a ``tool_result`` of the conversation (Claude
  Code's ToolSearch returns them). Until then it is not offered upstream at all (a small
  model calls whatever it is offered, placeholders included); once loaded it is an ordinary
  function, ``defer_loading`` left out. A ``tool_choice`` naming it loads it too.
- An upstream that cannot take images or ``tool_reference`` parts
  (:mod:`gateway.local.capabilities`) gets them as text (``as_text``, see
  :mod:`.chat_turns`). One that ignores a named ``tool_choice`` object
  (``named_choice=False``: llama.cpp, Ollama) is offered only that tool, with
  ``tool_choice: "required"``.

Only an allow-list reaches the upstream: the translated fields plus ``temperature``,
``top_p``, ``top_k``, ``chat_template_kwargs`` and ``continue_final_message``. Every other
top-level field is reported through ``on_drop`` and never sent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gateway.messages import fetch_blocks
from gateway.messages.from_chat import tables
from gateway.messages.from_chat.tables import LOCAL_STOP_KINDS
from gateway.messages.request.validate import is_custom_tool
from gateway.messages.search_blocks import TOOL_TYPES
from gateway.messages.search_blocks import function as web_search_function
from gateway.messages.to_chat import turn_control
from gateway.messages.to_chat.client_tools import to_function
from gateway.messages.to_chat.turns import PLAIN, Render, messages
from gateway.text import jsonutil

if TYPE_CHECKING:
    from gateway.ops.config import ModelRoute

__all__ = ["offered_tools", "to_chat"]

# THE allow-list: every top-level field read here; anything else is dropped and counted.
_TRANSLATED = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "stream",
        "stop_sequences",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        "temperature",
        "top_p",
        "top_k",
        "chat_template_kwargs",
        "continue_final_message",
    }
)
_AS_IS = ("temperature", "top_p", "top_k")
# A token count generates nothing: these would only be dropped.
_NOT_COUNTED = frozenset({"max_tokens", "stream", "stop_sequences"})
_TRANSLATED_FOR_COUNT = _TRANSLATED - _NOT_COUNTED

# THE tool_choice table.
_TOOL_CHOICE: Mapping[str, str] = {"auto": "auto", "any": "required", "none": "none"}
_EFFORT: Mapping[str, str] = {"xhigh": "max"}
_CONTINUOUS_USAGE_KINDS = frozenset({"vllm", "sglang"})
# Servers that render chat_template_kwargs into the prompt; others may refuse the field
_TEMPLATE_KWARGS_KINDS = frozenset({"vllm", "sglang", "llamacpp"})
_THINKING_SWITCHES = ("thinking", "enable_thinking")  # the names templates read


def to_chat(
    req: Mapping[str, Any],
    route: ModelRoute,
    *,
    keep_billing_header: bool = False,
    count_tokens: bool = False,
    on_drop: Callable[[str], None] | None = None,
    as_text: frozenset[str] = frozenset(),
    named_choice: bool = True,
) -> dict[str, Any]:
    """The OpenAI chat-completions body for ``route`` (``req`` must be validated).

    ``as_text``: the capabilities (``images``, ``tool_references``) whose content goes as
    text; ``named_choice``: whether ``tool_choice`` may name a tool in the object form."""
    render = Render("images" in as_text, "tool_references" in as_text) if as_text else PLAIN
    out: dict[str, Any] = {
        "model": route.upstream_model,
        "messages": messages(req, keep_billing_header, render),
    }
    if not count_tokens:
        out["max_tokens"] = req["max_tokens"]
        stops = req.get("stop_sequences")
        if stops and route.upstream.kind not in LOCAL_STOP_KINDS:
            out["stop"] = [stops] if isinstance(stops, str) else list(stops)
        if req.get("stream"):
            out["stream"] = True
            options = {"include_usage": True}
            if route.upstream.kind in _CONTINUOUS_USAGE_KINDS:
                options["continuous_usage_stats"] = True
            out["stream_options"] = options
            if route.upstream.kind == "llamacpp":
                out["return_progress"] = True
    if req.get("tools"):  # else no function: nothing to send (tool_choice neither)
        _tools(req, out, named_choice)
    for key in _AS_IS:
        if key in req and req[key] is not None:
            out[key] = req[key]
    _output_config(req, out)
    _template_kwargs(req, out, route.upstream.kind)
    _prefill(req, out)
    if on_drop is not None:
        handled = _TRANSLATED_FOR_COUNT if count_tokens else _TRANSLATED
        for key in req:
            if key not in handled:
                on_drop(key)
    return out


# --- request options ----------------------------------------------------------------


def _tools(req: Mapping[str, Any], out: dict[str, Any], named_choice: bool = True) -> None:
    functions: list[dict[str, Any]] = []
    choice = req.get("tool_choice")
    for tool in offered_tools(req):
        if is_custom_tool(tool):
            schema = tool["input_schema"]
            fn: dict[str, Any] = {"name": tool["name"]}
            description = _with_examples(tool.get("description"), tool.get("input_examples"))
            if description is not None:
                fn["description"] = description
            fn["parameters"] = schema if "type" in schema else {"type": "object", **schema}
            if tool.get("strict") is True:
                fn["strict"] = True
        elif tool.get("type") in TOOL_TYPES:  # validated: the gateway runs it (gateway/tools)
            fn = web_search_function(tool)
        elif tool.get("type") in fetch_blocks.TOOL_TYPES:  # validated: the gateway runs it
            fn = fetch_blocks.function(tool)
        else:  # validated: an Anthropic-defined client tool (other server tools were refused)
            fn = to_function(tool)
        functions.append({"type": "function", "function": fn})
    if not functions:
        return  # an empty tools list is refused by some servers
    out["tools"] = functions
    if choice is None:
        return
    kind = choice["type"]
    named = [f for f in functions if f["function"]["name"] == choice.get("name")]
    if kind == "tool" and not named_choice and named:
        # the server reads tool_choice as a string only: offer just the named tool, required
        out["tools"] = named
        out["tool_choice"] = "required"
    elif kind == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        out["tool_choice"] = _TOOL_CHOICE[kind]
    if choice.get("disable_parallel_tool_use") is True and kind != "none":
        out["parallel_tool_calls"] = False


def offered_tools(req: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The request's tools the model is offered, in order: a deferred one
    (``defer_loading: true``) only once the conversation has loaded it (:func:`_loaded`)."""
    tools = req.get("tools")
    if not tools:
        return []
    for tool in tools:
        if tool.get("defer_loading") is True:
            break
    else:
        return list(tools)
    loaded = _loaded(req, req.get("tool_choice"))
    return [t for t in tools if t.get("defer_loading") is not True or t.get("name") in loaded]


def _loaded(req: Mapping[str, Any], choice: Mapping[str, Any] | None) -> set[str]:
    """The names of the tools the conversation has loaded: every ``tool_reference`` in a
    ``tool_result`` (what a tool search returns), and the tool ``tool_choice`` names. One
    walk of the user turns, made only when some tool is deferred."""
    names: set[str] = set()
    if choice is not None and choice.get("type") == "tool":
        names.add(choice["name"])
    for turn in req["messages"]:
        content = turn["content"]
        if turn["role"] != "user" or isinstance(content, str):
            continue
        for block in content:
            inner = block.get("content") if block["type"] == "tool_result" else None
            if not inner or isinstance(inner, str):
                continue
            for item in inner:
                if item["type"] == "tool_reference":
                    names.add(item.get("tool_name", item.get("name")))
    return names


def _with_examples(description: str | None, examples: list[Any] | None) -> str | None:
    """Anthropic shows a tool's ``input_examples`` to the model; a function has no such
    field, so they follow its description, one JSON object a line."""
    if not examples:
        return description
    shown = "Examples of valid input:\n" + "\n".join(jsonutil.dumps(e) for e in examples)
    return f"{description}\n\n{shown}" if description else shown


def _template_kwargs(req: Mapping[str, Any], out: dict[str, Any], kind: str) -> None:
    kwargs: dict[str, Any] = {}
    thinking = req.get("thinking")
    client = req.get("chat_template_kwargs")
    if thinking is not None or (
        kind in _TEMPLATE_KWARGS_KINDS
        and not (client and any(k in client for k in _THINKING_SWITCHES))
    ):
        # no thinking asked for: the upstream is asked not to think, as for "disabled",
        # unless the client threw the template's switch itself
        on = thinking is not None and thinking["type"] != "disabled"
        for key in _THINKING_SWITCHES:
            kwargs[key] = on
    if client:
        kwargs.update(client)  # the client's own values win
    if kwargs:
        out["chat_template_kwargs"] = kwargs
    if kind == "ollama" and not tables.shows_thinking(req):
        out["reasoning_effort"] = "none"  # Ollama's only switch: its /v1 drops unknown fields


def _output_config(req: Mapping[str, Any], out: dict[str, Any]) -> None:
    config = turn_control.output_config(req)  # the top level, this turn's entries over it
    if not config:
        return
    effort = config.get("effort")
    if effort is not None:
        out["reasoning_effort"] = _EFFORT.get(effort, effort)
    fmt = config.get("format")
    if fmt is not None:
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": fmt["schema"]},
        }


def _ends_in_search(turn: Mapping[str, Any]) -> bool:
    """An assistant turn whose last block is a search's result: the chat ends with that
    ``tool`` message, which the model answers (no prefill to continue)."""
    content = turn.get("content")
    return (
        isinstance(content, list)
        and bool(content)
        and content[-1].get("type") in ("web_search_tool_result", "web_fetch_tool_result")
    )


def _prefill(req: Mapping[str, Any], out: dict[str, Any]) -> None:
    cont = req.get("continue_final_message")
    if cont is None:
        turns = req["messages"]
        last = turns[-1] if turns else None
        if last is not None and last["role"] == "system" and turn_control.is_control_entry(last):
            last = next((t for t in reversed(turns) if not turn_control.is_control_entry(t)), None)
        cont = last is not None and last["role"] == "assistant" and not _ends_in_search(last)
        if not cont:
            return
    out["continue_final_message"] = cont
    if cont:
        out["add_generation_prompt"] = False
