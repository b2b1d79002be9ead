"""The one generic pass: a table of the config file checked against its schema.

Each key's :class:`~gateway.ops.config_knob.Knob` says what its value may be; this pass
checks, key by key: the key is known, a required key is present, the value's TOML type (and
an array's items: strings), its value set (an alias mapped to its choice first), its bounds and
its format. A refusal is one line naming the key, ``PATH: must ..., got VALUE``. Rules that
relate keys to one another stay in ``parse`` (gateway/ops/config.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.ops.config_knob import FORMATS, Knob


class ConfigError(Exception):
    """Bad configuration; the message names the file and the key."""


_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "an array of strings",
}
_SHOWN_CHARS = 80  # a value echoed in a message, at most (a 257-character name, say)


def shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def check_table(src: str, where: str, table: Any, schema: Mapping[str, Knob]) -> dict[str, Any]:
    """``table``'s keys checked against ``schema``: its values as loaded (floats as floats,
    arrays as tuples, formats' normal form), with each absent key's default."""
    if not isinstance(table, dict):
        raise ConfigError(f"{src}: {where}: must be a table")
    for key in table:
        if key not in schema:
            raise ConfigError(f"{src}: {where}.{key}: unknown key")
    out: dict[str, Any] = {}
    for key, knob in schema.items():
        if key in table:
            out[key] = check_value(src, f"{where}.{key}", table[key], knob)
        elif knob.required:
            raise ConfigError(f"{src}: {where}.{key}: missing (required)")
        else:
            out[key] = knob.default
    return out


def check_value(src: str, path: str, value: Any, knob: Knob) -> Any:
    """One value checked against its knob (type, choices, bounds, format); as loaded."""
    types = knob.types
    # bool is an int subclass; only accept it where bool is asked for
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        want = " or ".join(_TYPE_NAMES[t] for t in types)
        raise ConfigError(f"{src}: {path}: must be {want}, got {shown(value)}")
    if isinstance(value, list):
        return tuple(_item(src, f"{path}[{i}]", item, knob) for i, item in enumerate(value))
    if float in types and isinstance(value, int | float) and not isinstance(value, bool):
        value = float(value)
    if knob.choices is not None:
        value = dict(knob.aliases).get(value, value)
        if value not in knob.choices:
            raise ConfigError(f"{src}: {path}: must be {_one_of(knob)}, got {shown(value)}")
    if isinstance(value, int | float) and (problem := _out_of_bounds(value, knob)):
        raise ConfigError(f"{src}: {path}: must be {problem}, got {shown(value)}")
    if knob.fmt is not None:
        value = check_format(src, path, value, knob.fmt)
    return value


def check_format(src: str, path: str, value: str, fmt: str) -> str:
    """``value`` in the named format of FORMATS, in its normal form; else ConfigError."""
    form = FORMATS[fmt]
    try:
        return form.check(value)
    except ValueError as exc:
        got = f", got {shown(value)}" if form.echo else ""
        raise ConfigError(f"{src}: {path}: {exc}{got}") from None


def _item(src: str, path: str, item: Any, knob: Knob) -> Any:
    if not isinstance(item, str):
        raise ConfigError(f"{src}: {path}: must be a string, got {shown(item)}")
    return item if knob.fmt is None else check_format(src, path, item, knob.fmt)


def _one_of(knob: Knob) -> str:
    assert knob.choices is not None
    text = "one of " + ", ".join(map(str, knob.choices))
    if knob.aliases:
        spelled = ", ".join(f"{str(a).lower()} for {c}" for a, c in knob.aliases)
        text += f" (or {spelled})"
    return text


def _out_of_bounds(value: float, knob: Knob) -> str | None:
    """What ``value`` must be when it is outside the knob's bounds, else None."""
    low_ok = (knob.gt is None or value > knob.gt) and (knob.ge is None or value >= knob.ge)
    high_ok = knob.le is None or value <= knob.le
    if low_ok and high_ok:
        return None
    if knob.ge is not None and knob.le is not None:
        return f"{knob.ge}..{knob.le}"
    if not low_ok:
        return f"> {knob.gt}" if knob.gt is not None else f">= {knob.ge}"
    return f"at most {knob.le}"
