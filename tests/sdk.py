"""Official Python SDK clients for tests, closed after each test (no leaked sockets)."""

from __future__ import annotations

from typing import Any

import anthropic

_OPEN: list[anthropic.Anthropic] = []


def client(base_url: str, **kwargs: Any) -> anthropic.Anthropic:
    made = anthropic.Anthropic(base_url=base_url, **kwargs)
    _OPEN.append(made)
    return made


def close_all() -> None:
    while _OPEN:
        _OPEN.pop().close()
