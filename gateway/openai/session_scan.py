"""The session key of a pass-through request (see gateway/messages/session_key.py).

The client's ``x-claude-code-session-id`` header, else OpenAI's ``user`` field, else the
stable prefix of a chat: its leading system (or developer) messages and first user message.
Other bodies (completions, embeddings, responses) without either go to the least busy
replica (None).
"""

from __future__ import annotations

import hashlib
from typing import Any

from gateway.text import jsonutil


def session_key(header: str | None, body: dict[str, Any]) -> str | None:
    if header:
        return "h:" + header
    user = body.get("user")
    if isinstance(user, str) and user:
        return "u:" + user
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    prefix: list[Any] = []
    for m in messages:
        if not isinstance(m, dict):
            break
        prefix.append(m.get("content"))
        if m.get("role") == "user":
            break
    return "p:" + hashlib.blake2b(jsonutil.dumpb(prefix), digest_size=16).hexdigest()
