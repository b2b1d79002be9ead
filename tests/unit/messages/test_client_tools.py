"""Anthropic-defined tools: client tools become function tools, server tools are refused.

Claude has the schemas of its built-in client tools (bash, text editor, memory, computer)
built in; a local model must be given them, so each goes upstream as a function tool with
the documented schema under the name the type requires. Server tools (web search, web
fetch, code execution, tool search, advisor, MCP toolsets) run on Anthropic's servers: a
request naming one is a 400 at ``tools.N.type``, which Claude Code hands to the model as the
tool's result. The SDK's own tool union is the list of types checked here.
"""

from __future__ import annotations

import typing
from typing import Any

import pytest
from anthropic.types.beta.beta_tool_union_param import BetaToolUnionParam

from gateway.errors import InvalidRequest
from gateway.messages.from_chat.message import from_chat
from gateway.messages.request.validate import validate_messages
from gateway.messages.to_chat.client_tools import CLIENT_TOOLS
from gateway.messages.to_chat.translate import to_chat
from gateway.ops.config import ModelRoute, UpstreamConfig
from tests.client_tool_schemas import (
    ACTIONS_20241022,
    ACTIONS_20250124,
    BASH,
    MEMORY,
    NEW_EDITOR,
    OLD_EDITOR,
    SCREEN,
    computer,
)

ROUTE = ModelRoute(
    name="m",
    upstream=UpstreamConfig(name="u", base_url="http://127.0.0.1:9/v1", kind="vllm"),
    upstream_model="org/model",
)
BASE: dict[str, Any] = {
    "model": "m",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hi"}],
}
SERVER_TOOL = "is an Anthropic server tool; this gateway's models cannot run Anthropic server tools"


def _functions(*tools: dict[str, Any], **extra: Any) -> list[dict[str, Any]]:
    out = to_chat(validate_messages({**BASE, "tools": list(tools), **extra}), ROUTE)
    assert all(t["type"] == "function" for t in out["tools"])
    return [t["function"] for t in out["tools"]]


