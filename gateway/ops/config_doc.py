"""The configuration reference page, generated from the schema (gateway/ops/config_schema.py).

    python -m gateway.ops.config_doc > docs/configuration.md

One section per table, one row per key (type, default, allowed values or bounds, its
description); the keys marked ``advanced`` (internals exposed as knobs) in a part of their own;
then the key names that mean different things in different tables, side by side.
tests/unit/ops/test_config_doc.py holds the committed page equal to :func:`render`'s output.
"""

from __future__ import annotations

import sys
from collections import defaultdict

from gateway.ops.config_knob import Knob, _toml, knobs
from gateway.ops.config_schema import TABLES

COMMAND = "python -m gateway.ops.config_doc > docs/configuration.md"
_TYPE_NAMES = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array of strings",
}
_HEADER = "| Key | Type | Default | Allowed | Description |\n|---|---|---|---|---|\n"


def render() -> str:
    """The whole page, Markdown."""
    parts = [_intro()]
    advanced: list[tuple[str, Knob]] = []
    for table, cls in TABLES.items():
        rows = [k for k in knobs(cls).values() if not k.advanced]
        advanced += [(_path(table, k.name), k) for k in knobs(cls).values() if k.advanced]
        summary = (cls.__doc__ or "").strip().splitlines()[0].replace("``", "`")
        summary = summary.split(": ", 1)[1] if summary.startswith("`[") else summary
        parts.append(
            f"## `{_heading(table)}`\n\n{summary[:1].upper()}{summary[1:]}\n\n"
            + _HEADER
            + "".join(_row(f"`{k.name}`", k) for k in rows)
        )
        apart = [k.name for k in knobs(cls).values() if k.advanced]
        if apart:
            parts[-1] += (
                "\nAdvanced: "
                + ", ".join(f"`{n}`" for n in apart)
                + " (see [Advanced](#advanced-internals)).\n"
            )
    parts.append(
        "## Advanced (internals)\n\n"
        "Internals exposed as knobs: they keep working, but the defaults suit every "
        "deployment measured so far; change one only to follow a measurement.\n\n"
        + _HEADER
        + "".join(_row(f"`{path}`", k) for path, k in advanced)
    )
    parts.append(_two_meanings())
    return "\n".join(parts)


def _intro() -> str:
    return (
        "# Configuration reference\n\n"
        f"<!-- Generated from gateway/ops/config_schema.py by `{COMMAND}`; "
        "do not edit by hand. -->\n\n"
        "The gateway reads one TOML file: `--config FILE`, else `$GATEWAY_CONFIG`, else a "
        "built-in default (two upstreams on 127.0.0.1). `llm-gateway --check-config` loads it "
        "and exits. Every key is checked at start (and on SIGHUP) against what this page "
        "lists: an unknown key, a missing required key, a wrong type, or a value outside its "
        "set or bounds stops the start with one line naming the file and the key, e.g. "
        "`gateway.toml: upstreams.vllm.idle_timeout: must be > 0, got -1.0`. Rules that "
        "relate keys to one another (a model's `upstream` names a configured upstream, "
        "`base_url` or `base_urls` but not both, ...) are checked after.\n\n"
        "`NAME` is an upstream's name, chosen freely. `unset` means no value (the key's "
        "feature is off or takes the value described). Bounds are inclusive unless written "
        "`>` (so `> 0` refuses 0); `a..b` includes both ends.\n"
        "See also `deploy/gateway.example.toml`, an example with every key and a comment.\n"
    )


def _heading(table: str) -> str:
    """``upstreams.<name>`` -> ``[upstreams.NAME]``; ``models[]`` -> ``[[models]]``."""
    if table.endswith("[]"):
        return f"[[{table[:-2]}]]"
    return f"[{table.replace('<name>', 'NAME')}]"


def _path(table: str, name: str) -> str:
    """A key's full name as the descriptions write it: ``upstreams.NAME.idle_timeout``."""
    return f"{table.replace('<name>', 'NAME')}.{name}"


def _row(key: str, knob: Knob) -> str:
    cells = (
        key,
        " or ".join(_TYPE_NAMES[t] for t in knob.types if t is not int or float not in knob.types),
        _default(knob),
        knob.allowed(),
        knob.doc,
    )
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |\n"


def _default(knob: Knob) -> str:
    if knob.shown is not None:
        return knob.shown
    if knob.required:
        return "required"
    return "unset" if knob.default is None else f"`{_toml(knob.default)}`"


def _two_meanings() -> str:
    """Key names that stand in more than one table, each meaning beside the other."""
    where: dict[str, list[tuple[str, Knob]]] = defaultdict(list)
    for table, cls in TABLES.items():
        for name, knob in knobs(cls).items():
            where[name].append((_path(table, name), knob))
    rows = "".join(
        f"| `{name}` | `{path}` | {knob.doc} |\n"
        for name, places in where.items()
        if len(places) > 1
        for path, knob in places
    )
    return (
        "## Names with two meanings\n\n"
        "The same key name in two tables means two different things:\n\n"
        "| Name | Key | Meaning |\n|---|---|---|\n" + rows
    )


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
