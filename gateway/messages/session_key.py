"""The session key of a Messages request: which requests belong together on one replica.

Claude Code names its session in the ``x-claude-code-session-id`` header; the SDKs' callers
may name a user in ``metadata.user_id`` (Claude Code's holds its session too). Without
either, the conversation's stable prefix stands for the session: the system prompt and the
first user message, which every later turn of the conversation repeats unchanged (the part
of the prompt an engine's prefix cache holds). The key is opaque to the upstream layer
(gateway/upstream/replicas.py hashes it); it is never a label or a log field.
"""

from __future__ import annotations

import hashlib
from typing import Any

from gateway.text import jsonutil

SESSION_HEADER = "x-claude-code-session-id"


def session_key(header: str | None, req: dict[str, Any]) -> str:
    """``header`` (the client's session header), else ``metadata.user_id``, else the hash
    of the stable prefix (:func:`prefix_key`)."""
    if header:
        return "h:" + header
    metadata = req.get("metadata")
    if isinstance(metadata, dict):
        user_id = metadata.get("user_id")
        if isinstance(user_id, str) and user_id:
            return "u:" + user_id
    return prefix_key(req.get("system"), req.get("messages") or ())


def prefix_key(system: Any, messages: Any) -> str:
    """A hash of the system prompt and the first user message (its content as sent)."""
    first = next(
        (m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"),
        None,
    )
    digest = hashlib.blake2b(jsonutil.dumpb([system, first]), digest_size=16).hexdigest()
    return "p:" + digest
