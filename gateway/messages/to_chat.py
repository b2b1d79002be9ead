"""Pure translation: a validated Anthropic Messages request -> an OpenAI chat request.

Protocol facts relied on:

- OpenAI chat wants tool results as ``role: "tool"`` messages carrying ``tool_call_id``,
  right after the assistant turn that called them and before any other user content.
- Anthropic merges consecutive turns of the same role; chat templates usually reject them,
  so they are merged here too.
- A final assistant turn is a prefill. vLLM/SGLang continue it with
  ``continue_final_message: true``, which vLLM refuses together with
  ``add_generation_prompt: true`` (its default).
- Chat templates (Qwen3, DeepSeek, GLM, ...) read the reasoning switch from
  ``chat_template_kwargs`` as ``enable_thinking`` or ``thinking``; prior reasoning goes
  back as the assistant message's ``reasoning_content``. vLLM, SGLang and llama-server
  pass ``chat_template_kwargs`` to the template; so without ``thinking`` in the request
  (the API then does not think) both switches go up off unless the client set its own.
  Ollama's ``/v1`` ignores unknown fields; its switch is ``reasoning_effort`` (``high``,
  ``medium``, ``low`` or ``none``: ``none`` turns thinking off; openai/openai.go,
  ``FromChatRequest``).
- Templates expand ``tool_reference`` parts only at the start of a tool message, so each
  run of references and each run of other parts is its own tool message.
- Anthropic-defined client tools (``bash_*``, ``text_editor_*``, ``memory_*``,
  ``computer_*``) carry no schema; they go up as function tools under the client's name,
  with the schema Anthropic documents (:mod:`.client_tools`). Server tools never get here
  (validation refuses them), except web search when the gateway runs it: a function
  ``web_search(query)``; a replayed search (``server_tool_use`` + ``web_search_tool_result``)
  is the assistant's call and the ``tool`` message it got (:mod:`.web_search`).
- vLLM and SGLang accept ``stream_options.continuous_usage_stats`` (usage on every chunk,
  so the first one carries the prompt's token count); other servers may refuse it.
  llama.cpp instead takes ``return_progress: true``: its first chunks carry
  ``prompt_progress.total``, the prompt's token count.
- A system turn may set this turn's ``output_config`` fields, or carry nothing else (a
  per-turn control entry); it may be cleared by a later user message (``clear_at``). See
  :mod:`.turn_control`: the merged output_config is what is translated, and no empty
  system message goes upstream.
- An upstream that cannot take images or ``tool_reference`` parts
  (:mod:`gateway.local.capabilities`) gets them as text (``as_text``): an image becomes a
  placeholder naming what was removed, a reference the tool's name. One that ignores a named
  ``tool_choice`` object (``named_choice=False``: llama.cpp, Ollama) is offered only that
  tool, with ``tool_choice: "required"``.
- Claude Code's first system block, ``x-anthropic-billing-header: cc_version=...;``,
  changes on every request and would defeat the upstream's prefix cache at the head of
  the prompt, so it is dropped unless the config keeps it.

Only an allow-list reaches the upstream: the translated fields plus ``temperature``,
``top_p``, ``top_k``, ``chat_template_kwargs`` and ``continue_final_message``. Every other
top-level field is reported through ``on_drop`` and never sent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from gateway.messages import tables, turn_control
from gateway.messages.client_tools import to_function
from gateway.messages.tables import LOCAL_STOP_KINDS
from gateway.messages.validate import is_custom_tool
from gateway.messages.web_search import OPENED, TOOL_TYPES, replayed_text
from gateway.messages.web_search import function as web_search_function
from gateway.text import jsonutil

if TYPE_CHECKING:
    from gateway.ops.config import ModelRoute

__all__ = ["BILLING_HEADER_PREFIX", "to_chat"]

BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"

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

Message = dict[str, Any]
Part = dict[str, Any]


class _Render(NamedTuple):
    """What goes upstream as text rather than as its own part."""

    images_as_text: bool = False
    references_as_text: bool = False


_PLAIN = _Render()


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
    render = _Render("images" in as_text, "tool_references" in as_text)
    out: dict[str, Any] = {
        "model": route.upstream_model,
        "messages": _messages(req, keep_billing_header, render),
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
    _tools(req, out, named_choice)
    for key in _AS_IS:
        if req.get(key) is not None:
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


# --- messages -----------------------------------------------------------------------


def _messages(req: Mapping[str, Any], keep_billing_header: bool, render: _Render = _PLAIN
              ) -> list[Message]:
    # Group consecutive turns of one role; a system turn left blank (or holding only the
    # billing header) is skipped first, so the turns around it still merge.
    groups: list[tuple[str, list[Any]]] = []
    top = _system_text(req.get("system"), keep_billing_header)
    if top is not None:
        groups.append(("system", [top]))
    hidden = turn_control.hidden_turns(req["messages"])
    for i, turn in enumerate(req["messages"]):
        role = turn["role"]
        item: Any = turn
        if role == "system":
            if i in hidden:  # clear_at "next_user_message", and a user message followed
                continue
            item = _system_text(turn.get("content"), keep_billing_header)
            if item is None:
                continue
        if groups and groups[-1][0] == role:
            groups[-1][1].append(item)
        else:
            groups.append((role, [item]))
    out: list[Message] = []
    for role, group in groups:
        if role == "system":
            out.append({"role": "system", "content": "\n".join(group)})
        elif role == "user":
            out.extend(_user(group, render))
        else:
            out.extend(_assistant_turns(group))
    return out


def _system_text(content: Any, keep_billing_header: bool) -> str | None:
    """The text of a system prompt or turn; None when there is nothing to send."""
    if content is None:
        return None
    if isinstance(content, str):
        text = content
    else:
        text = "\n".join(
            b["text"]
            for b in content
            if keep_billing_header or not b["text"].startswith(BILLING_HEADER_PREFIX)
        )
    return text if text.strip() else None


def _collapse(parts: list[Part]) -> str | list[Part]:
    """Plain text when every part is text (templates handle strings best), else parts."""
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _text_part(text: str) -> Part:
    return {"type": "text", "text": text}


def _image_part(source: Mapping[str, Any], render: _Render = _PLAIN) -> Part:
    if render.images_as_text:
        return _text_part(_image_placeholder(source))
    if source["type"] == "url":
        url = source["url"]
    else:
        url = f"data:{source['media_type']};base64,{source['data']}"
    return {"type": "image_url", "image_url": {"url": url}}


_NOT_SHOWN = "not shown: this model does not take images"


def _image_placeholder(source: Mapping[str, Any]) -> str:
    """What the model reads instead of an image it cannot take: that one was there."""
    if source["type"] != "base64":
        return f"[image: from a URL, {_NOT_SHOWN}]"
    size = len(source["data"]) * 3 // 4
    shown = f"{size // 1024} KB" if size >= 1024 else f"{size} bytes"
    return f"[image: {source['media_type']}, {shown}, {_NOT_SHOWN}]"


def _document_parts(block: Mapping[str, Any], render: _Render) -> list[Part]:
    header = "\n\n".join(
        block[key] for key in ("title", "context") if isinstance(block.get(key), str) and block[key]
    )
    source = block["source"]
    body = source["data"] if source["type"] == "text" else source["content"]
    if isinstance(body, str):
        return [_text_part(f"{header}\n\n{body}" if header else body)]
    parts = [_text_part(header)] if header else []
    for item in body:
        if item["type"] == "text":
            parts.append(_text_part(item["text"]))
        else:
            parts.append(_image_part(item["source"], render))
    return parts


def _search_result_text(block: Mapping[str, Any]) -> str:
    body = "\n".join(item["text"] for item in block["content"])
    return f"{block['title']}\n{block['source']}\n\n{body}"


def _parts(block: Mapping[str, Any], render: _Render) -> list[Part]:
    """Content parts for a user (or tool_result) block other than tool_result itself."""
    kind = block["type"]
    if kind == "text":
        return [_text_part(block["text"])]
    if kind == "image":
        return [_image_part(block["source"], render)]
    if kind == "document":
        return _document_parts(block, render)
    return [_text_part(_search_result_text(block))]  # search_result


def _tool_messages(block: Mapping[str, Any], render: _Render) -> list[Message]:
    call_id = block["tool_use_id"] if block.get("tool_use_id") is not None else block["id"]
    content = block.get("content")
    if not content:
        return [{"role": "tool", "tool_call_id": call_id, "content": ""}]
    if isinstance(content, str):
        return [{"role": "tool", "tool_call_id": call_id, "content": content}]
    # is_error is deliberately not rendered: the content goes upstream unchanged.
    messages: list[Message] = []
    run: list[Part] = []
    run_is_ref = False
    for item in content:
        is_ref = item["type"] == "tool_reference"
        if is_ref and render.references_as_text:
            # the tool's name, as text among the other parts (one message: no run to split)
            run.append(_text_part(item.get("tool_name", item.get("name"))))
            continue
        if run and is_ref != run_is_ref:
            messages.append(_tool_message(call_id, run, run_is_ref))
            run = []
        run_is_ref = is_ref
        if is_ref:
            run.append({"type": "tool_reference", "name": item.get("tool_name", item.get("name"))})
        else:
            run.extend(_parts(item, render))
    messages.append(_tool_message(call_id, run, run_is_ref))
    return messages


def _tool_message(call_id: str, parts: list[Part], is_ref: bool) -> Message:
    content = parts if is_ref else _collapse(parts)
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _user(group: list[Mapping[str, Any]], render: _Render) -> list[Message]:
    out: list[Message] = []
    parts: list[Part] = []
    for turn in group:
        content = turn["content"]
        if isinstance(content, str):
            parts.append(_text_part(content))
            continue
        for block in content:
            if block["type"] == "tool_result":
                out.extend(_tool_messages(block, render))
            else:
                parts.extend(_parts(block, render))
    if parts:
        out.append({"role": "user", "content": _collapse(parts)})
    return out


_SEARCH_BLOCKS = frozenset({"server_tool_use", "web_search_tool_result"})


def _assistant_turns(group: list[Mapping[str, Any]]) -> list[Message]:
    """An assistant turn (or a run of them) as chat messages: one assistant message, or,
    where web searches ran inside it, an assistant message with the search call and the
    search's ``tool`` message per search, the turn going on after it."""
    if not any(isinstance(turn["content"], list)
               and any(b["type"] in _SEARCH_BLOCKS for b in turn["content"])
               for turn in group):
        return [_assistant(group)]
    out: list[Message] = []
    segment: list[Any] = []
    answered = {b["tool_use_id"] for turn in group if isinstance(turn["content"], list)
                for b in turn["content"] if b["type"] == "web_search_tool_result"}
    for turn in group:
        if isinstance(turn["content"], str):
            segment.append({"type": "text", "text": turn["content"]})
            continue
        for block in turn["content"]:
            if block["type"] == "server_tool_use" and block["id"] not in answered:
                continue  # a search without its result: nothing the model can be shown
            if block["type"] != "web_search_tool_result":
                segment.append(block)
                continue
            if segment:
                out.append(_assistant([{"content": segment}]))
                segment = []
            text = block.get(OPENED)
            if text is None:  # not opened by the caller: title and URL only
                text = replayed_text(block, ())
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
    if segment:
        out.append(_assistant([{"content": segment}]))
    return out


