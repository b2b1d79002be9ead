"""The validation table: request fragment -> HTTP status, error type, field path.

Every refusal is a 400 ``invalid_request_error`` whose message starts with the JSON path
of the offending field, as the real API words it (``messages.2.content.0.source.data:``).
A fragment is merged over a small valid request; ``DEL`` removes a field.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InvalidRequest, anthropic_body
from gateway.messages.request.validate import validate_messages
from gateway.text import jsonutil

DEL = object()
BASE: dict[str, Any] = {
    "model": "m",
    "max_tokens": 1024,
    "messages": [{"role": "user", "content": "hi"}],
}
TOOL = {"name": "get_weather", "input_schema": {"type": "object"}}
PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}


def _body(fragment: dict[str, Any]) -> dict[str, Any]:
    body = dict(BASE)
    for key, value in fragment.items():
        if value is DEL:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def _user(*blocks: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": list(blocks)}]}


def _assistant(*blocks: Any) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": list(blocks)},
        ]
    }


def _turn(turn: dict[str, Any]) -> dict[str, Any]:
    """``turn`` after a user turn (it is ``messages.1``)."""
    return {"messages": [{"role": "user", "content": "q"}, turn]}


def _tool_result(**fields: Any) -> dict[str, Any]:
    call = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
    return {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [{"type": "tool_result", **fields}]},
        ]
    }


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def _doc(source: dict[str, Any]) -> dict[str, Any]:
    return _user({"type": "document", "source": source})


M0 = "messages.0.content.0"
A0 = "messages.1.content.0"
TR = "messages.2.content.0"

# (id, fragment, expected path, a word the message must contain or None)
REFUSED: list[tuple[str, dict[str, Any], str, str | None]] = [
    # what only Anthropic's servers can do is refused by name, never dropped
    (
        "tool-only-code-execution-may-call",
        {"tools": [{**TOOL, "allowed_callers": ["code_execution_20250825"]}]},
        "tools.0.allowed_callers",
        "code execution",
    ),
    (
        "tool-allowed-callers-not-a-list",
        {"tools": [{**TOOL, "allowed_callers": "direct"}]},
        "tools.0.allowed_callers",
        "list",
    ),
    ("tool-strict-not-bool", {"tools": [{**TOOL, "strict": "yes"}]}, "tools.0.strict", "boolean"),
    (
        "tool-input-example-not-object",
        {"tools": [{**TOOL, "input_examples": ["Paris"]}]},
        "tools.0.input_examples.0",
        "dictionary",
    ),
    ("thread-create", {"thread": {"type": "create"}}, "thread", "not supported"),
    (
        "thread-continue-without-history",
        {
            "thread": {"type": "continue", "previous_message_id": "msg_1"},
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "4"}],
                }
            ],
            "max_tokens": DEL,
        },
        "thread",
        "full conversation",
    ),
    (
        "mcp-servers",
        {"mcp_servers": [{"type": "url", "url": "https://mcp.example/sse", "name": "x"}]},
        "mcp_servers",
        "MCP",
    ),
    ("container-id", {"container": "c1"}, "container", "container"),
    ("container-object", {"container": {"skills": []}}, "container", "container"),
    ("model-missing", {"model": DEL}, "model", "required"),
    ("model-not-string", {"model": 7}, "model", "string"),
    ("model-null", {"model": None}, "model", "required"),
    ("max-tokens-missing", {"max_tokens": DEL}, "max_tokens", "required"),
    ("max-tokens-zero", {"max_tokens": 0}, "max_tokens", "greater"),
    ("max-tokens-negative", {"max_tokens": -5}, "max_tokens", None),
    ("max-tokens-bool", {"max_tokens": True}, "max_tokens", "integer"),
    ("max-tokens-float", {"max_tokens": 1.5}, "max_tokens", "integer"),
    ("max-tokens-string", {"max_tokens": "100"}, "max_tokens", "integer"),
    ("messages-missing", {"messages": DEL}, "messages", "required"),
    ("messages-empty", {"messages": []}, "messages", "at least 1"),
    ("messages-object", {"messages": {"role": "user"}}, "messages", "list"),
    ("message-not-object", {"messages": ["hi"]}, "messages.0", "dictionary"),
    ("role-missing", {"messages": [{"content": "hi"}]}, "messages.0.role", "required"),
    ("role-tool", {"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role", None),
    ("content-missing", {"messages": [{"role": "user"}]}, "messages.0.content", "required"),
    (
        "content-empty-list",
        {"messages": [{"role": "user", "content": []}]},
        "messages.0.content",
        "at least 1",
    ),
    (
        "content-number",
        {"messages": [{"role": "user", "content": 5}]},
        "messages.0.content",
        "list",
    ),
    ("block-not-object", _user("hi"), M0, "dictionary"),
    ("block-type-missing", _user({"text": "hi"}), f"{M0}.type", "required"),
    ("text-not-string", _user({"type": "text", "text": 3}), f"{M0}.text", "string"),
    ("text-missing", _user({"type": "text"}), f"{M0}.text", "required"),
    ("user-thinking-block", _user({"type": "thinking", "thinking": "x"}), f"{M0}.type", "user"),
    (
        "user-tool-use-block",
        _user({"type": "tool_use", "id": "t", "name": "f", "input": {}}),
        f"{M0}.type",
        None,
    ),
    ("user-unknown-block", _user({"type": "audio"}), f"{M0}.type", None),
    (
        "system-turn-image",
        {
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "system", "content": [{"type": "image", "source": PNG}]},
            ]
        },
        "messages.1.content.0.type",
        "text",
    ),
    (
        "system-turn-empty-list",
        {"messages": [{"role": "system", "content": []}]},
        "messages.0.content",
        None,
    ),
    ("top-system-image", {"system": [{"type": "image", "source": PNG}]}, "system.0.type", "text"),
    ("top-system-number", {"system": 5}, "system", "list"),
    ("top-system-block-no-text", {"system": [{"type": "text"}]}, "system.0.text", "required"),
    ("assistant-image", _assistant({"type": "image", "source": PNG}), f"{A0}.type", "user"),
    (
        "assistant-tool-result",
        _assistant({"type": "tool_result", "tool_use_id": "t"}),
        f"{A0}.type",
        "user",
    ),
    (
        "assistant-search-result",
        _assistant({"type": "search_result", "source": "s", "title": "t", "content": []}),
        f"{A0}.type",
        "user",
    ),
    (
        "assistant-redacted-thinking",
        _assistant({"type": "redacted_thinking", "data": "xx"}),
        f"{A0}.type",
        "redacted_thinking",
    ),
    (
        "assistant-server-tool-use",  # only web search and web fetch blocks replay
        _assistant({"type": "server_tool_use", "id": "s", "name": "code_execution", "input": {}}),
        f"{A0}.name",
        "web_search",
    ),
    (
        "thinking-text-missing",
        _assistant({"type": "thinking", "signature": "s"}),
        f"{A0}.thinking",
        "required",
    ),
    (
        "thinking-signature-number",
        _assistant({"type": "thinking", "thinking": "t", "signature": 1}),
        f"{A0}.signature",
        "string",
    ),
    (
        "tool-use-id-missing",
        _assistant({"type": "tool_use", "name": "f", "input": {}}),
        f"{A0}.id",
        "required",
    ),
    (
        "tool-use-name-empty",
        _assistant({"type": "tool_use", "id": "t", "name": "", "input": {}}),
        f"{A0}.name",
        None,
    ),
    (
        "tool-use-input-list",
        _assistant({"type": "tool_use", "id": "t", "name": "f", "input": []}),
        f"{A0}.input",
        "dictionary",
    ),
    (
        "tool-use-input-missing",
        _assistant({"type": "tool_use", "id": "t", "name": "f"}),
        f"{A0}.input",
        "required",
    ),
    (
        "tool-use-input-too-deep",
        _assistant({"type": "tool_use", "id": "t", "name": "f", "input": _deep(100)}),
        f"{A0}.input",
        "nesting",
    ),
    ("tool-result-no-id", _tool_result(content="x"), f"{TR}.tool_use_id", "required"),
    ("tool-result-id-number", _tool_result(tool_use_id=5), f"{TR}.tool_use_id", None),
    (
        "tool-result-is-error-string",
        _tool_result(tool_use_id="toolu_1", is_error="yes"),
        f"{TR}.is_error",
        "boolean",
    ),
    (
        "tool-result-content-number",
        _tool_result(tool_use_id="toolu_1", content=3),
        f"{TR}.content",
        "list",
    ),
    (
        "tool-result-holds-tool-use",
        _tool_result(
            tool_use_id="toolu_1",
            content=[{"type": "tool_use", "id": "x", "name": "f", "input": {}}],
        ),
        f"{TR}.content.0.type",
        "tool_result",
    ),
    (
        "tool-result-holds-thinking",
        _tool_result(tool_use_id="toolu_1", content=[{"type": "thinking", "thinking": "x"}]),
        f"{TR}.content.0.type",
        None,
    ),
    (
        "tool-reference-no-name",
        _tool_result(tool_use_id="toolu_1", content=[{"type": "tool_reference"}]),
        f"{TR}.content.0.tool_name",
        "required",
    ),
    (
        "tool-result-image-no-data",
        _tool_result(
            tool_use_id="toolu_1",
            content=[{"type": "image", "source": {"type": "base64", "media_type": "image/png"}}],
        ),
        f"{TR}.content.0.source.data",
        "data",
    ),
    (
        "image-no-data",
        _user({"type": "image", "source": {"type": "base64", "media_type": "image/png"}}),
        f"{M0}.source.data",
        "data",
    ),
    (
        "image-empty-data",
        _user({"type": "image", "source": {**PNG, "data": ""}}),
        f"{M0}.source.data",
        None,
    ),
    (
        "image-bmp",
        _user({"type": "image", "source": {**PNG, "media_type": "image/bmp"}}),
        f"{M0}.source.media_type",
        "image/png",
    ),
    (
        "image-file-source",
        _user({"type": "image", "source": {"type": "file", "file_id": "f"}}),
        f"{M0}.source.type",
        "file",
    ),
    (
        "image-source-untyped",
        _user({"type": "image", "source": {"data": "xx"}}),
        f"{M0}.source.type",
        "required",
    ),
    ("image-source-missing", _user({"type": "image"}), f"{M0}.source", "dictionary"),
    (
        "image-url-missing",
        _user({"type": "image", "source": {"type": "url"}}),
        f"{M0}.source.url",
        None,
    ),
    (
        "document-base64-not-pdf",
        _doc({"type": "base64", "media_type": "text/html", "data": "PGI+"}),
        f"{M0}.source.media_type",
        "application/pdf",
    ),
    (
        "document-pdf-no-data",
        _doc({"type": "base64", "media_type": "application/pdf", "data": ""}),
        f"{M0}.source.data",
        "base64",
    ),
    (
        "document-pdf-data-not-string",
        _doc({"type": "base64", "media_type": "application/pdf", "data": 7}),
        f"{M0}.source.data",
        "base64",
    ),
    # the gateway never fetches a URL on a client's behalf
    (
        "document-pdf-url",
        _doc({"type": "url", "url": "https://e.x/a.pdf"}),
        f"{M0}.source.type",
        "never fetches",
    ),
    (
        "document-file",
        _doc({"type": "file", "file_id": "file_1"}),
        f"{M0}.source.type",
        "Files API",
    ),
    (
        "document-text-no-data",
        _doc({"type": "text", "media_type": "text/plain"}),
        f"{M0}.source.data",
        "required",
    ),
    (
        "document-content-tool-use",
        _doc(
            {
                "type": "content",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
            }
        ),
        f"{M0}.source.content.0.type",
        None,
    ),
    (
        "search-result-no-title",
        _user({"type": "search_result", "source": "s", "content": []}),
        f"{M0}.title",
        "required",
    ),
    (
        "search-result-image-content",
        _user(
            {
                "type": "search_result",
                "source": "s",
                "title": "t",
                "content": [{"type": "image", "source": PNG}],
            }
        ),
        f"{M0}.content.0.type",
        "text",
    ),
    (
        "thinking-enabled-no-budget",
        {"thinking": {"type": "enabled"}},
        "thinking.budget_tokens",
        "required",
    ),
    (
        "thinking-budget-1023",
        {"thinking": {"type": "enabled", "budget_tokens": 1023}},
        "thinking.budget_tokens",
        "1024",
    ),
    (
        "thinking-budget-not-below-max",
        {"max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": 2048}},
        "thinking.budget_tokens",
        "max_tokens",
    ),
    (
        "thinking-disabled-budget",
        {"thinking": {"type": "disabled", "budget_tokens": 2000}},
        "thinking.budget_tokens",
        "disabled",
    ),
    (
        "thinking-disabled-display",
        {"thinking": {"type": "disabled", "display": "summarized"}},
        "thinking.display",
        "disabled",
    ),
    (
        "thinking-adaptive-budget",
        {"thinking": {"type": "adaptive", "budget_tokens": 2000}},
        "thinking.budget_tokens",
        "adaptive",
    ),
    (
        "thinking-display-unknown",
        {"thinking": {"type": "adaptive", "display": "full"}},
        "thinking.display",
        "omitted",
    ),
    ("thinking-type-unknown", {"thinking": {"type": "on"}}, "thinking.type", None),
    ("thinking-not-object", {"thinking": True}, "thinking", "dictionary"),
    ("effort-unknown", {"output_config": {"effort": "extreme"}}, "output_config.effort", "xhigh"),
    ("output-config-list", {"output_config": []}, "output_config", "dictionary"),
    (
        "format-type-json-object",
        {"output_config": {"format": {"type": "json_object"}}},
        "output_config.format.type",
        "json_schema",
    ),
    (
        "format-schema-missing",
        {"output_config": {"format": {"type": "json_schema"}}},
        "output_config.format.schema",
        None,
    ),
    (
        "tool-choice-required",
        {"tools": [TOOL], "tool_choice": {"type": "required"}},
        "tool_choice.type",
        None,
    ),
    ("tool-choice-string", {"tools": [TOOL], "tool_choice": "auto"}, "tool_choice", "dictionary"),
    (
        "tool-choice-unknown-tool",
        {"tools": [TOOL], "tool_choice": {"type": "tool", "name": "nope"}},
        "tool_choice.name",
        "nope",
    ),
    (
        "tool-choice-no-tools",
        {"tool_choice": {"type": "tool", "name": "get_weather"}},
        "tool_choice.name",
        None,
    ),
    (
        # a server tool is refused where it is defined, before tool_choice can name it
        "tool-choice-server-tool",
        {
            "tools": [TOOL, {"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "tool", "name": "web_search"},
        },
        "tools.1.type",
        "server tool",
    ),
    (
        "tool-choice-tool-no-name",
        {"tools": [TOOL], "tool_choice": {"type": "tool"}},
        "tool_choice.name",
        "required",
    ),
    (
        "disable-parallel-string",
        {"tools": [TOOL], "tool_choice": {"type": "auto", "disable_parallel_tool_use": "true"}},
        "tool_choice.disable_parallel_tool_use",
        "boolean",
    ),
    ("stop-sequences-number-item", {"stop_sequences": ["a", 1]}, "stop_sequences.1", "string"),
    ("stop-sequences-number", {"stop_sequences": 5}, "stop_sequences", "list"),
    ("temperature-string", {"temperature": "0.5"}, "temperature", "number"),
    ("temperature-bool", {"temperature": True}, "temperature", "number"),
    ("temperature-negative", {"temperature": -0.1}, "temperature", None),
    ("top-p-above-one", {"top_p": 1.5}, "top_p", None),
    ("top-k-float", {"top_k": 1.5}, "top_k", "integer"),
    ("top-k-negative", {"top_k": -1}, "top_k", None),
    # integers the API bounds are range-checked, never forwarded as digits an upstream
    # cannot read (issue 16): at most 2**31-1
    ("max-tokens-2**31", {"max_tokens": 2**31}, "max_tokens", "less than or equal to 2147483647"),
    ("max-tokens-2**64", {"max_tokens": 2**64}, "max_tokens", "less than or equal"),
    ("max-tokens-400-digits", {"max_tokens": 10**400 - 1}, "max_tokens", "less than or equal"),
    ("max-tokens-huge-negative", {"max_tokens": -(10**400)}, "max_tokens", "greater than"),
    (
        "budget-tokens-2**64",
        {"max_tokens": 2**31 - 1, "thinking": {"type": "enabled", "budget_tokens": 2**64}},
        "thinking.budget_tokens",
        "less than or equal",
    ),
    ("top-k-2**64", {"top_k": 2**64}, "top_k", "less than or equal"),
    (
        "computer-width-400-digits",
        {
            "tools": [
                {
                    "type": "computer_20251124",
                    "name": "computer",
                    "display_width_px": 10**400,
                    "display_height_px": 768,
                }
            ]
        },
        "tools.0.display_width_px",
        "less than or equal",
    ),
    (
        "text-editor-max-characters-2**63",
        {
            "tools": [
                {
                    "type": "text_editor_20250728",
                    "name": "str_replace_based_edit_tool",
                    "max_characters": 2**63,
                }
            ]
        },
        "tools.0.max_characters",
        "less than or equal",
    ),
    (
        "chat-template-kwargs-too-deep",
        {"chat_template_kwargs": _deep(80)},
        "chat_template_kwargs",
        "nesting",
    ),
    ("stream-string", {"stream": "true"}, "stream", "boolean"),
    ("metadata-list", {"metadata": ["u"]}, "metadata", "dictionary"),
    ("metadata-user-id-number", {"metadata": {"user_id": 5}}, "metadata.user_id", "string"),
    ("tools-object", {"tools": TOOL}, "tools", "list"),
    ("tool-not-object", {"tools": ["get_weather"]}, "tools.0", "dictionary"),
    ("tool-name-missing", {"tools": [{"input_schema": {}}]}, "tools.0.name", "required"),
    ("tool-name-space", {"tools": [{**TOOL, "name": "get weather"}]}, "tools.0.name", "pattern"),
    ("tool-name-too-long", {"tools": [{**TOOL, "name": "a" * 129}]}, "tools.0.name", "pattern"),
    ("tool-name-duplicate", {"tools": [TOOL, TOOL]}, "tools.1.name", "unique"),
    ("tool-schema-missing", {"tools": [{"name": "f"}]}, "tools.0.input_schema", "required"),
    (
        "tool-schema-list",
        {"tools": [{"name": "f", "input_schema": []}]},
        "tools.0.input_schema",
        "dictionary",
    ),
    (
        "tool-schema-too-deep",
        {"tools": [{"name": "f", "input_schema": _deep(80)}]},
        "tools.0.input_schema",
        "nesting",
    ),
    (
        "tool-description-number",
        {"tools": [{**TOOL, "description": 1}]},
        "tools.0.description",
        "string",
    ),
    ("tool-type-function", {"tools": [{**TOOL, "type": "function"}]}, "tools.0.type", "unknown"),
    (
        "server-tool-web-search",
        {"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 8}]},
        "tools.0.type",
        "'web_search_20250305' is an Anthropic server tool",
    ),
    (
        "server-tool-mcp-toolset",
        {"tools": [TOOL, {"type": "mcp_toolset", "mcp_server_name": "x"}]},
        "tools.1.type",
        "server tool",
    ),
    (
        "client-tool-wrong-name",
        {"tools": [{"type": "bash_20250124", "name": "shell"}]},
        "tools.0.name",
        "Input should be 'bash'",
    ),
    (
        "client-tool-unknown-version",
        {"tools": [{"type": "bash_20990101", "name": "bash"}]},
        "tools.0.type",
        "unknown tool type 'bash_20990101'",
    ),
    (
        "client-tool-name-duplicates-custom",
        {"tools": [{**TOOL, "name": "bash"}, {"type": "bash_20250124", "name": "bash"}]},
        "tools.1.name",
        "unique",
    ),
    (
        "tool-defer-loading-string",
        {"tools": [{**TOOL, "defer_loading": "yes"}]},
        "tools.0.defer_loading",
        "boolean",
    ),
    (
        "chat-template-kwargs-list",
        {"chat_template_kwargs": ["x"]},
        "chat_template_kwargs",
        "dictionary",
    ),
    (
        "continue-final-message-string",
        {"continue_final_message": "yes"},
        "continue_final_message",
        "boolean",
    ),
    # Per-turn control entries (beta per-turn-control-2026-07-01): an empty system turn
    # needs output_config fields; empty user/assistant content is refused as ever.
    (
        "control-entry-no-output-config",
        _turn({"role": "system", "content": []}),
        "messages.1.content",
        "at least 1",
    ),
    (
        "control-entry-empty-output-config",
        _turn({"role": "system", "content": [], "output_config": {}}),
        "messages.1.content",
        None,
    ),
    (
        "control-entry-null-effort",
        _turn({"role": "system", "content": [], "output_config": {"effort": None}}),
        "messages.1.content",
        None,
    ),
    (
        "control-entry-no-content-no-config",
        _turn({"role": "system"}),
        "messages.1.content",
        "required",
    ),
    (
        "control-entry-bad-effort",
        _turn({"role": "system", "content": [], "output_config": {"effort": "extreme"}}),
        "messages.1.output_config.effort",
        "medium",
    ),
    (
        "control-entry-config-list",
        _turn({"role": "system", "content": [], "output_config": []}),
        "messages.1.output_config",
        "dictionary",
    ),
    (
        "control-entry-format-top-level-only",
        _turn(
            {
                "role": "system",
                "content": [],
                "output_config": {
                    "effort": "low",
                    "format": {"type": "json_schema", "schema": {"type": "object"}},
                },
            }
        ),
        "messages.1.output_config.format",
        "top level",
    ),
    (
        "user-empty-list-with-output-config",
        {"messages": [{"role": "user", "content": [], "output_config": {"effort": "low"}}]},
        "messages.0.content",
        "at least 1",
    ),
    (
        "assistant-empty-list",
        _turn({"role": "assistant", "content": []}),
        "messages.1.content",
        "at least 1",
    ),
    (
        "system-clear-at-unknown",
        _turn({"role": "system", "content": "s", "clear_at": "later"}),
        "messages.1.clear_at",
        "next_user_message",
    ),
    (
        "user-clear-at",
        {"messages": [{"role": "user", "content": "q", "clear_at": "never"}]},
        "messages.0.clear_at",
        "system",
    ),
]

ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("unknown-model-name", {"model": "not-configured-anywhere"}),
    (
        "unknown-top-level-fields",
        {
            "service_tier": "auto",
            "context_management": {"edits": []},
            "speed": "fast",
            "mcp_servers": [],
            "cache_control": {"type": "ephemeral"},
        },
    ),
    ("max-tokens-one", {"max_tokens": 1}),
    ("max-tokens-2**31-1", {"max_tokens": 2**31 - 1}),
    (
        "budget-tokens-2**31-2",
        {"max_tokens": 2**31 - 1, "thinking": {"type": "enabled", "budget_tokens": 2**31 - 2}},
    ),
    ("top-k-2**31-1", {"top_k": 2**31 - 1}),
    (
        "thinking-with-signature",
        _assistant({"type": "thinking", "thinking": "t", "signature": "c2ln"}),
    ),
    ("thinking-without-signature", _assistant({"type": "thinking", "thinking": "t"})),
    (
        "system-turn-text",
        {
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "system", "content": [{"type": "text", "text": "s"}]},
            ]
        },
    ),
    (
        "system-turn-string-first",
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]},
    ),
    ("tool-result-legacy-id", _tool_result(id="toolu_1", content="ok")),
    (
        "tool-result-error-blocks",
        _tool_result(
            tool_use_id="toolu_1",
            is_error=True,
            content=[
                {"type": "text", "text": "boom"},
                {"type": "tool_reference", "tool_name": "Read"},
                {"type": "search_result", "source": "s", "title": "t", "content": []},
                {"type": "document", "source": {"type": "text", "data": "d"}},
                {"type": "image", "source": PNG},
            ],
        ),
    ),
    ("image-url", _user({"type": "image", "source": {"type": "url", "url": "https://e.x/a.png"}})),
    ("document-content-string", _doc({"type": "content", "content": "text"})),
    # a base64 PDF is accepted here; its text is extracted after validation (documents.py)
    ("document-pdf", _doc({"type": "base64", "media_type": "application/pdf", "data": "JVBE"})),
    (
        "tool-result-pdf",
        _tool_result(
            tool_use_id="toolu_1",
            content=[
                {
                    "type": "document",
                    "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"},
                }
            ],
        ),
    ),
    (
        "thinking-enabled-summarized",
        {
            "thinking": {"type": "enabled", "budget_tokens": 1024, "display": "summarized"},
            "max_tokens": 2048,
        },
    ),
    ("thinking-adaptive", {"thinking": {"type": "adaptive"}}),
    # Claude Code 2.1.3xx sends display "omitted"; the real API accepts it
    ("thinking-adaptive-omitted", {"thinking": {"type": "adaptive", "display": "omitted"}}),
    ("thinking-between-tools", {"thinking": {"type": "between_tools"}}),
    ("thinking-disabled", {"thinking": {"type": "disabled"}}),
    ("effort-minimal", {"output_config": {"effort": "minimal"}}),
    (
        "effort-max-with-format",
        {
            "output_config": {
                "effort": "max",
                "format": {"type": "json_schema", "schema": {"type": "object"}},
            }
        },
    ),
    (
        "anthropic-defined-client-tools",
        {
            "tools": [
                {"type": "bash_20250124", "name": "bash", "cache_control": {"type": "ephemeral"}},
                {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
                {"type": "memory_20250818", "name": "memory"},
                {
                    "type": "computer_20251124",
                    "name": "computer",
                    "display_width_px": 1024,
                    "display_height_px": 768,
                },
                TOOL,
            ],
            "tool_choice": {"type": "tool", "name": "str_replace_based_edit_tool"},
        },
    ),
    ("tool-name-128", {"tools": [{**TOOL, "name": "A-z_0" + "x" * 123}]}),
    ("tools-empty", {"tools": []}),
    (
        "tool-choice-any-parallel-off",
        {"tools": [TOOL], "tool_choice": {"type": "any", "disable_parallel_tool_use": True}},
    ),
    ("stop-sequences-string", {"stop_sequences": "END"}),
    (
        "nulls-are-absent",
        {
            "system": None,
            "tools": None,
            "tool_choice": None,
            "thinking": None,
            "temperature": None,
            "top_p": None,
            "top_k": None,
            "stream": None,
            "stop_sequences": None,
            "metadata": None,
            "output_config": None,
        },
    ),
    ("sampling", {"temperature": 1, "top_p": 0.5, "top_k": 0}),
    (
        "allow-listed-extras",
        {"chat_template_kwargs": {"enable_thinking": False}, "continue_final_message": True},
    ),
    # Claude Code 2.1.332 after /compact, and with --bare on every request
    (
        "control-entry-empty-list",
        _turn({"role": "system", "content": [], "output_config": {"effort": "medium"}}),
    ),
    (
        "control-entry-empty-string",
        _turn({"role": "system", "content": "", "output_config": {"effort": "max"}}),
    ),
    ("control-entry-no-content", _turn({"role": "system", "output_config": {"effort": "low"}})),
    (
        "system-turn-text-empty-output-config",
        _turn({"role": "system", "content": "s", "output_config": {}}),
    ),
    (
        "system-turn-clear-at",
        _turn({"role": "system", "content": "s", "clear_at": "next_user_message"}),
    ),
]


@pytest.mark.parametrize(
    ("fragment", "path", "word"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_refused(fragment: dict[str, Any], path: str, word: str | None) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_messages(_body(fragment))
    err = info.value
    assert (err.status, err.error_type, err.path) == (400, "invalid_request_error", path)
    assert err.message.startswith(f"{path}: ")
    if word is not None:
        assert word.lower() in err.message.lower()


def test_table_sizes() -> None:
    assert len(REFUSED) >= 40
    assert len({r[0] for r in REFUSED}) == len(REFUSED)


@pytest.mark.parametrize("fragment", [r[1] for r in ACCEPTED], ids=[r[0] for r in ACCEPTED])
def test_accepted(fragment: dict[str, Any]) -> None:
    body = _body(fragment)
    assert validate_messages(body) is body


@pytest.mark.parametrize("body", [[], "text", 3, None, True], ids=repr)
def test_body_must_be_an_object(body: Any) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_messages(body)
    assert info.value.status == 400
    assert "JSON object" in info.value.message


def test_refusal_renders_as_anthropic_error_envelope() -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_messages(
            _body(_user({"type": "image", "source": {"type": "base64", "media_type": "image/png"}}))
        )
    assert jsonutil.loads(anthropic_body(info.value))["error"] == {
        "type": "invalid_request_error",
        "message": "messages.0.content.0.source.data: image source needs base64 data",
    }


def test_thread_refusal_carries_the_details_the_sdks_fall_back_on() -> None:
    """Python's tool_runner and TypeScript's toolRunner resend the turn with the full history
    and no ``thread`` when error.details.error_code is ``thread_unsupported_request``."""
    with pytest.raises(InvalidRequest) as info:
        validate_messages(_body({"thread": {"type": "create"}}), count_tokens=True)
    error = jsonutil.loads(anthropic_body(info.value, "req_1"))["error"]
    assert error["type"] == "invalid_request_error"
    assert error["details"] == {"error_code": "thread_unsupported_request"}


def test_count_tokens_needs_no_max_tokens() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "thinking": {"type": "enabled", "budget_tokens": 4096},
    }
    assert validate_messages(body, count_tokens=True) is body
    with pytest.raises(InvalidRequest) as info:
        validate_messages(body)
    assert info.value.path == "max_tokens"


def test_count_tokens_still_checks_messages() -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_messages({"model": "m", "messages": []}, count_tokens=True)
    assert info.value.path == "messages"


def test_first_error_in_document_order_is_reported() -> None:
    """The path is deterministic: the earliest bad field in messages wins."""
    body = _body(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "ok"}, {"type": "text", "text": 1}],
                },
                {"role": "bogus", "content": "x"},
            ]
        }
    )
    with pytest.raises(InvalidRequest) as info:
        validate_messages(body)
    assert info.value.path == "messages.0.content.1.text"


def test_count_tokens_bounds_budget_tokens() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "thinking": {"type": "enabled", "budget_tokens": 10**400},
    }
    with pytest.raises(InvalidRequest) as info:
        validate_messages(body, count_tokens=True)
    assert info.value.path == "thinking.budget_tokens"


def test_echoed_client_input_is_short_and_encodable() -> None:
    """A name the message quotes is client input: shortened, a lone surrogate escaped."""
    for name, shown in (("x" * 5000, "x" * 64 + "..."), ("a\ud800", "a\\ud800")):
        with pytest.raises(InvalidRequest) as info:
            validate_messages(
                _body({"tools": [TOOL], "tool_choice": {"type": "tool", "name": name}})
            )
        assert info.value.message == f"tool_choice.name: Tool '{shown}' not found in tools"
        anthropic_body(info.value)  # encodes


# --- the decoding table: raw bytes a client sends -> 400 naming the path -----------------
# (gateway/text/jsonutil.py; gateway/http/body.py maps JSONInputError to InvalidRequest)

HI = b'[{"role":"user","content":"hi"}]'


def _raw(**fields: bytes) -> bytes:
    """A valid body's bytes with each field's value given as raw JSON text."""
    merged = {"model": b'"m"', "max_tokens": b"5", "messages": HI, **fields}
    return b"{" + b",".join(b'"' + k.encode() + b'":' + v for k, v in merged.items()) + b"}"


def _nest(levels: int, inner: bytes = b"0") -> bytes:
    return b"[" * levels + inner + b"]" * levels


LONE = "lone surrogate"
DECODE_REFUSED: list[tuple[str, bytes, str, str]] = [
    (
        "surrogate-content",
        _raw(messages=b'[{"role":"user","content":"\\ud800"}]'),
        "messages.0.content",
        LONE,
    ),
    (
        "surrogate-low-alone",
        _raw(messages=b'[{"role":"user","content":"a\\uDFFFb"}]'),
        "messages.0.content",
        "U+DFFF",
    ),
    (
        "surrogate-pair-reversed",
        _raw(messages=b'[{"role":"user","content":"\\ude00\\ud83d"}]'),
        "messages.0.content",
        LONE,
    ),
    ("surrogate-high-then-letter", _raw(system=b'"\\ud800\\u0041"'), "system", LONE),
    ("surrogate-raw-utf8-bytes", _raw(system=b'"\xed\xa0\x80"'), "system", LONE),
    (
        "surrogate-system-block",
        _raw(system=b'[{"type":"text","text":"\\udbff"}]'),
        "system.0.text",
        LONE,
    ),
    ("surrogate-stop-sequence", _raw(stop_sequences=b'["ok","\\ud800"]'), "stop_sequences.1", LONE),
    ("surrogate-model", _raw(model=b'"claude-\\ud800"'), "model", LONE),
    (
        "surrogate-tool-schema",
        _raw(tools=b'[{"name":"f","input_schema":{"type":"object","description":"\\ud800"}}]'),
        "tools.0.input_schema.description",
        LONE,
    ),
    (
        "surrogate-tool-input",
        _raw(
            messages=b'[{"role":"user","content":"q"},{"role":"assistant","content":'
            b'[{"type":"tool_use","id":"t","name":"f","input":{"a":["\\ud800"]}}]}]'
        ),
        "messages.1.content.0.input.a.0",
        LONE,
    ),
    ("surrogate-dropped-field", _raw(metadata=b'{"user_id":"\\ud800"}'), "metadata.user_id", LONE),
    ("surrogate-unknown-field", _raw(x=b'{"y":"\\ud800"}'), "x.y", LONE),
    ("surrogate-key", _raw(metadata=b'{"\\ud800":1}'), "metadata", "a key is not valid Unicode"),
    ("nan", _raw(temperature=b"NaN"), "temperature", "NaN"),
    ("infinity", _raw(temperature=b"Infinity"), "temperature", "out of range"),
    ("minus-infinity", _raw(top_p=b"-Infinity"), "top_p", "out of range"),
    ("overflow-1e400", _raw(temperature=b"1e400"), "temperature", "out of range"),
    ("overflow-in-unknown-field", _raw(x=b"[1,2,-1e999]"), "x.2", "out of range"),
    (
        "nan-in-tool-input",
        _raw(
            messages=b'[{"role":"user","content":"q"},{"role":"assistant","content":'
            b'[{"type":"tool_use","id":"t","name":"f","input":{"a":NaN}}]}]'
        ),
        "messages.1.content.0.input.a",
        "NaN",
    ),
    # 980 levels: under ujson's own 1,024 limit, past the stdlib re-parse's recursion
    ("nesting-980-with-nan", _raw(x=_nest(980), y=b'"NaN"'), "x.0.0.0.0.0.0.0...", "nesting"),
    (
        "nesting-980-with-5e100",
        _raw(x=_nest(980), y=b"5e100"),
        "x.0.0.0.0.0.0.0...",
        "nesting deeper than 128 levels",
    ),
    ("nesting-128-in-a-field", _raw(x=_nest(128)), "x.0.0.0.0.0.0.0...", "nesting"),
    ("nesting-past-ujson", _raw(x=_nest(5000)), "", "nesting deeper than 128 levels"),
    (
        "nesting-objects",
        _raw(x=b'{"a":' * 200 + b"1" + b"}" * 200),
        "x.a.a.a.a.a.a.a...",
        "nesting",
    ),
    ("integer-700-digits", _raw(max_tokens=b"9" * 700), "", "more than 640 digits"),
    ("integer-5000-digits", _raw(x=b"[" + b"1" * 5000 + b"]"), "", "more than 640 digits"),
]


@pytest.mark.parametrize(
    ("raw", "path", "word"), [r[1:] for r in DECODE_REFUSED], ids=[r[0] for r in DECODE_REFUSED]
)
def test_decode_refused(raw: bytes, path: str, word: str) -> None:
    with pytest.raises(jsonutil.JSONInputError) as info:
        jsonutil.loads(raw)
    err = info.value
    assert (err.path, word in err.why) == (path, True), err
    rendered = anthropic_body(InvalidRequest(err.path, err.why))  # the renderer takes it
    assert b"\\ud8" not in rendered.lower() and b"\xed\xa0" not in rendered


DECODE_ACCEPTED: list[tuple[str, bytes]] = [
    ("surrogate-pair", _raw(messages=b'[{"role":"user","content":"\\ud83d\\ude00"}]')),
    ("escaped-backslash-then-ud800", _raw(system=b'"\\\\ud800"')),  # the text \ud800
    ("text-nan-in-a-string", _raw(system=b'"NaN Infinity 1e400"')),
    ("finite-5e100", _raw(temperature=b"5e100")),
    ("underflow-to-zero", _raw(temperature=b"2e-400")),
    ("integer-639-digits-elsewhere", _raw(x=b"9" * 639)),
    ("nesting-127-in-a-field", _raw(x=_nest(127))),
    ("hangul-near-surrogates", _raw(system='"\ud7a3\ue000"'.encode())),  # ED 9E A3, EE 80 80
]


@pytest.mark.parametrize(
    "raw", [r[1] for r in DECODE_ACCEPTED], ids=[r[0] for r in DECODE_ACCEPTED]
)
def test_decode_accepted(raw: bytes) -> None:
    body = jsonutil.loads(raw)
    validate_messages(body)
    jsonutil.dumpb(body)  # what was accepted encodes again


def test_decode_then_validate_refuses_huge_max_tokens() -> None:
    """400 digits decode (under 640) and validation names the field."""
    with pytest.raises(InvalidRequest) as info:
        validate_messages(jsonutil.loads(_raw(max_tokens=b"9" * 400)))
    assert info.value.path == "max_tokens"


# --- the value bound before decoding (jsonutil.too_many_values) --------------------------


def _count(value: Any) -> int:
    stack, n = [value], 0
    while stack:
        node = stack.pop()
        n += 1
        if isinstance(node, dict):
            n += len(node)  # the keys
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return n


LIMIT = 1000
VALUE_BOUND: list[tuple[str, bytes, bool]] = [
    ("short-body-never-counted", b"[" + b"[]," * 300 + b"[]]", False),
    ("empty-lists-over", b'{"x":[' + b"[]," * 1000 + b"[]]}", True),
    ("numbers-at-limit", b"[" + b"0," * 998 + b"0]", False),  # 999 + 1: the bound is exact
    ("empty-lists-half-the-limit", b"[" + b"[]," * 498 + b"[]]", False),  # counted twice
    ("empty-objects-over", b"[" + b"{}," * 1000 + b"{}]", True),
    ("numbers-over", b"[" + b"0," * 1000 + b"0]", True),
    ("short-strings-over", b"[" + b'"a",' * 1000 + b'"a"]', True),
    ("commas-in-one-string", b'{"content":"' + b"a, b: [c] {d}, " * 400 + b'"}', False),
    ("escaped-quotes-in-a-string", b'{"content":"' + b'x\\",\\"[' * 600 + b'"}', False),
    ("escaped-backslash-ends-the-string", b'{"a":"\\\\","b":[' + b"[]," * 600 + b"[]]}", True),
    ("strings-then-lists", b'["' + b"," * 2000 + b'",' + b"[]," * 1000 + b"[]]", True),
]


@pytest.mark.parametrize(
    ("raw", "over"), [r[1:] for r in VALUE_BOUND], ids=[r[0] for r in VALUE_BOUND]
)
def test_value_bound(raw: bytes, over: bool) -> None:
    assert jsonutil.too_many_values(raw, LIMIT) is over
    if not over:
        assert _count(jsonutil.loads(raw)) <= LIMIT


def test_value_bound_with_many_strings() -> None:
    """Past 4,096 quotes the strings are split out instead of measured one by one."""
    strings = b",".join([b'"a,b,c,d,e,f,g,h,i"'] * 2500)
    assert jsonutil.too_many_values(b'{"k":[' + strings + b"]}", 5000) is False
    assert (
        jsonutil.too_many_values(b'{"k":[' + strings + b"," + b"0," * 2500 + b"0]}", 5000) is True
    )


def test_value_bound_default_lets_a_32_mib_prompt_through() -> None:
    """A prompt of code or CSV holds separators by the million, all inside one string."""
    row = b"1,2,3,[4],{5:6}, " * 8
    body = b'{"messages":[{"role":"user","content":"' + row * (32 * 2**20 // len(row)) + b'"}]}'
    assert jsonutil.too_many_values(body) is False
    assert jsonutil.too_many_values(b"[" + b"[]," * jsonutil.MAX_VALUES + b"[]]") is True