def _refusal(*tools: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        validate_messages({**BASE, "tools": list(tools)})
    assert (info.value.status, info.value.error_type) == (400, "invalid_request_error")
    return info.value


# --- the documented schemas, exactly -------------------------------------------------

# (tool definition, the function's exact parameters, words its description must hold)
SCHEMAS: list[tuple[dict[str, Any], dict[str, Any], tuple[str, ...]]] = [
    ({"type": "bash_20241022", "name": "bash"}, BASH, ("persistent bash shell", "restart")),
    ({"type": "bash_20250124", "name": "bash"}, BASH, ("persistent bash shell", "restart")),
    (
        {"type": "text_editor_20241022", "name": "str_replace_editor"},
        OLD_EDITOR,
        ("`undo_edit` reverts", "inserts `new_str`"),
    ),
    (
        {"type": "text_editor_20250124", "name": "str_replace_editor"},
        OLD_EDITOR,
        ("`undo_edit` reverts", "inserts `new_str`"),
    ),
    (
        {"type": "text_editor_20250429", "name": "str_replace_based_edit_tool"},
        NEW_EDITOR,
        ("inserts `insert_text`",),
    ),
    (
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
        NEW_EDITOR,
        ("inserts `insert_text`",),
    ),
    (
        {
            "type": "text_editor_20250728",
            "name": "str_replace_based_edit_tool",
            "max_characters": 10000,
        },
        NEW_EDITOR,
        ("at most 10000 characters",),
    ),
    ({"type": "memory_20250818", "name": "memory"}, MEMORY, ("/memories", "context may be reset")),
    (
        {"type": "computer_20241022", "name": "computer", **SCREEN},
        computer(ACTIONS_20241022, newer=False),
        ("1280x800 pixels",),
    ),
    (
        {"type": "computer_20250124", "name": "computer", **SCREEN, "display_number": 1},
        computer(ACTIONS_20250124, newer=True),
        ("1280x800 pixels (X11 display :1)",),
    ),
    (
        {"type": "computer_20251124", "name": "computer", **SCREEN},
        computer(ACTIONS_20250124, newer=True),
        ("1280x800 pixels",),
    ),
    (
        {"type": "computer_20251124", "name": "computer", **SCREEN, "enable_zoom": True},
        computer([*ACTIONS_20250124, "zoom"], newer=True),
        ("1280x800 pixels",),
    ),
]


@pytest.mark.parametrize(
    ("tool", "parameters", "words"),
    SCHEMAS,
    ids=[f"{s[0]['type']}-{i}" for i, s in enumerate(SCHEMAS)],
)
def test_client_tool_goes_up_with_its_documented_schema(
    tool: dict[str, Any], parameters: dict[str, Any], words: tuple[str, ...]
) -> None:
    (fn,) = _functions(tool)
    assert set(fn) == {"name", "description", "parameters"}
    assert fn["name"] == tool["name"]
    got = fn["parameters"]
    if "action" in got["properties"]:  # computer: every action is described in its field
        action = got["properties"]["action"]
        described = action.pop("description")
        assert all(f"`{a}`: " in described for a in action["enum"])
    assert got == parameters
    for word in words:
        assert word in fn["description"]
    assert "undo_edit" not in fn["description"] or parameters is OLD_EDITOR


def test_every_client_type_is_in_the_table() -> None:
    assert {t[0]["type"] for t in SCHEMAS} == set(CLIENT_TOOLS)


def test_tool_options_never_reach_the_upstream() -> None:
    """cache_control, strict, allowed_callers, input_examples tune Anthropic's serving;
    defer_loading is the gateway's to apply (a deferred tool goes up once loaded, as any)."""
    tool = {
        "type": "bash_20250124",
        "name": "bash",
        "cache_control": {"type": "ephemeral"},
        "strict": True,
        "allowed_callers": ["direct"],
        "input_examples": [{"command": "ls"}],
        "defer_loading": False,
    }
    (fn,) = _functions(tool)
    assert fn["parameters"] == BASH
    assert set(fn) == {"name", "description", "parameters"}


def test_client_and_custom_tools_keep_their_order_and_tool_choice_names_a_client_tool() -> None:
    custom = {"name": "get_weather", "input_schema": {"type": "object"}}
    out = to_chat(
        validate_messages(
            {
                **BASE,
                "tools": [
                    {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
                    custom,
                    {"type": "bash_20250124", "name": "bash"},
                ],
                "tool_choice": {"type": "tool", "name": "bash", "disable_parallel_tool_use": True},
            }
        ),
        ROUTE,
    )
    assert [t["function"]["name"] for t in out["tools"]] == [
        "str_replace_based_edit_tool",
        "get_weather",
        "bash",
    ]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "bash"}}
    assert out["parallel_tool_calls"] is False


def test_client_tools_report_no_dropped_fields() -> None:
    dropped: list[str] = []
    to_chat(
        validate_messages(
            {
                **BASE,
                "seed": 1,
                "tools": [
                    {
                        "type": "memory_20250818",
                        "name": "memory",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            }
        ),
        ROUTE,
        on_drop=dropped.append,
    )
    assert dropped == ["seed"]


def test_tool_use_round_trip_keeps_the_client_name() -> None:
    """The model calls the function by the client's name; nothing is mapped either way."""
    out = to_chat(
        validate_messages(
            {
                **BASE,
                "tools": [{"type": "bash_20250124", "name": "bash"}],
                "messages": [
                    {"role": "user", "content": "list files"},
                    {
                        "role": "assistant",
                        "content": [
                            {
                                "type": "tool_use",
                                "id": "toolu_1",
                                "name": "bash",
                                "input": {"command": "ls"},
                            }
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}
                        ],
                    },
                ],
            }
        ),
        ROUTE,
    )
    assert out["messages"][1]["tool_calls"][0]["function"]["name"] == "bash"
    reply = from_chat(
        {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {
                                    "name": "str_replace_based_edit_tool",
                                    "arguments": '{"command": "view", "path": "/repo"}',
                                },
                            }
                        ],
                    },
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        },
        model="m",
        signing_key=b"k",
        message_id="msg_1",
    )
    (block,) = reply["content"]
    assert block["type"] == "tool_use" and block["name"] == "str_replace_based_edit_tool"
    assert block["input"] == {"command": "view", "path": "/repo"}


