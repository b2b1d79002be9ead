"""The tiny model generator: deterministic bytes, consistent expectations, a safe cache.

Building the model, and importing it in a fresh interpreter:
tests/integration/test_tinymodel_build.py.

The model's behaviour in llama.cpp is checked in tests/e2e/test_llama_upstream.py; here the
wiring is checked by reading the written GGUF back and following the output head by hand.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gateway.demo import bpe, tinymodel
from gateway.demo.tinymodel import (
    ANSWER_TEXT,
    REASONING_TEXT,
    count_tokens,
    ensure_model,
    expectations,
)

needs_gguf = pytest.mark.skipif(
    importlib.util.find_spec("gguf") is None or importlib.util.find_spec("numpy") is None,
    reason="gguf/numpy (the demo extra) not installed",
)


# --- pure parts (no gguf, no numpy) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "taken", "pieces"),
    [
        ("Hi there you.", set(), ["Hi", " there", " you."]),
        # a word seen before is glued to the next one, so every token has one successor
        ("so I will, so I can", set(), ["so", " I", " will,", " so", " I can"]),
        # a one-byte word would be a byte token: glued to the next one
        ("I go, I stay.", set(), ["I go,", " I", " stay."]),
        ("a b a c", set(), ["a b", " a", " c"]),
        (" the cat", {" the"}, [" the cat"]),
        # a leftover that cannot be made unique is glued back onto the previous piece
        ("one two two", set(), ["one", " two two"]),
        ("xx yy xx", {" xx"}, ["xx", " yy xx"]),
    ],
)
def test_word_pieces_are_unique_and_never_one_byte(text, taken, pieces):
    got = tinymodel._word_pieces(text, set(taken))
    assert got == pieces
    assert "".join(got) == text


def test_word_pieces_refuses_what_cannot_be_unique():
    with pytest.raises(ValueError, match="no unique piece"):
        tinymodel._word_pieces("a", set())


@pytest.mark.parametrize(
    ("pieces", "pairs"),
    [
        (["Hi", " there", " you."], ["Hi there you."]),
        (["a", " b", " c", " d"], ["a b", " c d"]),
        (["a", " b", " c", " d", " e"], ["a b", " c d e"]),
    ],
)
def test_reply_pieces_are_two_words_or_more(pieces, pairs):
    assert tinymodel._pairs(pieces) == pairs


def test_no_merge_builds_a_reply_piece():
    """The reply's tokens hold a space before a word, where the pre-tokenizer always cuts."""
    plan = tinymodel._plan()
    built = {left + right for left, right in plan.merges}
    reserved = tinymodel.reserved_spellings()
    assert not built & reserved
    assert all(plan.tokens[plan.ids[p]] in reserved for p in plan.reasoning + plan.answer)
    ranks = {pair: rank for rank, pair in enumerate(plan.merges)}
    for piece in ["\n\n", *plan.reasoning, *plan.answer]:
        assert len(bpe.encode(piece, ranks)) > 1, piece


def test_merges_only_join_what_earlier_merges_built():
    plan = tinymodel._plan()
    built = set(tinymodel._ALPHABET.values())
    for left, right in plan.merges:
        assert left in built and right in built
        built.add(left + right)
    assert len(plan.merges) == len(bpe.load_merges())  # nothing of the shipped file dropped
    assert len(set(plan.tokens)) == len(plan.tokens) == expectations()["n_vocab"]


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        # the chat template's prompt for one user turn "hi": 4 special tokens + 8
        ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>", 12),
        # a run of one letter is one token per letter: tests fill a slot with "x" * n
        ("x" * 1100, 1100),
        ("y" * 100, 100),
        ("hello", 1),
        ("", 0),
    ],
)
def test_count_tokens(text, tokens):
    assert count_tokens(text) == tokens


def test_english_and_json_take_over_three_bytes_a_token():
    text = (
        "The gateway validates, routes by model name, translates the request, calls the "
        "upstream, and translates the buffered reply or the stream back, so that the official "
        "clients cannot tell it from the real API."
    )
    schema = (
        '{"type": "function", "function": {"name": "Read", "description": "Reads a file from '
        'the local filesystem.", "parameters": {"type": "object", "properties": {"file_path": '
        '{"type": "string", "description": "The absolute path to the file to read"}}, '
        '"required": ["file_path"]}}}'
    )
    for sample in (text, schema):
        assert len(sample.encode()) / count_tokens(sample) > 3


