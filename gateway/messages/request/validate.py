"""Strict validation of an Anthropic Messages (or count_tokens) request body.

Protocol facts relied on (the Messages API reference, https://docs.anthropic.com/en/api/messages,
and the Python SDK 2.14's request types, ``anthropic/types/message_create_params.py``):

- ``model`` is a string; ``max_tokens`` a positive integer (JSON ``true`` is not an
  integer). Turns and content blocks are checked in :mod:`.validate_content`.
- Integers are bounded where the API bounds them: ``max_tokens`` (>= 1),
  ``thinking.budget_tokens`` (>= 1024), ``top_k`` (>= 0) and the client tools' sizes take
  at most 2**31-1 (``MAX_INT``). The API's maxima depend on the model, which the gateway
  does not know; that bound is the largest every upstream reads as an integer, so a
  400-digit ``max_tokens`` is refused here instead of being forwarded as is.
- Custom tool names match ``^[a-zA-Z0-9_-]{1,128}$``; tool names are unique.
  Anthropic-defined tools carry a versioned ``type`` (:mod:`.client_tools`): a client tool
  (``bash_20250124``, ``text_editor_20250728``, ...) must use the name its type requires;
  a server tool (``web_search_20250305``, ``mcp_toolset``, ...) or an unknown type is
  refused naming ``tools.N.type``, never dropped.
- ``tool_choice`` is ``auto`` / ``any`` / ``none`` / ``{type:"tool", name}``; a named tool
  must be one of the tools, custom or Anthropic-defined client tool.
- ``thinking``: ``enabled`` needs ``budget_tokens`` >= 1024 and below ``max_tokens``;
  ``disabled`` takes neither ``budget_tokens`` nor ``display``; ``adaptive`` (and the
  newer ``between_tools``) takes no ``budget_tokens``; this gateway only renders
  ``display: "summarized"``. ``output_config.effort`` is one of minimal / low / medium /
  high / xhigh / max; ``output_config.format`` is ``{type:"json_schema", schema}``.
- A count_tokens body carries no ``max_tokens``, ``stream``, ``stop_sequences`` or
  ``metadata``; they are tolerated there, unchecked, and never translated.

Optional fields given as JSON ``null`` count as absent. What only Anthropic's servers can
do is refused by name, never dropped: ``thread`` (400 with ``error.details.error_code``
``thread_unsupported_request``, from which both SDKs' tool runners fall back to sending
the full history), a non-empty ``mcp_servers`` and ``container``. Other unknown top-level
fields are accepted (the translation drops and counts them): they tune how Anthropic
serves a request (``service_tier``, ``metadata``, ``context_management``) and change
nothing a local model sees.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gateway.errors import echo
from gateway.messages.fetch_blocks import TOOL_TYPES as WEB_FETCH_TYPES
from gateway.messages.fetch_blocks import check_tool as check_web_fetch_tool
from gateway.messages.fetch_blocks import check_url_sources
from gateway.messages.request.content import (
    EFFORTS,
    MAX_INT,
    check_depth,
    check_int,
    check_list,
    check_messages,
    check_obj,
    check_str,
    check_system,
    fail,
    is_int,
    is_number,
)
from gateway.messages.search_blocks import TOOL_TYPES as WEB_SEARCH_TYPES
from gateway.messages.search_blocks import check_tool as check_web_search_tool
from gateway.messages.to_chat.client_tools import check_client_tool

__all__ = ["is_custom_tool", "validate_messages"]

_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")
_EFFORTS = EFFORTS
_THINKING_TYPES = ("enabled", "disabled", "adaptive", "between_tools")
_TOOL_CHOICE_TYPES = ("auto", "any", "none", "tool")


def is_custom_tool(tool: Mapping[str, Any]) -> bool:
    """A tool with its own ``input_schema``, as opposed to an Anthropic-defined one."""
    kind = tool.get("type")
    return kind is None or kind == "custom"


def _tools(tools: Any, web_search: bool = False, web_fetch: bool = False) -> set[str]:
    names: set[str] = set()
    if tools is None:
        return names
    fetch: tuple[Mapping[str, Any], str] | None = None
    for i, tool in enumerate(check_list(tools, "tools")):
        path = f"tools.{i}"
        check_obj(tool, path)
        custom = is_custom_tool(tool)
        if custom:
            name = _custom_tool_name(tool, path)
        elif web_search and tool.get("type") in WEB_SEARCH_TYPES:
            name = check_web_search_tool(tool, path)
        elif web_fetch and tool.get("type") in WEB_FETCH_TYPES:
            name = check_web_fetch_tool(tool, path)
            fetch = (tool, path)
        else:
            name = check_client_tool(tool, path)
        if name in names:
            raise fail(f"{path}.name", f"Tool names must be unique: '{name}'")
        names.add(name)
        if custom:
            check_str(tool, "description", path, required=False)
            if "input_schema" not in tool:
                raise fail(f"{path}.input_schema", "Field required")
            check_obj(tool["input_schema"], f"{path}.input_schema")
            check_depth(tool["input_schema"], f"{path}.input_schema")
            _custom_tool_options(tool, path)
        if tool.get("defer_loading") is not None and not isinstance(tool["defer_loading"], bool):
            raise fail(f"{path}.defer_loading", "Input should be a valid boolean")
        _allowed_callers(tool.get("allowed_callers"), path)
    if fetch is not None:
        check_url_sources(fetch[0], fetch[1], names)
    return names


def _custom_tool_options(tool: Mapping[str, Any], path: str) -> None:
    """``strict`` goes upstream as the function's ``strict``; ``input_examples`` (objects the
    model is shown) go into the function's description. Both are checked here."""
    strict = tool.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise fail(f"{path}.strict", "Input should be a valid boolean")
    examples = tool.get("input_examples")
    if examples is None:
        return
    for j, example in enumerate(check_list(examples, f"{path}.input_examples")):
        check_obj(example, f"{path}.input_examples.{j}")
        check_depth(example, f"{path}.input_examples.{j}")


