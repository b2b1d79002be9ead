"""Ids the gateway makes: request ids (``req_``), message ids (``msg_``) and tool-use ids
(``toolu_``), each a prefix and 24 random base62 characters, shaped like Anthropic's.

An upstream's tool-call id is kept when it is a safe token (Anthropic's clients send it
back as ``tool_use_id``; the upstream then sees its own id again); anything else is
replaced by a new one.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# Random bytes mapped onto base62 with one translate() call (a ~1 us id, where 24
# secrets.choice calls cost ~30 us). 256 % 62 leaves a small bias, harmless for ids.
_TO_B62 = bytes(ord(_B62[b % 62]) for b in range(256))


def b62(n: int) -> str:
    """n random base62 characters."""
    return secrets.token_bytes(n).translate(_TO_B62).decode("ascii")


def new_request_id() -> str:
    """A request's id when the client sent no usable ``x-request-id``."""
    return "req_" + b62(24)


def new_message_id() -> str:
    return "msg_" + b62(24)


def new_tool_use_id() -> str:
    return "toolu_" + b62(24)


_SAFE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def tool_use_id(upstream_id: Any) -> str:
    """Keep an upstream tool-call id when it is a safe token, else make one."""
    if isinstance(upstream_id, str) and _SAFE_ID.fullmatch(upstream_id):
        return upstream_id
    return new_tool_use_id()
