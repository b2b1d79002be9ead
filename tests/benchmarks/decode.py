"""Decoding a client body: the strict decode and the value bound, in this process.

    python -m tests.benchmarks.decode [--reps N]

What every JSON route runs on a body before validating it (``gateway/http/body.py``):
``jsonutil.too_many_values`` then ``jsonutil.loads`` (ujson, then the walk that refuses
lone surrogates, NaN and nesting past 128 levels). Beside them: ``ujson.loads`` alone, and
the decode the walk replaced (ujson, then a regex over the raw bytes and, when it matched,
the standard library's re-parse). Bodies: a Claude Code-shaped request (about 100 KB:
system prompt, 24 tools with schemas, a few turns), a 200-byte one, and a 24 MiB prompt of
the standard library's sources. Figures are the best of ``--reps`` runs, per call.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import timeit
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import ujson

from gateway.text import jsonutil

_WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have "
    "from or one had by word but not what all were we when your can said there use an "
    "each which she do how their if will up other about out many then them"
).split()
_OLD_SUSPECT = re.compile(rb"NaN|Infinity|[0-9][eE][+-]?[0-9]{3}")


def _old_loads(data: bytes) -> Any:
    """The decode before issue 16 (a re-parse that recursed, on any NaN in a prompt)."""
    value = ujson.loads(data)
    if _OLD_SUSPECT.search(data):
        json.loads(data)
    return value


def _text(rng: random.Random, size: int) -> str:
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(_WORDS) + rng.choice(("", "", "", ",", ".\n"))
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


def claude_code_body() -> bytes:
    rng = random.Random(1)
    tools = [
        {
            "name": f"Tool{i}",
            "description": _text(rng, 1500),
            "input_schema": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    f"p{j}": {
                        "type": rng.choice(["string", "integer", "boolean"]),
                        "description": _text(rng, 120),
                    }
                    for j in range(8)
                },
                "required": ["p0", "p1"],
            },
        }
        for i in range(24)
    ]
    body = {
        "model": "claude-opus-5-5",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2"},
            {"type": "text", "text": _text(rng, 20000), "cache_control": {"type": "ephemeral"}},
        ],
        "tools": tools,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": _text(rng, 2000)}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": _text(rng, 500), "signature": "s" * 200},
                    {"type": "tool_use", "id": "toolu_1", "name": "Tool1", "input": {"p0": "a"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": _text(rng, 3000)}
                ],
            },
        ],
        "thinking": {"type": "adaptive", "display": "omitted"},
    }
    return json.dumps(body, ensure_ascii=False).encode()


def code_prompt(size: int) -> bytes:
    sources = sorted(Path(json.__file__).parent.parent.rglob("*.py"))
    text = b"".join(p.read_bytes() for p in sources[:2000])[:size].decode("utf-8", "ignore")
    return json.dumps(
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": text}]}
    ).encode()


def _best(call: Callable[[], object], reps: int, number: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=reps)) / number


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args(argv)
    bodies = [
        (
            "200 B",
            b'{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}',
            20000,
        ),
        ("Claude Code ~100 KB", claude_code_body(), 200),
        ("24 MiB of code", code_prompt(24 * 2**20), 1),
    ]
    print(
        f"{'body':22} {'bytes':>10} {'ujson':>10} {'before':>10} {'loads':>10} {'bound':>10}"
        "   (per call)"
    )
    for name, raw, number in bodies:
        calls = (ujson.loads, _old_loads, jsonutil.loads, jsonutil.too_many_values)
        figures = [_best(partial(call, raw), args.reps, number) for call in calls]
        shown = " ".join(f"{_unit(t):>10}" for t in figures)
        print(f"{name:22} {len(raw):>10} {shown}")
    return 0


def _unit(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.1f} ms"


if __name__ == "__main__":
    sys.exit(main())
