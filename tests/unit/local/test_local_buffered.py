"""Buffered == streamed for what local engines really emit.

For every ``local_*`` golden stream, the buffered completion an engine would have answered
instead (the stream's deltas joined into one ``message``: ``tests.stub_upstream.
buffered_completion``) goes through ``from_chat`` with the same normaliser options, and
must give the message the stream gives once its events are folded (``aggregate``): the
same blocks in the same order, the same stop reason and output tokens, the same fixes
counted. A tool_use id
the gateway generates (a call written as text has none) is random on both paths, so it is
compared blanked.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from gateway.local.normalise import ContentNormaliser, LazyNormaliser
from gateway.local.tool_args import repair_arguments
from gateway.messages.from_chat.aggregate import aggregate
from gateway.messages.from_chat.message import from_chat
from gateway.text import jsonutil
from tests.golden_streams import GOLDEN, LOCAL_CASES, normaliser, run_case
from tests.stub_upstream import buffered_completion

_GENERATED = re.compile(r"toolu_[0-9A-Za-z]{24}")


def _blank_ids(message: dict[str, Any]) -> dict[str, Any]:
    for block in message["content"]:
        if block["type"] == "tool_use" and _GENERATED.fullmatch(block["id"]):
            block["id"] = "toolu_generated"
    return message


def _streamed(case: str) -> tuple[dict[str, Any], Any]:
    upstream = (GOLDEN / case / "upstream.sse").read_bytes()
    meta = jsonutil.loads((GOLDEN / case / "meta.json").read_bytes())
    out, translator = run_case(upstream, meta)
    return aggregate(out), translator


def _buffered(case: str) -> tuple[dict[str, Any], dict[str, int], Any]:
    upstream = (GOLDEN / case / "upstream.sse").read_bytes()
    meta = jsonutil.loads((GOLDEN / case / "meta.json").read_bytes())
    counts = {"repaired": 0, "unrepairable": 0}
    norm = normaliser(meta)
    message = from_chat(
        buffered_completion(upstream),
        model=meta["model"],
        signing_key=meta.get("signing_key", "golden-key").encode(),
        message_id=meta.get("message_id", "msg_golden01"),
        stop_sequences=meta.get("stop_sequences", ()),
        on_repaired=lambda: counts.__setitem__("repaired", counts["repaired"] + 1),
        on_bad_tool_args=lambda: counts.__setitem__("unrepairable", counts["unrepairable"] + 1),
        normaliser=norm,
    )
    return message, counts, norm


@pytest.mark.parametrize("case", LOCAL_CASES)
def test_buffered_equals_streamed(case: str) -> None:
    streamed, translator = _streamed(case)
    buffered, _, _ = _buffered(case)
    for field in ("content", "stop_reason", "stop_sequence", "id", "model", "role"):
        assert _blank_ids(buffered)[field] == _blank_ids(streamed)[field], field
    # the stream's message_delta carries output tokens only; its input count is the
    # translator's (what the gateway counts), the upstream's own where it reported one
    assert buffered["usage"]["output_tokens"] == streamed["usage"]["output_tokens"]
    assert (buffered["usage"]["input_tokens"], buffered["usage"]["output_tokens"]) == (
        translator.usage
    )


@pytest.mark.parametrize("case", LOCAL_CASES)
def test_fixes_counted_alike(case: str) -> None:
    """What llm_gateway_local_fixes_total counts for a reply does not depend on the path."""
    _, translator = _streamed(case)
    _, counts, norm = _buffered(case)
    assert translator.tool_arguments_fixed == (counts["repaired"], counts["unrepairable"])
    found = norm.calls_found if norm is not None else 0
    assert translator.text_tool_calls == found
    assert (translator.normaliser is not None and translator.normaliser.thinking_found) == (
        norm is not None and norm.thinking_found
    )


@pytest.mark.parametrize("case", LOCAL_CASES)
def test_reply_is_what_clients_accept(case: str) -> None:
    """Thinking first, tool_use ends the turn, every input an object that round-trips."""
    message, _ = _streamed(case)
    meta = jsonutil.loads((GOLDEN / case / "meta.json").read_bytes())
    kinds = [block["type"] for block in message["content"]]
    assert "thinking" not in kinds[1:]
    assert message["stop_reason"] == meta["expect"]["stop_reason"]
    if "tool_use" in kinds and message["stop_reason"] != "max_tokens":
        assert message["stop_reason"] == "tool_use"
    for block in message["content"]:
        if block["type"] == "tool_use":
            assert type(block["input"]) is dict
            assert repair_arguments(jsonutil.dumps(block["input"])).outcome == "ok"
        if block["type"] == "thinking":
            assert block["signature"]


_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize(
    "deltas",
    [
        ["I will check.", "\n", _CALL],
        ["I will check.", "\n", "<tool_call>", _CALL.removeprefix("<tool_call>")],
    ],
)
def test_normaliser_pieces_do_not_depend_on_the_split(deltas: list[str]) -> None:
    """The normaliser's own promise (gateway/local/normalise.py): the pieces of a content are
    the same for any split, so buffered and streamed replies are equal. A model writes the
    newline before ``<tool_call>`` as a token of its own, so this split is the common one."""
    assert _pieces(deltas) == _pieces(["".join(deltas)])


def _pieces(deltas: list[str]) -> list[Any]:
    """The normaliser's pieces of ``deltas``, adjacent text pieces joined."""
    norm = ContentNormaliser(tool_names=["get_weather"])
    pieces = [piece for delta in deltas for piece in norm.feed(delta)] + norm.flush()
    merged: list[Any] = []
    for kind, value in pieces:
        if merged and type(value) is str and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + value)
        else:
            merged.append((kind, value))
    return merged