# --- refusals ------------------------------------------------------------------------


def _sdk_tool_types() -> dict[str, str | None]:
    """Every versioned tool type the SDK's BetaToolUnionParam lists -> the name it requires."""
    types: dict[str, str | None] = {}
    for param in typing.get_args(BetaToolUnionParam):
        hints = typing.get_type_hints(param)
        names = typing.get_args(hints["name"]) if "name" in hints else ()
        name = names[0] if names else None
        for kind in typing.get_args(hints["type"]):
            if isinstance(kind, str) and kind != "custom":
                types[kind] = name if isinstance(name, str) else None
    return types


SDK_TYPES = _sdk_tool_types()
SERVER_TYPES = sorted(t for t in SDK_TYPES if t not in CLIENT_TOOLS and "toolset_2" not in t)


def test_the_sdk_union_is_covered() -> None:
    """Each SDK tool type is a client tool (with the SDK's name) or refused by name."""
    assert len(SDK_TYPES) >= 27
    for kind, name in SDK_TYPES.items():
        if kind in CLIENT_TOOLS:
            assert CLIENT_TOOLS[kind].name == name, kind
    assert {
        "web_search_20250305",
        "web_fetch_20250910",
        "code_execution_20250825",
        "tool_search_tool_bm25_20251119",
        "tool_search_tool_regex",
        "advisor_20260301",
        "mcp_toolset",
    } <= set(SERVER_TYPES)


@pytest.mark.parametrize("kind", [*SERVER_TYPES, "web_search_20990101", "code_execution_20990101"])
def test_server_tool_is_refused_naming_it(kind: str) -> None:
    name = SDK_TYPES.get(kind) or kind.rsplit("_", 1)[0]
    err = _refusal(
        {"type": "bash_20250124", "name": "bash"},
        {"type": kind, "name": name, "mcp_server_name": "s", "model": "x"},
    )
    assert err.path == "tools.1.type"
    assert err.message == f"tools.1.type: '{kind}' {SERVER_TOOL}"


def test_claude_code_websearch_side_request_is_refused() -> None:
    """What Claude Code's WebSearch tool sends: its only tool is the server tool."""
    err = _refusal(
        {
            "type": "web_search_20250305",
            "name": "web_search",
            "allowed_domains": None,
            "blocked_domains": None,
            "max_uses": 8,
        }
    )
    assert err.message == (
        "tools.0.type: 'web_search_20250305' is an Anthropic server tool; this gateway's "
        "models cannot run Anthropic server tools"
    )


@pytest.mark.parametrize(
    ("tool", "path", "message"),
    [
        (
            {"type": "computer_toolset_20260801"},
            "tools.0.type",
            "'computer_toolset_20260801' is not supported by this gateway; use a "
            "'computer_20251124' tool instead",
        ),
        (
            {"type": "browser_toolset_20260801"},
            "tools.0.type",
            "'browser_toolset_20260801' is not supported by this gateway; define the browser "
            "actions as custom tools instead",
        ),
        (
            {"type": "bash_20990101", "name": "bash"},
            "tools.0.type",
            "unknown tool type 'bash_20990101'; this gateway knows 'bash_20241022', "
            "'bash_20250124'",
        ),
        (
            {"type": "text_editor_20260101", "name": "str_replace_based_edit_tool"},
            "tools.0.type",
            "unknown tool type 'text_editor_20260101'; this gateway knows 'text_editor_20241022', "
            "'text_editor_20250124', 'text_editor_20250429', 'text_editor_20250728'",
        ),
        (
            {"type": "foo_20250101", "name": "foo"},
            "tools.0.type",
            "unknown tool type 'foo_20250101'",
        ),
        ({"type": "function", "name": "f"}, "tools.0.type", "unknown tool type"),
        ({"type": "x" * 5000 + "_20250101"}, "tools.0.type", None),  # echoed only when versioned
        ({"type": "bash"}, "tools.0.type", "unknown tool type"),
        ({"type": 7}, "tools.0.type", "unknown tool type"),
    ],
    ids=[
        "computer-toolset",
        "browser-toolset",
        "bash-future",
        "editor-future",
        "foo",
        "function",
        "long",
        "unversioned",
        "number",
    ],
)
def test_unknown_or_untranslated_type_is_refused(
    tool: dict[str, Any], path: str, message: str | None
) -> None:
    err = _refusal(tool)
    assert err.path == path
    if message is not None:
        assert err.message == f"{path}: {message}"


