"""The gateway's log as the tests read it.

The gateway writes one JSON object a line to stderr (gateway/ops/log.py): ``event`` names
the line (``access`` for the access log, with ``route`` and ``status``), ``level`` its level.
Info lines are flushed every 0.5 s, in order, so a line a test waits for is found by polling
the output (:func:`wait_for_line`). A process still running may have a last line half
written: only lines ending in a newline are read. Under systemd with the journal as stderr a
line starts with a ``<N>`` priority (:func:`parse_line` takes what follows it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.waits import wait_until

Line = dict[str, Any]


def parse_line(line: str | bytes) -> Line | None:
    """One line's object; None for a line that is not a JSON object (a library's print, a
    blank line)."""
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    text = text.strip()
    if text.startswith("<") and "{" in text:  # a journald priority prefix
        text = text[text.index("{") :]
    if not text.startswith("{"):
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def log_lines(output: str | bytes, *, strict: bool = False) -> list[Line]:
    """Every complete JSON line of ``output``, in order. ``strict``: a complete line that is
    not one JSON object fails the test (the gateway writes nothing else to stderr)."""
    text = output.decode("utf-8", "replace") if isinstance(output, bytes) else output
    complete = text.split("\n")[:-1]  # after the last newline: nothing, or a line being written
    out = []
    for raw in complete:
        doc = parse_line(raw)
        if doc is None:
            if strict and raw.strip():
                pytest.fail(f"a log line is not one JSON object: {raw[:300]!r}")
            continue
        out.append(doc)
    return out


def matching(lines: list[Line], event: str | None = None, **fields: Any) -> list[Line]:
    """The lines whose ``event`` is ``event`` (any, when None) and whose ``fields`` have these
    values."""
    return [
        ln
        for ln in lines
        if (event is None or ln.get("event") == event)
        and all(ln.get(k) == v for k, v in fields.items())
    ]


def access_lines(output: str | bytes, **fields: Any) -> list[Line]:
    """The access log's lines (``event`` ``access``) with these field values."""
    return matching(log_lines(output), "access", **fields)


def wait_for_line(
    output: Callable[[], str],
    predicate: Callable[[Line], bool],
    what: str = "the log line",
    *,
    timeout: float = 10.0,
) -> Line:
    """The first line of ``output()`` for which ``predicate`` holds, once it is written; fails
    after ``timeout`` seconds with the end of the log."""

    def found() -> Line | None:
        return next((ln for ln in log_lines(output()) if predicate(ln)), None)

    try:
        return wait_until(found, what, timeout=timeout, every=0.05)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the log ends:\n{output()[-3000:]}") from None
