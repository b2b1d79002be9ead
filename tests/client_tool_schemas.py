"""The documented schemas of Anthropic's client tools (bash, text editor, memory, computer),
exactly as the gateway must send each upstream as a function tool's parameters.

Shared by tests/unit/messages/test_client_tools.py (every type) and tests/e2e/test_builtin_tools.py.
"""

from __future__ import annotations

from typing import Any


def _s(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def _ints(n: int, description: str) -> dict[str, Any]:
    return {
        "type": "array",
        "items": {"type": "integer"},
        "minItems": n,
        "maxItems": n,
        "description": description,
    }


BASH = {
    "type": "object",
    "properties": {
        "command": _s("The bash command to run. Required unless the tool is being restarted."),
        "restart": {
            "type": "boolean",
            "description": "Set to true to restart the bash session; otherwise leave it out.",
        },
    },
}
_PATH = _s("Absolute path to the file or directory, e.g. `/repo/file.py` or `/repo`.")
_VIEW_RANGE = _ints(
    2,
    "Optional for `view` of a file: [start_line, end_line], numbered from 1; "
    "an end of -1 reads to the end of the file.",
)
_INSERT_LINE = {
    "type": "integer",
    "description": "Required by `insert`: the line after which "
    "the text goes (0 inserts at the top).",
}
# text_editor_20241022 / 20250124: undo_edit, and insert's text in new_str
OLD_EDITOR = {
    "type": "object",
    "properties": {
        "command": {
            "type": "string",
            "enum": ["view", "create", "str_replace", "insert", "undo_edit"],
            "description": "The command to run: view, create, str_replace, insert, undo_edit.",
        },
        "path": _PATH,
        "file_text": _s("Required by `create`: the content of the new file."),
        "old_str": _s("Required by `str_replace`: the exact text to replace."),
        "new_str": _s(
            "For `str_replace`: the replacement text (empty if left out). "
            "Required by `insert`: the text to insert."
        ),
        "insert_line": _INSERT_LINE,
        "view_range": _VIEW_RANGE,
    },
    "required": ["command", "path"],
}
# text_editor_20250429 / 20250728: no undo_edit; insert's text in insert_text (what Claude 4
# sends, anthropic-sdk-python#1155; the docs still say new_str)
NEW_EDITOR = {
    "type": "object",
    "properties": {
        "command": {
            "type": "string",
            "enum": ["view", "create", "str_replace", "insert"],
            "description": "The command to run: view, create, str_replace, insert.",
        },
        "path": _PATH,
        "file_text": _s("Required by `create`: the content of the new file."),
        "old_str": _s("Required by `str_replace`: the exact text to replace."),
        "new_str": _s("For `str_replace`: the replacement text (empty if left out)."),
        "insert_text": _s("Required by `insert`: the text to insert."),
        "insert_line": _INSERT_LINE,
        "view_range": _VIEW_RANGE,
    },
    "required": ["command", "path"],
}
MEMORY = {
    "type": "object",
    "properties": {
        "command": {
            "type": "string",
            "enum": ["view", "create", "str_replace", "insert", "delete", "rename"],
            "description": "The command to run: view, create, str_replace, insert, delete, rename.",
        },
        "path": _s(
            "The file or directory under /memories, e.g. `/memories/notes.md`; "
            "required by every command but `rename`."
        ),
        "view_range": _ints(2, "Optional for `view` of a file: [start_line, end_line]."),
        "file_text": _s("Required by `create`: the content of the file."),
        "old_str": _s("Required by `str_replace`: the exact text to replace."),
        "new_str": _s("Required by `str_replace`: the replacement text."),
        "insert_line": {
            "type": "integer",
            "description": "Required by `insert`: the line after which to insert.",
        },
        "insert_text": _s("Required by `insert`: the text to insert."),
        "old_path": _s("Required by `rename`: the current path."),
        "new_path": _s("Required by `rename`: the new path."),
    },
    "required": ["command"],
}
ACTIONS_20241022 = [
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
]
ACTIONS_20250124 = [
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
]
SCREEN = {"display_width_px": 1280, "display_height_px": 800}


def computer(actions: list[str], *, newer: bool) -> dict[str, Any]:
    """The computer schema; the action descriptions are checked apart (one per action)."""
    props: dict[str, Any] = {"action": {"type": "string", "enum": actions}}
    if not newer:
        props["coordinate"] = _ints(
            2,
            "(x, y): required by `mouse_move` and `left_click_drag` "
            "(where to); clicks act where the mouse is, so move it "
            "first.",
        )
        props["text"] = _s("Required by `key` and `type`.")
    else:
        props["coordinate"] = _ints(
            2,
            "(x, y): required by `mouse_move` and `left_click_drag` "
            "(where to); optional for clicks and `scroll` (where to "
            "act).",
        )
        props["text"] = _s(
            "Required by `key`, `hold_key` and `type`; for clicks and `scroll`, "
            "keys to hold down meanwhile."
        )
        props["start_coordinate"] = _ints(2, "(x, y): where `left_click_drag` starts.")
        props["scroll_direction"] = {
            "type": "string",
            "enum": ["up", "down", "left", "right"],
            "description": "Required by `scroll`.",
        }
        props["scroll_amount"] = {
            "type": "integer",
            "description": "Required by `scroll`: how many clicks of the scroll wheel.",
        }
        props["duration"] = {
            "type": "number",
            "description": "Required by `hold_key` and `wait`: seconds.",
        }
    if "zoom" in actions:
        props["region"] = _ints(
            4,
            "Required by `zoom`: [x1, y1, x2, y2], the top-left and "
            "bottom-right corners of the area to view.",
        )
    return {"type": "object", "properties": props, "required": ["action"]}