def _allowed_callers(callers: Any, path: str) -> None:
    """Programmatic tool calling: a tool only Anthropic's code execution may call cannot run
    here (code execution is a server tool), so the model must be able to call it directly."""
    if callers is None:
        return
    for j, caller in enumerate(check_list(callers, f"{path}.allowed_callers")):
        if not isinstance(caller, str):
            raise fail(f"{path}.allowed_callers.{j}", "Input should be a valid string")
    if "direct" not in callers:
        raise fail(
            f"{path}.allowed_callers",
            "this gateway's models call tools directly; a "
            "tool only Anthropic's code execution may call cannot be used here",
        )


def _custom_tool_name(tool: Mapping[str, Any], path: str) -> str:
    name = tool.get("name")
    if name is None:
        raise fail(f"{path}.name", "Field required")
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise fail(f"{path}.name", "String should match pattern '^[a-zA-Z0-9_-]{1,128}$'")
    return name


def _tool_choice(choice: Any, tool_names: set[str]) -> None:
    if choice is None:
        return
    check_obj(choice, "tool_choice")
    kind = choice.get("type")
    if kind not in _TOOL_CHOICE_TYPES:
        raise fail("tool_choice.type", "Input should be 'auto', 'any', 'none' or 'tool'")
    dptu = choice.get("disable_parallel_tool_use")
    if dptu is not None and not isinstance(dptu, bool):
        raise fail("tool_choice.disable_parallel_tool_use", "Input should be a valid boolean")
    if kind == "tool":
        check_str(choice, "name", "tool_choice")
        if choice["name"] not in tool_names:
            raise fail("tool_choice.name", f"Tool '{echo(choice['name'])}' not found in tools")


def _thinking_config(thinking: Any, max_tokens: Any) -> None:
    if thinking is None:
        return
    check_obj(thinking, "thinking")
    kind = thinking.get("type")
    if kind not in _THINKING_TYPES:
        raise fail("thinking.type", "Input should be 'enabled', 'disabled' or 'adaptive'")
    budget = thinking.get("budget_tokens")
    display = thinking.get("display")
    if kind == "enabled":
        if budget is None:
            raise fail("thinking.budget_tokens", "Field required")
        check_int(budget, "thinking.budget_tokens", minimum=1024)
        if is_int(max_tokens) and budget >= max_tokens:
            raise fail(
                "thinking.budget_tokens",
                "`max_tokens` must be greater than `thinking.budget_tokens`",
            )
    elif budget is not None:
        raise fail("thinking.budget_tokens", f"not allowed when thinking.type is '{kind}'")
    if display is not None:
        if kind == "disabled":
            raise fail("thinking.display", "not allowed when thinking.type is 'disabled'")
        # The issue allowed only "summarized"; the real API and its SDKs also take
        # "omitted" (Claude Code sends it) and "updates", and today's API wins.
        if not isinstance(display, str) or display not in _DISPLAYS:
            raise fail("thinking.display", "Input should be 'summarized', 'omitted' or 'updates'")


_DISPLAYS = frozenset({"summarized", "omitted", "updates"})


def _output_config(config: Any) -> None:
    if config is None:
        return
    check_obj(config, "output_config")
    effort = config.get("effort")
    if effort is not None and effort not in _EFFORTS:
        raise fail("output_config.effort", "Input should be " + ", ".join(map(repr, _EFFORTS)))
    fmt = config.get("format")
    if fmt is None:
        return
    check_obj(fmt, "output_config.format")
    if fmt.get("type") != "json_schema":
        raise fail("output_config.format.type", "Input should be 'json_schema'")
    check_obj(fmt.get("schema"), "output_config.format.schema")
    check_depth(fmt["schema"], "output_config.format.schema")


