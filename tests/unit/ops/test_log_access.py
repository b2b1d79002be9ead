"""The access line (gateway/ops/log.py ``access``): the usual line is spliced into a template,
and it is byte for byte the JSON of its fields in order, as every other line is encoded."""

from __future__ import annotations

import io
import re

import pytest

from gateway.ops import log
from gateway.text import jsonutil

_TIMESTAMP = re.compile(rb'"timestamp":"[^"]*"')

BASE = {
    "request_id": "req_0123456789abcdefghij",
    "route": "messages",
    "status": 200,
    "method": "POST",
    "model": "bench:16:0",
    "upstream": "stub",
    "duration_ms": 1.234,
    "stream": False,
}


_ORDER = (
    "request_id",
    "route",
    "status",
    "method",
    "model",
    "upstream",
    "duration_ms",
    "stream",
    "query",
    "error_type",
    "error",
)


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"stream": True, "status": 499},
        {"model": None, "upstream": None, "method": None},
        {"query": "beta&x", "error_type": "invalid_request_error", "error": 'a "quoted" \\ x'},
        {"model": "модель/ü 🙂", "error": "line\nbreak\ttab \u2028", "request_id": "a/b"},
        {"model": "m" * 200},  # long: not kept, encoded each time
        {"duration_ms": 0.0},
        {"duration_ms": 0.001},
        {"duration_ms": 123456789.125},
        {"duration_ms": 1.5},
        {"duration_ms": 100.0},
        {"duration_ms": 12.34},
        {"duration_ms": 0.05},
        {"duration_ms": 7.007},
        {"duration_ms": 1e16},
        {"extra": {"batch_id": "msgbatch_1", "attempt": 2}},
        {"extra": {"status": 201}},  # an extra field replaces one in its place
    ],
    ids=lambda c: ",".join(c) or "usual",
)
def test_an_access_line_is_its_fields_json(
    change: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = log.Access(**{**BASE, **change})  # type: ignore[arg-type]
    out = io.BytesIO()
    monkeypatch.setattr(log, "_OUT", out)
    monkeypatch.setattr(log, "_LEVEL", 20)
    log.access(rec)
    log.access(rec)  # a second time: the kept encodings
    if not rec.extra:  # the request path's call: the fields as arguments, no record
        log.access_line(*(getattr(rec, f) for f in _ORDER))
    expected = jsonutil.dumpb(log.access_fields(rec)) + b"\n"
    lines = out.getvalue().splitlines(keepends=True)
    assert len(lines) == (2 if rec.extra else 3)
    for line in lines:
        assert _TIMESTAMP.sub(b"", line) == _TIMESTAMP.sub(b"", expected)


@pytest.mark.parametrize(("level", "written"), [(10, True), (20, True), (30, False)])
def test_access_lines_follow_the_level(
    level: int, written: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = io.BytesIO()
    monkeypatch.setattr(log, "_OUT", out)
    monkeypatch.setattr(log, "_LEVEL", level)
    assert log.logs_access() is written
    log.access_line(*(BASE.get(f) for f in _ORDER))  # type: ignore[arg-type]
    log.access(log.Access(**BASE))  # type: ignore[arg-type]
    assert len(out.getvalue().splitlines()) == (2 if written else 0)