@pytest.mark.parametrize("kind", sorted(CLIENT_TOOLS))
def test_client_tool_name_must_be_the_one_its_type_requires(kind: str) -> None:
    required = CLIENT_TOOLS[kind].name
    for wrong in ("my_" + required, required.upper(), 5):
        err = _refusal({"type": kind, "name": wrong, **SCREEN})
        assert err.message == f"tools.0.name: Input should be '{required}'"
    err = _refusal({"type": kind, **SCREEN})
    assert err.message == "tools.0.name: Field required"


@pytest.mark.parametrize(
    ("tool", "path", "word"),
    [
        (
            {"type": "computer_20250124", "name": "computer", "display_height_px": 800},
            "tools.0.display_width_px",
            "required",
        ),
        (
            {"type": "computer_20241022", "name": "computer", "display_width_px": 1280},
            "tools.0.display_height_px",
            "required",
        ),
        (
            {"type": "computer_20251124", "name": "computer", **SCREEN, "display_width_px": "1280"},
            "tools.0.display_width_px",
            "integer",
        ),
        (
            {"type": "computer_20251124", "name": "computer", **SCREEN, "display_height_px": 0},
            "tools.0.display_height_px",
            "greater than or equal to 1",
        ),
        (
            {"type": "computer_20250124", "name": "computer", **SCREEN, "display_number": 1.5},
            "tools.0.display_number",
            "integer",
        ),
        (
            {"type": "computer_20250124", "name": "computer", **SCREEN, "display_number": -1},
            "tools.0.display_number",
            "greater than or equal to 0",
        ),
        (
            {"type": "computer_20251124", "name": "computer", **SCREEN, "enable_zoom": "yes"},
            "tools.0.enable_zoom",
            "boolean",
        ),
        (
            {
                "type": "text_editor_20250728",
                "name": "str_replace_based_edit_tool",
                "max_characters": True,
            },
            "tools.0.max_characters",
            "integer",
        ),
        (
            {
                "type": "text_editor_20250728",
                "name": "str_replace_based_edit_tool",
                "max_characters": 0,
            },
            "tools.0.max_characters",
            "greater than or equal to 1",
        ),
        (
            {"type": "bash_20250124", "name": "bash", "defer_loading": "yes"},
            "tools.0.defer_loading",
            "boolean",
        ),
    ],
    ids=[
        "width-missing",
        "height-missing",
        "width-string",
        "height-zero",
        "display-float",
        "display-negative",
        "zoom-string",
        "max-characters-bool",
        "max-characters-zero",
        "defer-loading-string",
    ],
)
def test_client_tool_fields_are_checked(tool: dict[str, Any], path: str, word: str) -> None:
    err = _refusal(tool)
    assert err.path == path
    assert word in err.message


def test_names_are_unique_across_custom_and_client_tools() -> None:
    err = _refusal(
        {"name": "bash", "input_schema": {"type": "object"}},
        {"type": "bash_20250124", "name": "bash"},
    )
    assert err.message == "tools.1.name: Tool names must be unique: 'bash'"


def test_optional_fields_given_as_null_count_as_absent() -> None:
    (fn,) = _functions(
        {
            "type": "computer_20251124",
            "name": "computer",
            **SCREEN,
            "display_number": None,
            "enable_zoom": None,
            "cache_control": None,
        }
    )
    assert "zoom" not in fn["parameters"]["properties"]["action"]["enum"]
    (fn,) = _functions(
        {
            "type": "text_editor_20250728",
            "name": "str_replace_based_edit_tool",
            "max_characters": None,
        }
    )
    assert fn["parameters"] == NEW_EDITOR and "at most" not in fn["description"]
