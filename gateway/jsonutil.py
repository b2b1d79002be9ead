"""The one place JSON is encoded and decoded.

ujson with its flags pinned so that golden bytes are stable: non-ASCII is
written as UTF-8 (``ensure_ascii=False``), ``/`` is not escaped, and NaN or
Infinity are refused both ways for client input (they are not JSON, and strict
clients choke on them); :func:`loads_upstream` skips that re-check on the hot
path. ujson accepts ``NaN``/``Infinity`` literals and overflowing numbers
such as ``1e400`` when decoding; :func:`loads` re-checks with the standard
library only when the raw text could hold one of those, so the common path
stays a single ujson call.
"""

from __future__ import annotations

import json
import re
from typing import Any

import ujson

__all__ = ["JSONError", "dumpb", "dumps", "loads", "loads_upstream"]

JSONError = ValueError

_SUSPECT = re.compile(rb"NaN|Infinity|[0-9][eE][+-]?[0-9]{3}")


def dumps(obj: Any) -> str:
    return ujson.dumps(obj, ensure_ascii=False, escape_forward_slashes=False, allow_nan=False)


def dumpb(obj: Any) -> bytes:
    return ujson.dumps(
        obj, ensure_ascii=False, escape_forward_slashes=False, allow_nan=False
    ).encode()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("number out of range")
    return value


def loads(data: bytes | str) -> Any:
    """Decode strict JSON; raises ValueError on anything that is not."""
    try:
        value = ujson.loads(data)
    except (ValueError, OverflowError) as exc:  # ujson.JSONDecodeError is a ValueError
        raise ValueError(str(exc)) from None
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
    if _SUSPECT.search(raw):
        json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    return value


def loads_upstream(data: bytes | str) -> Any:
    """Decode an upstream payload (hot path: one per stream chunk).

    No NaN/Infinity re-check: the gateway only copies strings and integers out of
    upstream JSON, and anything it re-encodes goes through ``allow_nan=False``.
    """
    try:
        return ujson.loads(data)
    except (ValueError, OverflowError) as exc:
        raise ValueError(str(exc)) from None