def _sampling(body: Mapping[str, Any]) -> None:
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if value is None:
            continue
        if not is_number(value):
            raise fail(key, "Input should be a valid number")
        if value < 0 or (key == "top_p" and value > 1):
            raise fail(
                key,
                "Input should be between 0 and 1"
                if key == "top_p"
                else "Input should be greater than or equal to 0",
            )
    top_k = body.get("top_k")
    if top_k is not None:
        check_int(top_k, "top_k", minimum=0)


def _generation_fields(body: Mapping[str, Any]) -> None:
    """The fields a count_tokens request does not carry."""
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise fail("max_tokens", "Field required")
    if type(max_tokens) is not int or not 1 <= max_tokens <= MAX_INT:  # else it is fine
        check_int(max_tokens, "max_tokens", minimum=1)
    stream = body.get("stream")
    if stream is not None and stream is not True and stream is not False:
        raise fail("stream", "Input should be a valid boolean")
    if "stop_sequences" in body:
        stops = body["stop_sequences"]
        if stops is not None and not isinstance(stops, str):
            for i, stop in enumerate(check_list(stops, "stop_sequences")):
                if not isinstance(stop, str):
                    raise fail(f"stop_sequences.{i}", "Input should be a valid string")
    if "metadata" in body:
        metadata = body["metadata"]
        if metadata is not None:
            check_str(check_obj(metadata, "metadata"), "user_id", "metadata", required=False)


# The SDKs' thread fallback: on a 400 whose error.details.error_code is this, Python's
# tool_runner and TypeScript's toolRunner resend the turn with the full history and no
# `thread` (anthropic/lib/threads/_thread_state.py, recovers_from).
THREAD_UNSUPPORTED = {"error_code": "thread_unsupported_request"}


def _server_side_features(body: Mapping[str, Any]) -> None:
    """Refuse what only Anthropic's servers can do; dropping it would change the answer."""
    if body.get("mcp_servers"):
        raise fail(
            "mcp_servers",
            "this gateway's models cannot reach MCP servers; "
            "define their tools as client tools instead",
        )
    if body.get("container") is not None:
        raise fail("container", "code execution containers are not available on this gateway")


def validate_messages(
    body: object,
    *,
    count_tokens: bool = False,
    web_search: bool = False,
    web_fetch: bool = False,
) -> dict[str, Any]:
    """Return ``body`` if it is a valid Messages request, else raise InvalidRequest.

    ``web_search``: the gateway runs the web search tool (``[web_search]`` is configured);
    without it, a web search tool is refused like every other server tool. ``web_fetch``:
    the same for the web fetch tool (``[web_fetch] enabled``).

    The model is only checked to be a string; routing answers 404 for unknown names.
    With ``count_tokens`` the generation-only fields are neither required nor checked.
    """
    if not isinstance(body, dict):
        raise fail("", "request body must be a JSON object")
    if "thread" in body and body["thread"] is not None:
        # first: a thread's `continue` turn carries only the new messages, and whatever else
        # might be wrong with it, the SDK's fallback must see this error to resend in full
        raise fail(
            "thread",
            "message threads are not supported by this gateway; send the "
            "full conversation without `thread`",
            details=THREAD_UNSUPPORTED,
        )
    if body.get("model") is None:
        raise fail("model", "Field required")
    if not isinstance(body["model"], str):
        raise fail("model", "Input should be a valid string")
    if "messages" not in body:
        raise fail("messages", "Field required")
    if not count_tokens:
        _generation_fields(body)
    check_messages(body["messages"])
    system = body.get("system")
    if system is not None and type(system) is not str:  # else nothing to check
        check_system(system)
    # The optional fields, each checked only when the body has it (a null is as absent),
    # in this order (the first failing check names the error).
    if "tool_choice" in body or "tools" in body:
        _tool_choice(body.get("tool_choice"), _tools(body.get("tools"), web_search, web_fetch))
    if "thinking" in body:
        _thinking_config(body["thinking"], None if count_tokens else body.get("max_tokens"))
    if "output_config" in body:
        _output_config(body["output_config"])
    if "temperature" in body or "top_p" in body or "top_k" in body:
        _sampling(body)
    if "mcp_servers" in body or "container" in body:
        _server_side_features(body)
    if "chat_template_kwargs" in body:
        kwargs = body["chat_template_kwargs"]
        if kwargs is not None:
            check_obj(kwargs, "chat_template_kwargs")
            check_depth(kwargs, "chat_template_kwargs")  # forwarded as it is
    if "continue_final_message" in body:
        cfm = body["continue_final_message"]
        if cfm is not None and not isinstance(cfm, bool):
            raise fail("continue_final_message", "Input should be a valid boolean")
    return body
