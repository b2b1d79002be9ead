"""jsonutil.dumpb_str: the stream's string encoder writes exactly what dumpb writes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.text import jsonutil

CASES = ["", " alpha", "quote \" and backslash \\", "tab\tnew\nline\r", "\x00\x1f\x7f",
         "slash / and </script>", "ünïcødé ✓ 思考 😀", "\u2028\u2029", "\ufeff\uffff"]


@pytest.mark.parametrize("text", CASES)
def test_same_bytes_as_dumpb(text: str) -> None:
    assert jsonutil.dumpb_str(text) == jsonutil.dumpb(text)
    assert jsonutil.loads(jsonutil.dumpb_str(text)) == text


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0x10FFFF, exclude_categories=["Cs"])))
def test_same_bytes_for_any_text(text: str) -> None:
    assert jsonutil.dumpb_str(text) == jsonutil.dumpb(text)


@pytest.mark.parametrize("text", ["\ud800", "a\udfffb"])
def test_a_lone_surrogate_raises_as_dumpb_does(text: str) -> None:
    with pytest.raises(UnicodeEncodeError):
        jsonutil.dumpb(text)
    with pytest.raises(UnicodeEncodeError):
        jsonutil.dumpb_str(text)
