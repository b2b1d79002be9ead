"""Replies a looping or hostile model writes, and what parsing them costs, for
tests/integration/test_parser_cost.py: ``python -m tests.parser_cost NAME`` prints the CPU seconds
one case costs at :data:`SIZE` and at 4 x SIZE characters, fed whole and one character a
delta (best of 3 each; a whole reply is parsed as many times as it takes to cost 20 ms at
SIZE, the same number of times at 4 x SIZE). Run alone in a process: nothing else imported,
garbage collection off."""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable

from gateway.local.normalise import ContentNormaliser
from gateway.local.text_tools import TextToolCalls
from gateway.local.think import InlineThinking

TOOLS = ("read_file", "get_weather")
SIZE = 10_000  # and 4 times it: both under MAX_HELD, where holding is longest
_ARG = '{"name": "read_file", "arguments": {"path": "'


def _times(unit: str, size: int) -> str:
    return unit * (size // len(unit) + 1)


# name: (parser, the reply at a size in characters)
CASES: dict[str, tuple[str, Callable[[int], str]]] = {
    "coder functions without closers": (
        "calls",
        lambda n: "<tool_call>\n" + _times("<function=read_file>\n", n),
    ),
    "coder parameters without closers": (
        "calls",
        lambda n: (
            "<tool_call>\n<function=read_file>\n"
            + _times("<parameter=path>\n", n)
            + "</function>\n</tool_call>"
        ),
    ),
    "coder names that never end": ("calls", lambda n: "<tool_call>" + _times("<function=", n)),
    "hermes openers": ("calls", lambda n: _times("<tool_call>", n)),
    "hermes argument string": ("calls", lambda n: "<tool_call>" + _ARG + _times("x", n)),
    "mistral argument string": ("calls", lambda n: "[TOOL_CALLS][" + _ARG + _times("x", n)),
    "mistral escapes": ("calls", lambda n: "[TOOL_CALLS][" + _ARG + _times('\\"', n)),
    "mistral whitespace": ("calls", lambda n: "[TOOL_CALLS]" + _times(" \n", n)),
    "mistral nested markers": ("calls", lambda n: _times("[TOOL_CALLS][", n)),
    "mistral v11 nesting": ("calls", lambda n: "[TOOL_CALLS]read_file[ARGS]{" + _times("[", n)),
    "mistral markers as text": ("calls", lambda n: _times("[TOOL_CALLS]x ", n)),
    "llama whole message": (
        "calls",
        lambda n: ' {"name": "read_file", "parameters": {"path": "' + _times("x", n),
    ),
    "llama python tag": ("calls", lambda n: "<|python_tag|>" + _times("{", n)),
    "tag prefixes in prose": ("calls", lambda n: _times("<tool_ [TOOL_", n)),
    "think reasoning": ("think", lambda n: "<think>\n" + _times("</thin \n", n)),
    "think orphan close prefixes": ("think", lambda n: "answer " + _times("</thin", n)),
    "think whitespace": ("think", lambda n: _times(" ", 32) + "<think>" + _times(" \r\n", n)),
    "normaliser whitespace": ("normaliser", lambda n: "text" + _times(" \n\t", n)),
    "normaliser think then calls": (
        "normaliser",
        lambda n: "<think>x</think>" + _times("<tool_call><function=", n),
    ),
}


def run(parser: str, chunks: list[str]) -> None:
    """Feed one reply to a fresh parser, as the stream does, and flush it."""
    if parser == "calls":
        calls = TextToolCalls(TOOLS)
        for chunk in chunks:
            calls.feed(chunk)
        calls.flush()
    elif parser == "think":
        think = InlineThinking("auto")
        for chunk in chunks:
            think.feed(chunk)
        think.flush()
    else:
        norm = ContentNormaliser(thinking="auto", tool_names=TOOLS)
        for chunk in chunks:
            if not norm.plain(chunk):
                norm.feed(chunk)
                norm.holds_call  # noqa: B018  (asked per delta by the stream)
        norm.flush()


def _cost(parser: str, chunks: list[str], repeat: int) -> float:
    start = time.process_time()
    for _ in range(repeat):
        run(parser, chunks)
    return time.process_time() - start


def measure(name: str, *, streamed: bool, runs: int = 3) -> tuple[float, float]:
    """The best of ``runs`` at SIZE and at 4 x SIZE, taken in turns (a load that comes and
    goes weighs on both)."""
    parser, make = CASES[name]
    split = list if streamed else lambda text: [text]
    small, large = split(make(SIZE)), split(make(4 * SIZE))
    repeat = 1
    while _cost(parser, small, repeat) < 0.02 and repeat < 1 << 16:
        repeat *= 2
    costs = [(_cost(parser, small, repeat), _cost(parser, large, repeat)) for _ in range(runs)]
    return min(cost[0] for cost in costs), min(cost[1] for cost in costs)


if __name__ == "__main__":
    gc.disable()
    for streamed in (False, True):
        print(*measure(sys.argv[1], streamed=streamed), flush=True)