def test_learn_takes_frequent_pairs_first_and_keeps_the_rules():
    corpus = ["the cat, the hat, the mat; xxxx xxxx"]
    merges = bpe.learn(corpus, 50, frozenset({"Ġthe"}))
    assert merges[:3] == [("a", "t"), ("h", "e"), ("t", "he")]  # 3 each; ties in pair order
    assert ("Ġ", "the") not in merges  # a forbidden result, though the next most frequent
    assert not any(set(a + b) == {"x"} for a, b in merges)  # a one-letter run stays apart
    assert ("Ġx", "x") in merges  # a run after a space is a word like any other
    assert merges == bpe.learn(corpus, 50, frozenset({"Ġthe"}))  # deterministic


def test_shipped_merges_file_is_well_formed():
    merges = bpe.load_merges()
    assert len(merges) == bpe.N_MERGES
    assert len(set(merges)) == len(merges)
    assert all(" " not in a + b for a, b in merges)


def test_expectations_describe_the_canned_texts():
    expect = expectations()
    assert expect["reasoning"] == REASONING_TEXT == "".join(expect["reasoning_pieces"])
    assert expect["answer"] == ANSWER_TEXT == "".join(expect["answer_pieces"])
    n_r, n_a = len(expect["reasoning_pieces"]), len(expect["answer_pieces"])
    # reasoning, </think>, "\n\n", answer, <|im_end|>
    assert expect["completion_tokens_thinking"] == n_r + 2 + n_a + 1
    assert expect["completion_tokens_nothink"] == 1 + n_a + 1
    assert expect["completion_tokens_plain"] == n_a + 1
    assert expect["eos_token"] == "<|im_end|>"
    pieces = expect["reasoning_pieces"] + expect["answer_pieces"]
    assert len(set(pieces)) == len(pieces)


def test_chain_visits_every_piece_once_and_ends_at_eos():
    plan = tinymodel._plan()
    successor = dict(plan.edges)
    assert len(successor) == len(plan.edges)  # one successor per token
    token = plan.ids["<think>"]
    walk = []
    while token in successor:
        token = successor[token]
        walk.append(token)
    spelled = [plan.tokens[t] for t in walk]
    assert spelled[-1] == "<|im_end|>"
    text = "".join(bytes(_unspell(s)).decode() if s not in plan.ids else s for s in spelled)
    assert text == f"{REASONING_TEXT}</think>\n\n{ANSWER_TEXT}<|im_end|>"
    assert plan.default_next == plan.ids[plan.answer[0]]


def _unspell(spelled: str) -> list[int]:
    back = {c: b for b, c in tinymodel._ALPHABET.items()}
    return [back[c] for c in spelled]


def test_byte_alphabet_is_a_bijection_onto_printables():
    table = tinymodel._ALPHABET
    assert sorted(table) == list(range(256))
    assert len(set(table.values())) == 256
    assert all(c.isprintable() and not c.isspace() for c in table.values())
    assert table[ord("A")] == "A"
    assert tinymodel._spell(" hi\n") == "\u0120hi\u010a"


# --- the cache ------------------------------------------------------------------------------


def test_ensure_model_leaves_no_partial_file(tmp_path, monkeypatch):
    def half_written(path):
        Path(path).write_bytes(b"GGUF partial")
        raise OSError("disk full")

    monkeypatch.setattr(tinymodel, "build_tiny_model", half_written)
    with pytest.raises(OSError, match="disk full"):
        ensure_model(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"XDG_CACHE_HOME": "/x/cache", "HOME": "/h"}, "/x/cache/llm-gateway"),
        ({"XDG_CACHE_HOME": "", "HOME": "/h"}, "/h/.cache/llm-gateway"),
        ({"HOME": "/h"}, "/h/.cache/llm-gateway"),
    ],
)
def test_default_cache_dir(monkeypatch, env, expected):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert tinymodel.default_cache_dir() == expected


def test_ensure_model_uses_the_default_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = []
    monkeypatch.setattr(tinymodel, "build_tiny_model", lambda p: built.append(p) or expectations())
    path, _ = ensure_model()
    assert Path(path).parent == tmp_path / "llm-gateway"
    assert len(built) == 1 and Path(built[0]).parent == tmp_path / "llm-gateway"
