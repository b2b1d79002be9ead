"""Web search's parsers of client and model text cost linear time: each measured in a child
process with a hard timeout, so a quadratic step fails the test instead of hanging it."""

from __future__ import annotations

import subprocess
import sys


def test_a_path_pattern_of_many_wildcards_does_not_stall() -> None:
    """A client's allowed_domains entry with many "*" against a long result path: matched
    in linear time (as ".*" regular expressions, 3 of them over 600 characters took 8 s
    and 30 would never end, on the event loop); run apart, so a stall fails, not hangs."""
    code = (
        "from gateway.tools.web_search.domains import DomainFilter as D\n"
        "f = D(['example.com/' + '*a' * 600 + '*b', 'x.example/' + '*/a' * 300 + '*/b'])\n"
        "assert not f('https://example.com/' + 'a' * 2000)\n"
        "assert not f('https://x.example/' + '/a' * 1000)\n"
        "assert f('https://example.com/' + 'a' * 2000 + 'b')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], timeout=60, check=False)
    assert done.returncode == 0


_GROWTH = '''
import time
from gateway.tools.web_search.citations import Quotes

def cost(scale):
    """split() of 12,500 * scale characters against 10 * scale snippets of 250 * scale
    characters, which all open alike: prose, real quotes, and runs of their opening."""
    snippets = ["a" * (250 * scale - 3) + f"{n:03d}" for n in range(10 * scale)]
    block = "Some prose, a quote: " + snippets[0] + " and a run: " + "a" * (250 * scale)
    text = (block * (12_500 * scale // len(block) + 1))[:12_500 * scale]
    results = [{"url": f"https://r{n}.example/", "title": "t", "snippet": s}
               for n, s in enumerate(snippets)]
    best = float("inf")
    for _ in range(3):
        quotes = Quotes(b"k" * 32)
        quotes.add(results)
        t0 = time.perf_counter()
        pieces, held = quotes.split(text)
        best = min(best, time.perf_counter() - t0)
        assert "".join(p for p, _ in pieces) + held == text
        assert pieces[1] == (snippets[0], pieces[1][1]) and pieces[1][1] is not None
    return best


def streamed(scale):
    """The same snippets, and 2,500 * scale characters of their opening streamed one at a
    time (the held text given back each time, as the stream rewriter does)."""
    snippets = ["a" * (250 * scale - 3) + f"{n:03d}" for n in range(10 * scale)]
    best = float("inf")
    for _ in range(3):
        quotes = Quotes(b"k" * 32)
        quotes.add([{"url": f"https://r{n}.example/", "title": "t", "snippet": s}
                    for n, s in enumerate(snippets)])
        held, passed = "", 0
        t0 = time.perf_counter()
        for _ in range(2_500 * scale):
            pieces, held = quotes.split(held + "a")
            passed += sum(len(p) for p, _ in pieces)
        best = min(best, time.perf_counter() - t0)
        assert passed + len(held) == 2_500 * scale
    return best

for measure in (cost, streamed):
    small, large = measure(1), measure(4)
    print(measure.__name__, large / small)
    assert large < 8 * small, (measure.__name__, small, large)
'''


def test_citation_matching_grows_linearly() -> None:
    """Four times the text and four times the snippets (in number and length), all opening
    alike, in one piece or streamed a character at a time: the quote finder's work grows
    at most about four times (it grew with text x snippets, 13 and 20 times), measured
    apart with a hard timeout; the first quote is still cited and no text is lost."""
    done = subprocess.run(
        [sys.executable, "-c", _GROWTH], timeout=120, check=False, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
