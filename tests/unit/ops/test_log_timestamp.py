"""The access line's timestamp (gateway/ops/log.py): ``datetime.isoformat`` in UTC with
``Z``, the date and time made once per second."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.ops import log


@pytest.mark.parametrize(
    "ns",
    [
        1_700_000_000_000_000_000,  # a whole second: no fraction, as isoformat() has none
        1_700_000_000_123_456_789,  # microseconds kept, nanoseconds dropped
        1_700_000_000_000_001_000,  # a leading-zero fraction
        1_700_000_001_999_999_999,  # the next second (its text made again)
        1_700_000_000_500_000_000,  # back to an earlier second (a clock step)
    ],
)
def test_timestamp_spells_what_isoformat_spells(ns: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log.time, "time_ns", lambda: ns)
    expected = (
        datetime.fromtimestamp(ns // 1000 / 1e6, UTC)
        .replace(microsecond=ns // 1000 % 1_000_000)
        .isoformat()
        .replace("+00:00", "Z")
    )
    assert log._timestamp() == expected


def test_timestamp_is_now() -> None:
    stamp = datetime.fromisoformat(log._timestamp())
    assert abs((datetime.now(UTC) - stamp).total_seconds()) < 5
