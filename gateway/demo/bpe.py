"""Byte-level BPE for the tiny demo model: the merges it ships, how they were learned, an encoder.

Facts relied on (llama.cpp's ``gpt2`` tokenizer with ``tokenizer.ggml.pre = "gpt-2"``): text is
cut into words by the GPT-2 regex (``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+|
?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``), special tokens first; a word's UTF-8 bytes are written
in GPT-2's byte alphabet; within a word, the adjacent pair of lowest merge rank is joined until no
pair is a merge; a resulting symbol that is not a vocabulary token falls back to its bytes. So a
token longer than a byte only ever comes from a merge: a vocabulary entry that no merge builds
(a piece of the canned reply) never appears in a prompt, whatever the prompt says.

``merges.txt`` (next to this module) holds the merges, one ``LEFT RIGHT`` pair a line, best
first. They were learned once by :func:`learn` (``python -m gateway.demo.bpe``) from the standard
library of the interpreter at hand (CPython 3.11: the ``Lib/*.py`` modules and the ``pydoc_data``
topics, English prose and code), and are shipped so that the model's bytes never depend on the
Python version. With them English and JSON take about 3.5 bytes a token (one byte a token
before), and Claude Code's 78 KB full-mode request is about 23k tokens.

Two rules hold for every merge, learned or loaded: it never builds a reserved vocabulary entry
(special tokens, the pieces of the canned reply: those stay reachable only by generation), and
it never builds a run of one repeated ASCII letter (so ``"x" * n`` on its own stays ``n``
tokens, which tests use to fill a slot exactly).
"""

from __future__ import annotations

import argparse
import collections
import heapq
import itertools
import re
import string
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

MERGES_FILE = Path(__file__).with_name("merges.txt")
N_MERGES = 16000

# \p{L} and \p{N} in Python's re: a letter is a word character that is not a digit or "_".
_L = r"[^\W\d_]"
_WORD = re.compile(rf"'s|'t|'re|'ve|'m|'ll|'d| ?{_L}+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+")


def _byte_alphabet() -> dict[int, str]:
    """The byte-level BPE's reversible byte -> printable character map (GPT-2's scheme)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    spare = 0x100
    for b in range(256):
        if b not in table:
            table[b] = chr(spare)
            spare += 1
    return table


ALPHABET = _byte_alphabet()


def spell(text: str) -> str:
    """How a normal token is written in the vocabulary: its UTF-8 bytes through the alphabet."""
    return "".join(ALPHABET[b] for b in text.encode("utf-8"))


def words(text: str) -> list[str]:
    """The pre-tokenizer: text (without special tokens) cut into words, GPT-2's way."""
    return _WORD.findall(text)


def allowed(left: str, right: str, forbidden: frozenset[str] | set[str]) -> bool:
    """Whether a merge may build ``left + right`` (see the two rules in the module docstring)."""
    joined = left + right
    one_letter_run = len(set(joined)) == 1 and joined[0] in string.ascii_letters
    return joined not in forbidden and not one_letter_run


def learn(
    texts: Iterable[str], n_merges: int, forbidden: frozenset[str] = frozenset()
) -> list[tuple[str, str]]:
    """Learn up to ``n_merges`` merges from ``texts`` (most frequent pair first, ties by order).

    ``forbidden``: spelled strings no merge may build. Pairs are counted once per word type,
    weighted by the word's frequency; only the words holding a merged pair are recounted.
    """
    counts: collections.Counter[str] = collections.Counter()
    for text in texts:
        counts.update(spell(w) for w in words(text))
    symbols = [list(word) for word in counts]
    freq = list(counts.values())
    pairs: collections.Counter[tuple[str, str]] = collections.Counter()
    where: dict[tuple[str, str], set[int]] = collections.defaultdict(set)
    for i, word in enumerate(symbols):
        for pair in itertools.pairwise(word):
            pairs[pair] += freq[i]
            where[pair].add(i)
    heap = [(-count, pair) for pair, count in pairs.items()]
    heapq.heapify(heap)
    merges: list[tuple[str, str]] = []
    while heap and len(merges) < n_merges:
        negative, pair = heapq.heappop(heap)
        if pairs.get(pair, 0) != -negative:
            continue  # a stale heap entry
        if -negative < 2:
            break
        if not allowed(*pair, forbidden):
            del pairs[pair]
            continue
        merges.append(pair)
        touched = _merge_everywhere(pair, symbols, freq, pairs, where)
        for other in touched:
            if pairs.get(other, 0) > 0:
                heapq.heappush(heap, (-pairs[other], other))
            else:
                pairs.pop(other, None)
    return merges


def _merge_everywhere(
    pair: tuple[str, str],
    symbols: list[list[str]],
    freq: list[int],
    pairs: collections.Counter[tuple[str, str]],
    where: dict[tuple[str, str], set[int]],
) -> set[tuple[str, str]]:
    left, right = pair
    touched: set[tuple[str, str]] = set()
    for i in sorted(where.pop(pair, ())):
        old = symbols[i]
        for p in itertools.pairwise(old):
            pairs[p] -= freq[i]
            touched.add(p)
        new: list[str] = []
        j = 0
        while j < len(old):
            if j + 1 < len(old) and old[j] == left and old[j + 1] == right:
                new.append(left + right)
                j += 2
            else:
                new.append(old[j])
                j += 1
        symbols[i] = new
        for p in itertools.pairwise(new):
            pairs[p] += freq[i]
            where[p].add(i)
            touched.add(p)
    return touched


def load_merges(path: Path = MERGES_FILE) -> list[tuple[str, str]]:
    merges = []
    for line in path.read_text(encoding="utf-8").splitlines():
        left, sep, right = line.partition(" ")
        if not sep or not left or not right:
            raise ValueError(f"{path.name}: not a merge: {line!r}")
        merges.append((left, right))
    return merges


def encode_word(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """One pre-tokenized word (spelled) -> its symbols, as llama.cpp merges them."""
    syms = list(word)
    while len(syms) > 1:
        best = min(
            ((ranks[p], i) for i, p in enumerate(itertools.pairwise(syms)) if p in ranks),
            default=None,
        )
        if best is None:
            break
        i = best[1]
        syms[i : i + 2] = [syms[i] + syms[i + 1]]
    return syms


def encode(text: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """Text without special tokens -> the spelled symbols llama.cpp makes of it."""
    return [sym for word in words(text) for sym in encode_word(spell(word), ranks)]


def stdlib_corpus() -> list[str]:
    """The texts the shipped merges were learned from: this interpreter's stdlib, in order."""
    import pydoc_data.topics
    import sysconfig

    lib = Path(sysconfig.get_paths()["stdlib"])
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(lib.glob("*.py"))]
    return [*texts, *(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gateway.demo.bpe", description=__doc__)
    ap.add_argument("out", nargs="?", default=str(MERGES_FILE))
    ap.add_argument("--merges", type=int, default=N_MERGES)
    args = ap.parse_args(argv)
    from gateway.demo.tinymodel import reserved_spellings

    merges = learn(stdlib_corpus(), args.merges, reserved_spellings())
    Path(args.out).write_text("".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    print(f"{len(merges)} merges -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
