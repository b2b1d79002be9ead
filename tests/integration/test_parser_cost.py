"""The parsers of model output (gateway/local/) cost time linear in their input, whatever
its cut into deltas: no reply a model writes can hold the event loop.

Each case (tests/parser_cost.py) is a reply a looping or hostile model writes: thousands of
openers without closers in every tool-call dialect, an argument string that never ends,
whitespace without end, nested brackets, tag prefixes, inline reasoning, all of it through
the normaliser. Each is fed whole and one character a delta, its cost measured at a size and
at four times it in a subprocess with a hard timeout (the quadratic parsers took minutes: a
regression fails instead of hanging). Linear is 4x, quadratic 16x: under 8x passes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gateway.local import text_tools
from gateway.local.text_tools import TextToolCall, TextToolCalls
from tests.parser_cost import CASES, SIZE, TOOLS

RATIO = 8
TIMEOUT = 60  # seconds for a case, fed whole and streamed: it takes a few here


@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.parametrize("name", list(CASES))
def test_cost_is_linear_in_the_reply(name: str) -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.parser_cost", name],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{name}: over {TIMEOUT} s for a reply of {4 * SIZE:,} characters, fed "
            f"whole then streamed: not linear ({exc.stdout!r})"
        )
    assert done.returncode == 0, done.stderr
    for mode, line in zip(("whole", "1-char deltas"), done.stdout.splitlines(), strict=True):
        small, large = map(float, line.split())
        assert large < RATIO * small, (
            f"{name}, {mode}: {small:.3f} s, then {large:.3f} s at 4x the size"
        )


def test_held_text_stays_under_the_cap() -> None:
    """Past the cap what is held goes out as text, in every dialect: fed in 4 KiB deltas,
    twice the cap of each looping reply, the parser never holds more than MAX_HELD."""
    for name, (parser, make) in CASES.items():
        if parser != "calls":
            continue
        text = make(2 * text_tools.MAX_HELD)
        calls = TextToolCalls(TOOLS)
        out: list[str | TextToolCall] = []
        for at in range(0, len(text), 4096):
            out += calls.feed(text[at : at + 4096])
            assert len(calls.held) <= text_tools.MAX_HELD, name
        out += calls.flush()
        assert "".join(piece for piece in out if type(piece) is str) == text, name
