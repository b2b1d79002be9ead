"""Per-turn controls on ``role: "system"`` turns: ``output_config`` and ``clear_at`` (pure).

Protocol facts relied on (the Python SDK 2.15 beta request types,
``anthropic/types/beta/beta_system_message_param.py`` and
``beta_system_message_output_config_param.py``; beta ``per-turn-control-2026-07-01``):

- A ``system`` turn may carry ``output_config`` whose fields (``effort``) "apply per-turn";
  ``format`` "remains top-level only". An empty ``{}`` is accepted on a turn that carries
  content; a turn with neither content nor ``output_config`` fields is rejected.
- ``content`` is optional on such a turn. Claude Code 2.1.332 sends
  ``{"role":"system","content":[],"output_config":{"effort":"medium"}}`` after the last user
  turn after ``/compact``, and with ``--bare`` on every request: a *control entry*.
- ``clear_at``: ``"never"`` (the default) shows the turn's text on every request that
  includes it; ``"next_user_message"`` shows it only for the user turn it follows: once a
  later ``role: "user"`` message exists, the turn stays in the array but is not shown.

Gateway decisions:

- A turn's ``output_config`` is in force for the turn it belongs to: until a later user
  message that is more than tool results (a new prompt, not the same agentic loop going
  on). The latest one in force is merged over the top-level ``output_config``, its keys
  winning; that is the output_config the upstream request is built from.
- A control entry carries nothing to show: it is never sent upstream (nor is any blank
  system turn, :mod:`.to_chat`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["CLEAR_AT", "has_fields", "hidden_turns", "is_control_entry", "output_config"]

CLEAR_AT = ("next_user_message", "never")


def has_fields(config: Any) -> bool:
    """An ``output_config`` object with at least one field set (null counts as absent)."""
    return isinstance(config, Mapping) and any(v is not None for v in config.values())


def is_control_entry(turn: Mapping[str, Any]) -> bool:
    """A system turn with no content that carries ``output_config`` fields."""
    content = turn.get("content")
    return (
        turn.get("role") == "system"
        and content in (None, "", [])
        and has_fields(turn.get("output_config"))
    )


def _new_prompt(turn: Mapping[str, Any]) -> bool:
    """A user turn that is more than tool results starts a new turn of the conversation."""
    if turn["role"] != "user":
        return False
    content = turn["content"]
    if isinstance(content, str) or not content:
        return True
    return any(block["type"] != "tool_result" for block in content)


def output_config(req: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The output_config in force for the reply: the top-level one with the current turn's
    per-turn fields over it (``req`` must be validated)."""
    top = req.get("output_config")
    turns = req["messages"]
    for turn in turns:
        if turn["role"] == "system":
            break
    else:  # per-turn fields are a system turn's: none, the top-level one is in force
        return top
    per_turn: dict[str, Any] = {}
    for turn in turns:
        if _new_prompt(turn):
            per_turn = {}
        elif turn["role"] == "system" and has_fields(turn.get("output_config")):
            per_turn.update((k, v) for k, v in turn["output_config"].items() if v is not None)
    if not per_turn:
        return top
    return {**(top or {}), **per_turn}


_NONE: frozenset[int] = frozenset()


def hidden_turns(messages: Sequence[Mapping[str, Any]]) -> frozenset[int]:
    """Indexes of system turns with ``clear_at: "next_user_message"`` that a later user
    message has cleared."""
    last_user = -1
    system = False
    for i, turn in enumerate(messages):
        role = turn["role"]
        if role == "user":
            last_user = i
        elif role == "system":
            system = True
    if not system:  # the usual conversation: no system turn to hide
        return _NONE
    return frozenset(
        i
        for i, turn in enumerate(messages[:last_user])
        if turn["role"] == "system" and turn.get("clear_at") == "next_user_message"
    )
