"""What the local-engine normaliser costs per streamed chunk, as a ratio to the translator alone.

    python -m tests.benchmarks.normaliser

Feeds the same upstream stream (2,000 content chunks of a few tokens, then a finish) through a
``StreamTranslator`` without a normaliser, with the default one (inline thinking "auto", no
tools offered), and with tools offered (text tool calls looked for: every chunk is scanned),
best of several runs each. Prints microseconds per chunk and the ratios.
"""

from __future__ import annotations

import time

from gateway.local.normalise import ContentNormaliser
from gateway.messages.stream.translator import StreamTranslator
from gateway.text import jsonutil

CHUNKS = 2000
RUNS = 7


def _payloads() -> list[bytes]:
    out = [
        jsonutil.dumpb({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    ]
    words = ("The ", "quick ", "brown ", "fox ", "jumps ", "over ", "the ", "lazy ", "dog. ")
    for i in range(CHUNKS):
        out.append(
            jsonutil.dumpb(
                {
                    "choices": [
                        {
                            "index": 0,
                            "delta": {
                                "content": words[i % len(words)] + words[(i + 3) % len(words)]
                            },
                        }
                    ]
                }
            )
        )
    out.append(
        jsonutil.dumpb(
            {
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": CHUNKS},
            }
        )
    )
    return out


def _run(payloads: list[bytes], make: object) -> float:
    best = float("inf")
    for _ in range(RUNS):
        translator = StreamTranslator(
            model="m", message_id="msg_bench", signing_key=b"k" * 32, normaliser=make()
        )  # type: ignore[operator]
        t = time.perf_counter()
        for payload in payloads:
            translator.feed(payload)
        translator.eof()
        best = min(best, time.perf_counter() - t)
    return best / len(payloads) * 1e6


def main() -> None:
    payloads = _payloads()
    bare = _run(payloads, lambda: None)
    auto = _run(payloads, lambda: ContentNormaliser(thinking="auto"))
    tools = _run(payloads, lambda: ContentNormaliser(thinking="auto", tool_names=("Read",)))
    print(f"translator alone:              {bare:6.2f} us/chunk")
    print(f"+ normaliser (no tools):       {auto:6.2f} us/chunk  ratio {auto / bare:.2f}")
    print(f"+ normaliser (tools offered):  {tools:6.2f} us/chunk  ratio {tools / bare:.2f}")


if __name__ == "__main__":
    main()
