"""jsonutil.dumpb_str: the stream's string encoder writes exactly what dumpb writes."""

from __future__ import annotations

import gc
import sys
import threading
from typing import Any

import pytest
import ujson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.text import jsonutil

CASES = [
    "",
    " alpha",
    'quote " and backslash \\',
    "tab\tnew\nline\r",
    "\x00\x1f\x7f",
    "slash / and </script>",
    "ünïcødé ✓ 思考 😀",
    "\u2028\u2029",
    "\ufeff\uffff",
]


@pytest.mark.parametrize("text", CASES)
def test_same_bytes_as_dumpb(text: str) -> None:
    assert jsonutil.dumpb_str(text) == jsonutil.dumpb(text)
    assert jsonutil.loads(jsonutil.dumpb_str(text)) == text


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0x10FFFF, exclude_categories=["Cs"])))
def test_same_bytes_for_any_text(text: str) -> None:
    assert jsonutil.dumpb_str(text) == jsonutil.dumpb(text)


@pytest.mark.parametrize(
    "value",
    [
        {"z": "ünï / </script> <&>", "a": [1, 2.5, None, True, {"k": "\u2028"}], "": {}},
        ["slash / ", 1e300, -0.0, 2**63, "😀"],
        "plain",
    ],
)
def test_the_flags_by_position_are_the_keywords(value: Any) -> None:
    """dumps gives ujson its flags by position: they must mean the keywords they stand for
    (a ujson that moved them would fail here)."""
    want = ujson.dumps(value, ensure_ascii=False, escape_forward_slashes=False, allow_nan=False)
    assert jsonutil.dumps(value) == want
    assert jsonutil.dumpb(value) == want.encode()


@pytest.mark.parametrize("value", [float("nan"), [float("inf")], b"bytes"])
def test_what_the_keywords_refuse_the_flags_refuse(value: Any) -> None:
    with pytest.raises((OverflowError, TypeError)) as kw:
        ujson.dumps(value, ensure_ascii=False, escape_forward_slashes=False, allow_nan=False)
    with pytest.raises(kw.type):
        jsonutil.dumpb(value)


@pytest.mark.parametrize("text", ["\ud800", "a\udfffb"])
def test_a_lone_surrogate_raises_as_dumpb_does(text: str) -> None:
    with pytest.raises(UnicodeEncodeError):
        jsonutil.dumpb(text)
    with pytest.raises(UnicodeEncodeError):
        jsonutil.dumpb_str(text)


def test_interleaved_decodes_in_threads_restore_the_interpreters_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two decodes overlapping in two threads (a big web search answer is decoded in one
    while a request body is decoded on the loop), the first ending first: the digit limit
    and the collector are what they were before either began, and lowered while either
    runs."""
    inside = {name: threading.Event() for name in ("a", "b")}
    go = {name: threading.Event() for name in ("a", "b")}
    seen: dict[str, int] = {}

    def fake_loads(data: str) -> Any:  # holds the decode open until released
        name = data[0]
        inside[name].set()
        assert go[name].wait(10)
        seen[name] = sys.get_int_max_str_digits()
        return []

    monkeypatch.setattr(jsonutil.ujson, "loads", fake_loads)
    before = (sys.get_int_max_str_digits(), gc.isenabled())
    threads = {
        name: threading.Thread(target=jsonutil.loads, args=(name * 700,)) for name in ("a", "b")
    }
    threads["a"].start()
    assert inside["a"].wait(10)
    threads["b"].start()
    assert inside["b"].wait(10)
    go["a"].set()
    threads["a"].join(10)
    go["b"].set()
    threads["b"].join(10)
    assert seen == {"a": 640, "b": 640}
    assert (sys.get_int_max_str_digits(), gc.isenabled()) == before


# (a body, what it decodes to or the error's text): a body of at most 640 bytes is decoded
# without lowering the digit limit (no number in it can pass it), a longer one with it
DIGIT_BODIES = [
    (b"9" * 640, int("9" * 640)),
    (b"[" + b"9" * 638 + b"]", [int("9" * 638)]),
    (b"[" + b"9" * 641 + b"]", "a number has more than 640 digits"),
    (b'{"a":' + b"1" * 639 + b"}", {"a": int("1" * 639)}),  # 645 bytes: the long path
    (b'{"a":' + b"1" * 641 + b"}", "a number has more than 640 digits"),
    (b'{"a": 1, "b": [2.5, "x"]}', {"a": 1, "b": [2.5, "x"]}),
    (b'{"a": NaN}', "a: "),
    (b"[" * 10 + b"]", "Unexpected character"),
]


@pytest.mark.parametrize(("body", "want"), DIGIT_BODIES)
def test_short_and_long_bodies_decode_alike(body: bytes, want: Any) -> None:
    before = (sys.get_int_max_str_digits(), gc.isenabled())
    if isinstance(want, str):
        with pytest.raises(ValueError, match=want):
            jsonutil.loads(body)
    else:
        assert jsonutil.loads(body) == want
    assert (sys.get_int_max_str_digits(), gc.isenabled()) == before


# (what an upstream sent, what the gateway writes again): NaN, infinities and lone
# surrogates, which ujson reads and dumpb refuses, anywhere in the value
UPSTREAM_VALUES = [
    (b'{"error":{"code":NaN,"message":"boom"}}', b'{"error":{"code":null,"message":"boom"}}'),
    (
        b'{"a":[1,Infinity,-Infinity,1e400,{"b":NaN}],"c":2.5}',
        b'{"a":[1,null,null,null,{"b":null}],"c":2.5}',
    ),
    (b'{"m":"x\\ud800y","\\udc00":1}', '{"m":"x\ufffdy","\ufffd":1}'.encode()),
    (b"[" * 1000 + b"NaN" + b"]" * 1000, b"[" * 1000 + b"null" + b"]" * 1000),  # no recursion
    (b'{"ok":[1,"two",true,null,{"x":1.5}]}', b'{"ok":[1,"two",true,null,{"x":1.5}]}'),
]


@pytest.mark.parametrize(
    ("raw", "written"),
    UPSTREAM_VALUES,
    ids=["nan_code", "infinities", "surrogates", "deep", "plain"],
)
def test_an_upstream_value_is_written_again_whatever_it_holds(raw: bytes, written: bytes) -> None:
    assert jsonutil.dumpb_upstream(jsonutil.loads_upstream(raw)) == written