def _join_texts(texts: list[str], cited: list[bool]) -> str:
    """The assistant's text blocks as one content string.

    Blocks are joined with a newline, except next to a block carrying citations: the API (and
    the gateway's web search, gateway/tools/citations.py) splits one run of the model's text
    into blocks around each cited passage, so those pieces go back exactly as the model wrote
    them, with nothing inserted.
    """
    out = [texts[0]]
    for i in range(1, len(texts)):
        out.append("" if cited[i] or cited[i - 1] else "\n")
        out.append(texts[i])
    return "".join(out)


def _assistant(group: list[Mapping[str, Any]]) -> Message:
    texts: list[str] = []
    cited: list[bool] = []  # per text: it carries citations
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for turn in group:
        content = turn["content"]
        if isinstance(content, str):
            texts.append(content)
            cited.append(False)
            continue
        for block in content:
            kind = block["type"]
            if kind == "text":
                texts.append(block["text"])
                cited.append(bool(block.get("citations")))
            elif kind == "thinking":
                if block["thinking"]:
                    reasoning.append(block["thinking"])
            else:  # tool_use, or a web search's server_tool_use
                arguments = jsonutil.dumps(block["input"])
                calls.append(
                    {
                        "id": block["id"],
                        "type": "function",
                        "function": {"name": block["name"], "arguments": arguments},
                    }
                )
    message: Message = {
        "role": "assistant",
        "content": _join_texts(texts, cited) if texts else (None if calls else ""),
    }
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


# --- request options ----------------------------------------------------------------


def _tools(req: Mapping[str, Any], out: dict[str, Any], named_choice: bool = True) -> None:
    functions: list[dict[str, Any]] = []
    for tool in req.get("tools") or ():
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
        else:  # validated: an Anthropic-defined client tool (other server tools were refused)
            fn = to_function(tool)
        if tool.get("defer_loading") is not None:
            fn["defer_loading"] = tool["defer_loading"]
        functions.append({"type": "function", "function": fn})
    if not functions:
        return  # an empty tools list is refused by some servers
    out["tools"] = functions
    choice = req.get("tool_choice")
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
            and not (client and any(k in client for k in _THINKING_SWITCHES))):
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
    return (isinstance(content, list) and bool(content)
            and content[-1].get("type") == "web_search_tool_result")


def _prefill(req: Mapping[str, Any], out: dict[str, Any]) -> None:
    cont = req.get("continue_final_message")
    if cont is None:
        last = next((t for t in reversed(req["messages"])
                     if not turn_control.is_control_entry(t)), None)
        cont = last is not None and last["role"] == "assistant" and not _ends_in_search(last)
        if not cont:
            return
    out["continue_final_message"] = cont
    if cont:
        out["add_generation_prompt"] = False
