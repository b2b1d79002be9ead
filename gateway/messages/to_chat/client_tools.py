"""Anthropic-defined tools: the client-run ones become function tools, server ones are refused.

Protocol facts relied on (Anthropic's tool docs; SDK 2.14 types ``Beta*Tool*Param`` and
``BetaToolUnionParam``):

- A ``tools[]`` entry with a versioned ``type`` is Anthropic-defined. It carries no
  ``input_schema``: Claude has the schema built in. An OpenAI-compatible model does not, so
  each client tool is sent as a function tool with the schema Anthropic documents, under
  the client's tool name; the model calls that name and ``tool_use`` blocks come back under
  it, as from Claude. Each type requires one name (the API answers 400 otherwise).
- Client tools (the client executes them), type -> the name it requires:

  * ``bash_20241022``, ``bash_20250124`` -> ``bash``: ``command``, or ``restart``.
  * ``text_editor_20241022``, ``text_editor_20250124`` -> ``str_replace_editor``: view,
    create, str_replace, insert (its text in ``new_str``), undo_edit.
  * ``text_editor_20250429``, ``text_editor_20250728`` -> ``str_replace_based_edit_tool``:
    the same without undo_edit; insert's text in ``insert_text``.
  * ``memory_20250818`` -> ``memory``: view, create, str_replace, insert, delete, rename
    of files under ``/memories``.
  * ``computer_20241022``, ``computer_20250124``, ``computer_20251124`` -> ``computer``:
    one ``action`` per call, on a display of ``display_width_px`` x ``display_height_px``.

  The docs name ``insert``'s text ``new_str`` for every editor version, but Claude 4 sends
  ``insert_text`` with ``str_replace_based_edit_tool`` (anthropic-sdk-python#1155), as the
  memory tool's ``insert`` does: clients tested against Claude read ``insert_text``, so
  the local model is asked for it. ``text_editor_20250728`` takes ``max_characters`` (the
  client truncates a view to it; the model is told). ``computer_20250124`` added
  ``hold_key``, ``left_mouse_down``/``up``, ``triple_click``, ``scroll`` and ``wait``, with
  ``coordinate`` on clicks and a ``start_coordinate`` for drags; ``computer_20251124``
  adds ``zoom`` (a ``region``) only when the tool sets ``enable_zoom``.
- Server tools run on Anthropic's servers: ``web_search_*``, ``web_fetch_*``,
  ``code_execution_*``, ``tool_search_tool_bm25*`` / ``tool_search_tool_regex*``,
  ``advisor_*`` and ``mcp_toolset``. A local model cannot run them, and dropping one would
  answer 200 with whatever the model writes instead (Claude Code's WebSearch shows that as
  search results), so they are refused; Claude Code hands such a 400 to the model as the
  tool's result and goes on. The ``computer_toolset_*`` / ``browser_toolset_*`` families
  (one entry, many member tools) are client-run but not translated here: refused by name.

Pure: no aiohttp, no I/O. Schemas are built per request from the tool's own fields.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from gateway.errors import echo
from gateway.messages.request.content import check_int, fail

__all__ = ["CLIENT_TOOLS", "check_client_tool", "to_function"]

Schema = dict[str, Any]

_VERSIONED = re.compile(r"([a-z][a-z0-9_]*?)_[0-9]{8}")  # family, date
_SERVER_FAMILIES = frozenset(
    {
        "web_search",
        "web_fetch",
        "code_execution",
        "tool_search_tool_bm25",
        "tool_search_tool_regex",
        "advisor",
    }
)
# the unversioned spellings the SDK types allow
_SERVER_TYPES = frozenset({"mcp_toolset", "tool_search_tool_bm25", "tool_search_tool_regex"})
_SERVER_TOOL = (
    "'{}' is an Anthropic server tool; this gateway's models cannot run Anthropic server tools"
)
_TOOLSETS = {
    "computer_toolset": "use a 'computer_20251124' tool instead",
    "browser_toolset": "define the browser actions as custom tools instead",
}


@dataclass(frozen=True, slots=True)
class ClientTool:
    """One versioned client tool: the name it requires, its config check, its schema."""

    name: str
    build: Callable[[Mapping[str, Any]], tuple[str, Schema]]  # tool -> (description, schema)
    check: Callable[[Mapping[str, Any], str], None] = lambda tool, path: None  # no fields


# --- schema pieces ------------------------------------------------------------------


def _string(description: str) -> Schema:
    return {"type": "string", "description": description}


def _integer(description: str) -> Schema:
    return {"type": "integer", "description": description}


def _ints(count: int, description: str) -> Schema:
    return {
        "type": "array",
        "items": {"type": "integer"},
        "minItems": count,
        "maxItems": count,
        "description": description,
    }


def _commands(commands: tuple[str, ...]) -> Schema:
    return {
        "type": "string",
        "enum": list(commands),
        "description": "The command to run: " + ", ".join(commands) + ".",
    }


# --- bash ---------------------------------------------------------------------------

_BASH = (
    "Run a command in a persistent bash shell: the working directory, environment variables "
    "and files persist between calls. Send `command` to run it, or `restart: true` alone to "
    "start a fresh shell. Avoid commands that print very large output or wait for input; "
    "run long-lived processes in the background (e.g. `server &`)."
)


def _bash(tool: Mapping[str, Any]) -> tuple[str, Schema]:
    return _BASH, {
        "type": "object",
        "properties": {
            "command": _string(
                "The bash command to run. Required unless the tool is being restarted."
            ),
            "restart": {
                "type": "boolean",
                "description": "Set to true to restart the bash session; otherwise leave it out.",
            },
        },
    }


# --- text editor --------------------------------------------------------------------


def _text_editor(tool: Mapping[str, Any], *, undo: bool, insert_key: str) -> tuple[str, Schema]:
    commands = ("view", "create", "str_replace", "insert") + (("undo_edit",) if undo else ())
    lines = [
        "View, create and edit text files; the files persist between calls.",
        "* `view` shows a file with line numbers (optionally only `view_range`), or lists a "
        "directory's non-hidden entries two levels deep.",
        "* `create` writes `file_text` to a new file at `path`; it cannot overwrite a file.",
        "* `str_replace` replaces `old_str`, which must occur exactly once in the file "
        "(whitespace included), with `new_str`.",
        f"* `insert` inserts `{insert_key}` after line `insert_line` (0: at the top).",
    ]
    if undo:
        lines.append("* `undo_edit` reverts the last edit made to the file at `path`.")
    limit = tool.get("max_characters")
    if limit is not None:
        lines.append(f"A view shows at most {limit} characters; use `view_range` for the rest.")
    properties: Schema = {
        "command": _commands(commands),
        "path": _string("Absolute path to the file or directory, e.g. `/repo/file.py` or `/repo`."),
        "file_text": _string("Required by `create`: the content of the new file."),
        "old_str": _string("Required by `str_replace`: the exact text to replace."),
        "new_str": _string(
            "For `str_replace`: the replacement text (empty if left out)."
            + (" Required by `insert`: the text to insert." if insert_key == "new_str" else "")
        ),
    }
    if insert_key != "new_str":
        properties[insert_key] = _string("Required by `insert`: the text to insert.")
    properties["insert_line"] = _integer(
        "Required by `insert`: the line after which the text goes (0 inserts at the top)."
    )
    properties["view_range"] = _ints(
        2,
        "Optional for `view` of a file: [start_line, end_line], numbered from 1; an end "
        "of -1 reads to the end of the file.",
    )
    return "\n".join(lines), {
        "type": "object",
        "properties": properties,
        "required": ["command", "path"],
    }


def _check_max_characters(tool: Mapping[str, Any], path: str) -> None:
    _optional_int(tool, "max_characters", path, minimum=1)


# --- memory -------------------------------------------------------------------------

_MEMORY = (
    "Your memory: files under the /memories directory that outlive this conversation. "
    "Before anything else, view /memories to recall earlier progress; as you work, record "
    "progress, decisions and findings there, since your context may be reset at any moment. "
    "Keep the directory organised: update or delete stale files."
)
_MEMORY_COMMANDS = ("view", "create", "str_replace", "insert", "delete", "rename")


def _memory(tool: Mapping[str, Any]) -> tuple[str, Schema]:
    return _MEMORY, {
        "type": "object",
        "properties": {
            "command": _commands(_MEMORY_COMMANDS),
            "path": _string(
                "The file or directory under /memories, e.g. "
                "`/memories/notes.md`; required by every command but `rename`."
            ),
            "view_range": _ints(2, "Optional for `view` of a file: [start_line, end_line]."),
            "file_text": _string("Required by `create`: the content of the file."),
            "old_str": _string("Required by `str_replace`: the exact text to replace."),
            "new_str": _string("Required by `str_replace`: the replacement text."),
            "insert_line": _integer("Required by `insert`: the line after which to insert."),
            "insert_text": _string("Required by `insert`: the text to insert."),
            "old_path": _string("Required by `rename`: the current path."),
            "new_path": _string("Required by `rename`: the new path."),
        },
        "required": ["command"],
    }


# --- computer -----------------------------------------------------------------------

_ACTIONS: Mapping[str, str] = {
    "key": "press a key or key combination (`text`, xdotool syntax: 'Return', 'ctrl+s')",
    "hold_key": "hold keys (`text`) down for `duration` seconds",
    "type": "type the string `text`",
    "cursor_position": "report the mouse cursor's (x, y) position",
    "mouse_move": "move the mouse to `coordinate`",
    "left_mouse_down": "press the left mouse button",
    "left_mouse_up": "release the left mouse button",
    "left_click": "click the left mouse button",
    "left_click_drag": "press the left button, drag to `coordinate`, release",
    "right_click": "click the right mouse button",
    "middle_click": "click the middle mouse button",
    "double_click": "double-click the left mouse button",
    "triple_click": "triple-click the left mouse button",
    "scroll": "turn the scroll wheel `scroll_amount` clicks towards `scroll_direction`",
    "wait": "wait `duration` seconds",
    "screenshot": "take a screenshot of the screen",
    "zoom": "view `region` of the screen at full resolution",
}
_ACTIONS_20241022 = (
    "key",
    "type",
    "mouse_move",
    "left_click",
    "left_click_drag",
    "right_click",
    "middle_click",
    "double_click",
    "screenshot",
    "cursor_position",
)
_ACTIONS_20250124 = (
    "key",
    "hold_key",
    "type",
    "cursor_position",
    "mouse_move",
    "left_mouse_down",
    "left_mouse_up",
    "left_click",
    "left_click_drag",
    "right_click",
    "middle_click",
    "double_click",
    "triple_click",
    "scroll",
    "wait",
    "screenshot",
)


def _computer(tool: Mapping[str, Any], *, version: int) -> tuple[str, Schema]:
    actions = _ACTIONS_20241022 if version == 20241022 else _ACTIONS_20250124
    if version >= 20251124 and tool.get("enable_zoom") is True:
        actions = (*actions, "zoom")
    screen = f"{tool['display_width_px']}x{tool['display_height_px']} pixels"
    if tool.get("display_number") is not None:
        screen += f" (X11 display :{tool['display_number']})"
    description = (
        f"Use a mouse and keyboard to interact with a computer's screen of {screen}, and take "
        "screenshots. Coordinates are (x, y) pixels from the top-left corner. Take a "
        "screenshot before acting, and check the result of every action with another."
    )
    if version == 20241022:
        coordinate = (
            "(x, y): required by `mouse_move` and `left_click_drag` (where to); "
            "clicks act where the mouse is, so move it first."
        )
        text = "Required by `key` and `type`."
    else:
        coordinate = (
            "(x, y): required by `mouse_move` and `left_click_drag` (where to); "
            "optional for clicks and `scroll` (where to act)."
        )
        text = (
            "Required by `key`, `hold_key` and `type`; for clicks and `scroll`, keys to "
            "hold down meanwhile."
        )
    properties: Schema = {
        "action": {
            "type": "string",
            "enum": list(actions),
            "description": "The action: "
            + "; ".join(f"`{a}`: {_ACTIONS[a]}" for a in actions)
            + ".",
        },
        "coordinate": _ints(2, coordinate),
        "text": _string(text),
    }
    if version != 20241022:
        properties["start_coordinate"] = _ints(2, "(x, y): where `left_click_drag` starts.")
        properties["scroll_direction"] = {
            "type": "string",
            "enum": ["up", "down", "left", "right"],
            "description": "Required by `scroll`.",
        }
        properties["scroll_amount"] = _integer(
            "Required by `scroll`: how many clicks of the scroll wheel."
        )
        properties["duration"] = {
            "type": "number",
            "description": "Required by `hold_key` and `wait`: seconds.",
        }
    if "zoom" in actions:
        properties["region"] = _ints(
            4,
            "Required by `zoom`: [x1, y1, x2, y2], the top-left "
            "and bottom-right corners of the area to view.",
        )
    return description, {"type": "object", "properties": properties, "required": ["action"]}


def _check_computer(tool: Mapping[str, Any], path: str) -> None:
    for key in ("display_width_px", "display_height_px"):
        if tool.get(key) is None:
            raise fail(f"{path}.{key}", "Field required")
        _optional_int(tool, key, path, minimum=1)
    _optional_int(tool, "display_number", path, minimum=0)
    zoom = tool.get("enable_zoom")
    if zoom is not None and not isinstance(zoom, bool):
        raise fail(f"{path}.enable_zoom", "Input should be a valid boolean")


def _optional_int(tool: Mapping[str, Any], key: str, path: str, *, minimum: int) -> None:
    value = tool.get(key)
    if value is not None:
        check_int(value, f"{path}.{key}", minimum=minimum)


# --- THE table ----------------------------------------------------------------------

_OLD_EDITOR = partial(_text_editor, undo=True, insert_key="new_str")
_NEW_EDITOR = partial(_text_editor, undo=False, insert_key="insert_text")

CLIENT_TOOLS: Mapping[str, ClientTool] = {
    "bash_20241022": ClientTool("bash", _bash),
    "bash_20250124": ClientTool("bash", _bash),
    "text_editor_20241022": ClientTool("str_replace_editor", _OLD_EDITOR),
    "text_editor_20250124": ClientTool("str_replace_editor", _OLD_EDITOR),
    "text_editor_20250429": ClientTool("str_replace_based_edit_tool", _NEW_EDITOR),
    "text_editor_20250728": ClientTool(
        "str_replace_based_edit_tool", _NEW_EDITOR, _check_max_characters
    ),
    "memory_20250818": ClientTool("memory", _memory),
    "computer_20241022": ClientTool(
        "computer", partial(_computer, version=20241022), _check_computer
    ),
    "computer_20250124": ClientTool(
        "computer", partial(_computer, version=20250124), _check_computer
    ),
    "computer_20251124": ClientTool(
        "computer", partial(_computer, version=20251124), _check_computer
    ),
}
_CLIENT_FAMILIES: Mapping[str, tuple[str, ...]] = {
    family: tuple(t for t in CLIENT_TOOLS if t.rsplit("_", 1)[0] == family)
    for family in {t.rsplit("_", 1)[0] for t in CLIENT_TOOLS}
}


def _refusal(kind: Any) -> str:
    """Why a tool type that is neither custom nor a known client tool is refused."""
    if not isinstance(kind, str):
        return "unknown tool type"
    if kind in _SERVER_TYPES:
        return _SERVER_TOOL.format(kind)
    versioned = _VERSIONED.fullmatch(kind)
    if versioned is None:  # not echoed: it may be anything, of any size
        return "unknown tool type"
    family = versioned.group(1)
    if family in _SERVER_FAMILIES:
        return _SERVER_TOOL.format(kind)
    if family in _TOOLSETS:
        return f"'{echo(kind)}' is not supported by this gateway; {_TOOLSETS[family]}"
    if family in _CLIENT_FAMILIES:
        known = ", ".join(f"'{t}'" for t in _CLIENT_FAMILIES[family])
        return f"unknown tool type '{echo(kind)}'; this gateway knows {known}"
    return f"unknown tool type '{echo(kind)}'"


def check_client_tool(tool: Mapping[str, Any], path: str) -> str:
    """Validate a non-custom tool definition at ``path``; return its name.

    Raises InvalidRequest naming ``{path}.type`` for a server tool or an unknown type, and
    ``{path}.name`` (or the config field) for a client tool defined wrongly.
    """
    kind = tool.get("type")
    spec = CLIENT_TOOLS.get(kind) if isinstance(kind, str) else None
    if spec is None:
        raise fail(f"{path}.type", _refusal(kind))
    name = tool.get("name")
    if name is None:
        raise fail(f"{path}.name", "Field required")
    if name != spec.name:
        raise fail(f"{path}.name", f"Input should be '{spec.name}'")
    spec.check(tool, path)
    return spec.name


def to_function(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI ``function`` object for a validated client tool (its name kept)."""
    spec = CLIENT_TOOLS[tool["type"]]
    description, parameters = spec.build(tool)
    return {"name": spec.name, "description": description, "parameters": parameters}