_WHOLE_TEXTS = [
    "",
    "Hello there.",
    "  \n",
    "  lead and trail \n",
    "a < b",
    "<think>r</think>t",
    "text</think> more",
    "<thi",
    "\n\n<think>\nr\n</think>\n\nt",
    "x" * 5000,
]


@pytest.mark.parametrize("mode", ["auto", "opened"])
@pytest.mark.parametrize("tools", [(), ("get_weather",)], ids=["no-tools", "tools"])
@pytest.mark.parametrize("text", _WHOLE_TEXTS)
def test_whole_content_is_feed_then_flush(text: str, tools: tuple[str, ...], mode: str) -> None:
    """``whole`` (the buffered reply's one call, with its shortcut for text that cannot hold
    a tag) gives the pieces and the findings ``feed`` + ``flush`` give."""
    fast, slow = (ContentNormaliser(thinking=mode, tool_names=tools) for _ in range(2))
    assert fast.whole(text) == slow.feed(text) + slow.flush()
    assert (fast.thinking_found, fast.orphan_close, fast.calls_found) == (
        slow.thinking_found,
        slow.orphan_close,
        slow.calls_found,
    )


@pytest.mark.parametrize(
    ("mode", "content", "text"),
    [
        ("auto", "<think>x</think>y", "<think>x</think>y"),
        ("opened", "x</think>y", "x</think>y"),
    ],
)
def test_a_reply_with_parsed_reasoning_keeps_its_content_as_text(
    mode: str, content: str, text: str
) -> None:
    """As streamed (tests/unit/messages/test_stream.py): reasoning in its own field means the engine
    parses reasoning, so content holds no inline ``<think>`` to split."""
    message = from_chat(
        {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "reasoning_content": "r", "content": content},
                }
            ]
        },
        model="m",
        signing_key=b"k",
        normaliser=ContentNormaliser(thinking=mode),
    )
    assert [(b["type"], b.get("text", b.get("thinking"))) for b in message["content"]] == [
        ("thinking", "r"),
        ("text", text),
    ]


# (inline thinking mode, tools offered, reasoning field, content, a normaliser is built)
_LAZY_CASES = [
    ("auto", (), None, "plain words", False),
    ("auto", (), "r", "<think>x</think>y", False),  # the engine parses reasoning
    ("auto", (), None, "<think>x</think>y", True),
    ("auto", (), None, "a</think>b", True),  # an orphan close: counted
    ("opened", (), None, "x</think>y", True),
    ("off", (), None, "<think>x</think>y", False),
    ("off", ("get",), None, '<tool_call>{"name": "get", "arguments": {}}</tool_call>', True),
    ("auto", ("get",), "r", "plain", True),
    ("auto", (), None, "", False),
]


@pytest.mark.parametrize(("mode", "tools", "reasoning", "content", "built"), _LAZY_CASES)
def test_lazy_normaliser_as_eager(
    mode: str, tools: tuple[str, ...], reasoning: str | None, content: str, built: bool
) -> None:
    """A buffered reply's normaliser is built only where the content needs one, and the
    message and what is counted are those of one built up front."""
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        msg["reasoning_content"] = reasoning
    completion = {"choices": [{"index": 0, "finish_reason": "stop", "message": msg}]}

    def run(norm: Any) -> dict[str, Any]:
        return from_chat(
            completion, model="m", signing_key=b"k", message_id="msg_1", normaliser=norm
        )

    eager = ContentNormaliser(thinking=mode, tool_names=tools)
    lazy = LazyNormaliser(thinking=mode, tool_names=tools)
    assert _blank_ids(run(lazy)) == _blank_ids(run(eager))
    assert (lazy.built is not None) is built
    got = lazy.built
    found = (got.thinking_found, got.orphan_close, got.calls_found) if got else (False, False, 0)
    assert found == (eager.thinking_found, eager.orphan_close, eager.calls_found)
