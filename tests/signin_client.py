"""The device flow as Claude Code's side runs it, for the sign-in tests: ask for a device
code, poll the token endpoint once."""

from __future__ import annotations

import json
from typing import Any

from tests.procs import form_post

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


def device(base: str) -> dict[str, Any]:
    """``{base}/llm/oauth/device_authorization``'s answer (the gateway's prefix is /llm)."""
    status, _, body = form_post(f"{base}/llm/oauth/device_authorization", {"surface": "test"})
    assert status == 200, body
    return json.loads(body)  # type: ignore[no-any-return]


def poll(base: str, device_code: str) -> tuple[int, dict[str, Any]]:
    status, _, body = form_post(
        f"{base}/llm/oauth/token", {"grant_type": DEVICE_GRANT, "device_code": device_code}
    )
    return status, json.loads(body)
