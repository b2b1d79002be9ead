"""The RESP2 reader's table (gateway/tenancy/resp.py): every reply type, an incomplete reply
waits for more bytes, and everything outside RESP2 or its bounds is a protocol error. And the
store errors' log line: at most one a second, with the count since the last."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from gateway.ops import config
from gateway.ops.metrics import Metrics
from gateway.tenancy.resp import MAX_BULK, MAX_ITEMS, RedisError, StoreFailed, encode, parse
from gateway.tenancy.store_errors import StoreErrors
from tests.config_cases import GOOD

WHOLE: list[tuple[bytes, Any]] = [
    (b"+OK\r\n", b"OK"),
    (b":42\r\n", 42),
    (b":-3\r\n", -3),
    (b"$5\r\nhello\r\n", b"hello"),
    (b"$0\r\n\r\n", b""),
    (b"$-1\r\n", None),
    (b"*-1\r\n", None),
    (b"*0\r\n", []),
    (b"*3\r\n:1\r\n$3\r\n0.5\r\n$-1\r\n", [1, b"0.5", None]),
    (b"*2\r\n*1\r\n:1\r\n+x\r\n", [[1], b"x"]),
]


@pytest.mark.parametrize(("wire", "want"), WHOLE)
def test_a_whole_reply_is_read_and_a_cut_one_waits(wire: bytes, want: Any) -> None:
    assert parse(bytearray(wire + b":7\r\n")) == (want, len(wire))
    for cut in range(len(wire)):
        assert parse(bytearray(wire[:cut])) is None, cut


def test_an_error_reply_keeps_its_code_only() -> None:
    got = parse(bytearray(b"-NOSCRIPT No matching script. Please use EVAL.\r\n"))
    assert got is not None and isinstance(got[0], RedisError) and got[0].code == "NOSCRIPT"
    got = parse(bytearray(b"-" + b"A" * 500 + b" secret\r\n"))
    assert got is not None and isinstance(got[0], RedisError) and len(got[0].code) == 32


BAD = [
    b"hello\r\n",
    b"HTTP/1.1 200 OK\r\n",
    b":12a\r\n",
    b":\r\n",
    b":" + b"9" * 30 + b"\r\n",
    b"$%d\r\n" % (MAX_BULK + 1),
    b"$-2\r\n",
    b"$3\r\nabcd\r\n",
    b"*%d\r\n" % (MAX_ITEMS + 1),
    b"*1\r\n*1\r\n*1\r\n:1\r\n",  # nested deeper than two
    b"+" + b"a" * (MAX_BULK + 10),  # a line that never ends
]


@pytest.mark.parametrize("wire", BAD)
def test_anything_outside_resp2_or_its_bounds_is_refused(wire: bytes) -> None:
    with pytest.raises(Exception) as got:
        parse(bytearray(wire))
    assert type(got.value).__name__ == "_ProtocolError"


def test_a_request_is_an_array_of_bulk_strings() -> None:
    assert encode("EVALSHA", b"ab", 2, 0.5) == (
        b"*4\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n2\r\n$3\r\n0.5\r\n"
    )


def test_store_errors_are_counted_each_and_logged_once_a_second() -> None:
    registry = CollectorRegistry()
    clock = [100.0]
    errors = StoreErrors(Metrics(registry).limits_store_errors, "open", lambda: clock[0])
    with capture_logs() as logs:
        for t, kind in [(100.0, "connection"), (100.2, "connection"), (100.9, "timeout")]:
            clock[0] = t
            errors.failed(StoreFailed(kind, "x"))
        clock[0] = 101.0
        errors.failed(StoreFailed("reply", "NOAUTH"))
        clock[0] = 101.5
        errors.failed(StoreFailed("reply", "NOAUTH"))
    lines = [(e["kind"], e["count"], e["on_store_error"]) for e in logs]
    assert lines == [("connection", 1, "open"), ("reply", 3, "open")]
    name = "llm_gateway_limits_store_errors_total"
    got = {
        k: registry.get_sample_value(name, {"kind": k}) for k in ("connection", "timeout", "reply")
    }
    assert got == {"connection": 2.0, "timeout": 1.0, "reply": 2.0}


def test_a_bad_redis_url_is_a_config_error_without_the_url(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text(GOOD + '\n[limits]\nredis_url_env = "RURL"\n')
    for url in ("redis://:pw-secret@127.0.0.1:99999/0", "redis://:pw-secret@10.1.2.3/x"):
        with pytest.raises(config.ConfigError) as got:
            config.load(str(path), {"RURL": url})
        assert "pw-secret" not in str(got.value) and "10.1.2.3" not in str(got.value)
    cfg = config.load(str(path), {"RURL": "redis://:pw-secret@10.1.2.3:6380/4"})
    assert cfg.limits.redis_url.endswith("/4")
