"""Inline <think> reasoning: the streamed pieces equal the buffered ones, at any cut."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.local.think import (
    MAX_WHITESPACE,
    MODES,
    InlineThinking,
    Phase,
    split_inline_thinking,
)

Pieces = list[tuple[bool, str]]
R, T = True, False  # is_reasoning
W = MAX_WHITESPACE

# (name, mode, content, expected pieces, orphan_close)
TABLE: list[tuple[str, str, str, Pieces, bool]] = [
    ("plain text", "auto", "Hello, world.", [(T, "Hello, world.")], False),
    ("empty", "auto", "", [], False),
    ("off keeps tags", "off", "<think>a</think>b", [(T, "<think>a</think>b")], False),
    ("off keeps orphan", "off", "a</think>b", [(T, "a</think>b")], False),
    ("tags", "auto", "<think>a</think>b", [(R, "a"), (T, "b")], False),
    (
        "newlines around tags dropped",
        "auto",
        "<think>\nI think\n</think>\n\nAnswer",
        [(R, "I think"), (T, "Answer")],
        False,
    ),
    ("crlf", "auto", "<think>\r\nx\r\n</think>\r\n\r\ny", [(R, "x"), (T, "y")], False),
    ("inner newlines kept", "auto", "<think>\na\n\nb\n</think>c", [(R, "a\n\nb"), (T, "c")], False),
    ("leading whitespace", "auto", " \n\t<think>r</think>t", [(R, "r"), (T, "t")], False),
    (
        "leading whitespace at the limit",
        "auto",
        " " * W + "<think>r</think>t",
        [(R, "r"), (T, "t")],
        False,
    ),
    # past the limit it is no opener, and the close is then an orphan
    (
        "leading whitespace past the limit",
        "auto",
        " " * (W + 1) + "<think>r</think>t",
        [(T, " " * (W + 1) + "<think>r</think>t")],
        True,
    ),
    ("leading whitespace, then text", "auto", "\n  hi", [(T, "\n  hi")], False),
    ("only whitespace", "auto", " \n ", [(T, " \n ")], False),
    ("opened", "opened", "I reason\n</think>\n\nAnswer", [(R, "I reason"), (T, "Answer")], False),
    (
        "opened, redundant opener",
        "opened",
        "\n<think>\nI reason\n</think>\n\nAnswer",
        [(R, "I reason"), (T, "Answer")],
        False,
    ),
    (
        "opened, leading whitespace",
        "opened",
        "\n\nI reason</think>A",
        [(R, "I reason"), (T, "A")],
        False,
    ),
    ("opened, no close", "opened", "still thinking\n", [(R, "still thinking\n")], False),
    ("opened, a held '<' at the end", "opened", "<", [(R, "<")], False),
    ("opened, empty", "opened", "", [], False),
    (
        "no close: out of tokens",
        "auto",
        "<think>\nout of tokens\n",
        [(R, "out of tokens\n")],
        False,
    ),
    ("no close, partial close tag kept", "auto", "<think>a\n</thi", [(R, "a\n</thi")], False),
    (
        "orphan close",
        "auto",
        "reasoning\n</think>\n\nanswer",
        [(T, "reasoning\n</think>\n\nanswer")],
        True,
    ),
    (
        "opener mid-text is text",
        "auto",
        "Use the <think> tag.",
        [(T, "Use the <think> tag.")],
        False,
    ),
    (
        "<thinking> is not the tag",
        "auto",
        "<thinking>x</thinking>",
        [(T, "<thinking>x</thinking>")],
        False,
    ),
    ("<th and another word", "auto", "<the end>", [(T, "<the end>")], False),
    ("a prefix of the tag at the end", "auto", "  <thi", [(T, "  <thi")], False),
    ("empty reasoning", "auto", "<think></think>x", [(T, "x")], False),
    ("whitespace-only reasoning", "auto", "<think>\n\n</think>\n\nx", [(T, "x")], False),
    ("opener only", "auto", "<think>", [], False),
    ("close, then nothing", "auto", "<think>a</think>\n\n", [(R, "a")], False),
    (
        "tags after the block are text, not orphans",
        "auto",
        "<think>a</think>b <think>c</think>",
        [(R, "a"), (T, "b <think>c</think>")],
        False,
    ),
    (
        "a near-close inside reasoning",
        "auto",
        "<think>a </thinking> b</think>c",
        [(R, "a </thinking> b"), (T, "c")],
        False,
    ),
    # only the last W whitespace characters before the close are dropped
    (
        "trailing whitespace past the limit",
        "auto",
        "<think>a" + "\n" * (W + 8) + "</think>b",
        [(R, "a" + "\n" * 8), (T, "b")],
        False,
    ),
    (
        "text after close keeps '<'",
        "auto",
        "<think>a</think>x < y",
        [(R, "a"), (T, "x < y")],
        False,
    ),
    (
        "unicode",
        "auto",
        "<think>\nGrüße 👋 思考\n</think>\n\n答え ✓",
        [(R, "Grüße 👋 思考"), (T, "答え ✓")],
        False,
    ),
]


def _merge(pieces: Pieces) -> Pieces:
    out: Pieces = []
    for reasoning, text in pieces:
        assert text, "no empty pieces"
        if out and out[-1][0] is reasoning:
            out[-1] = (reasoning, out[-1][1] + text)
        else:
            out.append((reasoning, text))
    return out


def _stream(chunks: list[str], mode: str) -> tuple[Pieces, bool]:
    splitter = InlineThinking(mode)
    pieces: Pieces = []
    for chunk in chunks:
        got = splitter.feed(chunk)
        assert got == _merge(got), "one feed's pieces come merged"
        pieces += got
        assert len(splitter.held) <= W + 7, "memory per stream is bounded"
    pieces += splitter.flush()
    assert splitter.phase is Phase.DONE
    return _merge(pieces), splitter.orphan_close


def _cut(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(cuts), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


CASES = pytest.mark.parametrize(
    ("mode", "text", "expected", "orphan"),
    [row[1:] for row in TABLE],
    ids=[row[0] for row in TABLE],
)


@CASES
def test_buffered(mode: str, text: str, expected: Pieces, orphan: bool) -> None:
    assert split_inline_thinking(text, mode) == expected
    assert _stream([text], mode) == (expected, orphan)


@CASES
def test_split_at_every_offset(mode: str, text: str, expected: Pieces, orphan: bool) -> None:
    for cut in range(len(text) + 1):
        assert _stream(_cut(text, [cut]), mode) == (expected, orphan), cut


@CASES
def test_one_character_chunks(mode: str, text: str, expected: Pieces, orphan: bool) -> None:
    assert _stream(list(text), mode) == (expected, orphan)


@CASES
def test_three_random_cuts(mode: str, text: str, expected: Pieces, orphan: bool) -> None:
    rng = random.Random(text)  # deterministic per case
    for _ in range(20):
        cuts = [rng.randint(0, len(text)) for _ in range(3)]
        assert _stream(_cut(text, cuts), mode) == (expected, orphan), cuts


def test_hot_path_returns_the_delta_itself() -> None:
    """A text delta after the start is resolved is passed on as is, not copied or scanned twice."""
    splitter = InlineThinking("auto")
    assert splitter.feed("Hi") == [(T, "Hi")]
    delta = "x" * 1000
    [(_, piece)] = splitter.feed(delta)
    assert piece is delta


def test_orphan_close_cut_across_deltas() -> None:
    splitter = InlineThinking("auto")
    for chunk in ["reason", "<", "/", "thi", "nk", ">", "\n\nanswer"]:
        assert splitter.feed(chunk) == [(T, chunk)], "text is released at once"
    assert splitter.orphan_close


def test_held_until_decided() -> None:
    splitter = InlineThinking("auto")
    assert splitter.feed("\n<thi") == []
    assert splitter.feed("nk>\nabc\n") == [(R, "abc")]
    assert splitter.held == "\n"
    assert splitter.feed("</th") == []
    assert splitter.feed("ink>\n") == []
    assert splitter.feed("ok") == [(T, "ok")]
    assert splitter.flush() == []


def test_feed_after_flush_is_a_bug() -> None:
    splitter = InlineThinking("auto")
    splitter.flush()
    with pytest.raises(RuntimeError):
        splitter.feed("x")
    with pytest.raises(RuntimeError):
        splitter.flush()


def test_unknown_mode() -> None:
    with pytest.raises(ValueError, match="mode"):
        InlineThinking("on")


# --- property: any chunking equals buffered, and buffered equals the documented rules ---

_WS = " \t\r\n"
FRAGMENTS = [
    "<think>",
    "</think>",
    "\n",
    "\r\n",
    " ",
    "a",
    "é",
    "<",
    "think",
    "/",
    ">",
    "</",
    "\n" * (W - 1),
    " " * (W + 3),
]


def _reference(text: str, mode: str) -> tuple[Pieces, bool]:
    """The module docstring's rules, written over the whole string with str methods."""
    if mode == "off":
        return ([(T, text)] if text else []), False
    lead = len(text) - len(text.lstrip(_WS))
    opener = lead <= W and text.startswith("<think>", lead)
    if mode == "auto" and not opener:
        return ([(T, text)] if text else []), "</think>" in text
    start = lead + len("<think>") if opener else 0
    close = text.find("</think>", start)
    if close < 0:
        body = text[start:].lstrip(_WS)
        return ([(R, body)] if body else []), False
    body = text[start:close].lstrip(_WS)
    strip = min(W, len(body) - len(body.rstrip(_WS)))
    body = body[: len(body) - strip]
    after = text[close + len("</think>") :].lstrip(_WS)
    return [p for p in [(R, body), (T, after)] if p[1]], False


texts = st.lists(st.sampled_from(FRAGMENTS), max_size=14).map("".join)


@settings(max_examples=400, deadline=None)
@given(text=texts, mode=st.sampled_from(MODES), data=st.data())
def test_any_chunking_matches_buffered_and_the_rules(
    text: str, mode: str, data: st.DataObject
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=6))
    expected, orphan = _reference(text, mode)
    assert split_inline_thinking(text, mode) == expected
    assert _stream(_cut(text, cuts), mode) == (expected, orphan)
    assert _stream(list(text), mode) == (expected, orphan)
    reasoning = "".join(p for r, p in expected if r)
    answer = "".join(p for r, p in expected if not r)
    if mode == "off":
        assert answer == text
    assert reasoning in text  # one span, only trimmed
    assert text.endswith(answer)  # the text is the content's end, untouched
    opener = text.lstrip(_WS).startswith("<think>") and len(text) - len(text.lstrip(_WS)) <= W
    if mode == "auto" and not opener:
        assert answer == text and not reasoning
    elif mode != "off":
        # inside reasoning from the start: text only ever comes after the first close tag
        close = text.find("</think>")
        assert answer == "" if close < 0 else text[close + len("</think>") :].endswith(answer)
