"""gateway/local/text_tools.py: tool calls a model wrote as text, found in streamed content.

Each case is a whole message and the pieces it splits into. Every case is also fed split at
every offset and one character at a time: the pieces (adjacent text merged) must not depend
on where the stream was cut.
"""

from __future__ import annotations

import pytest

from gateway.local import text_tools
from gateway.local.text_tools import TextToolCall, TextToolCalls, split_text_tool_calls

TOOLS = {"get_weather", "read_file", "write_file"}
W = TextToolCall("get_weather", '{"city":"Paris"}')

CASES: list[tuple[str, str, list[str | TextToolCall]]] = [
    ("plain prose", "The weather is fine.", ["The weather is fine."]),
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        [W],
    ),
    (
        "hermes with text around",
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call>\nDone.",
        ["Let me check.\n", W, "\nDone."],
    ),
    (
        "hermes arguments as a string",
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>',
        [TextToolCall("get_weather", '{"city": "Paris"}')],
    ),
    (
        "two in a row (Qwen2.5)",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "/a"}}\n</tool_call>',
        [W, "\n", TextToolCall("read_file", '{"path":"/a"}')],
    ),
    (
        "cut at EOS before the close tag, body whole",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n',
        [W],
    ),
    (
        "cut in the body: text",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'],
    ),
    (
        "unknown tool name stays text",
        'x <tool_call>{"name": "rm_rf", "arguments": {}}</tool_call> y',
        ['x <tool_call>{"name": "rm_rf", "arguments": {}}</tool_call> y'],
    ),
    (
        "prose mentioning the tag",
        "Wrap each call in <tool_call> and </tool_call> tags.",
        ["Wrap each call in <tool_call> and </tool_call> tags."],
    ),
    ("a tag prefix at the end", "see <tool_", ["see <tool_"]),
    (
        "qwen3-coder",
        "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.py\n</parameter>\n"
        "<parameter=content>\nprint(1)\n\n</parameter>\n<parameter=mode>\n420\n</parameter>\n"
        "</function>\n</tool_call>",
        [TextToolCall("write_file", '{"path":"/tmp/a.py","content":"print(1)\\n","mode":420}')],
    ),
    (
        "qwen3-coder cut before </tool_call>",
        "<tool_call>\n<function=read_file>\n<parameter=path>\n/a\n</parameter>\n</function>",
        [TextToolCall("read_file", '{"path":"/a"}')],
    ),
    (
        "qwen3-coder unknown function",
        "<tool_call>\n<function=nope>\n</function>\n</tool_call>",
        ["<tool_call>\n<function=nope>\n</function>\n</tool_call>"],
    ),
    (
        "mistral list",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "read_file", "arguments": {"path": "/a"}}]',
        [W, TextToolCall("read_file", '{"path":"/a"}')],
    ),
    (
        "mistral v11",
        'ok[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        ["ok", TextToolCall("get_weather", '{"city": "Paris"}')],
    ),
    (
        "mistral v11 twice",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]read_file[ARGS]{"path": "}"}',
        [
            TextToolCall("get_weather", '{"city": "Paris"}'),
            TextToolCall("read_file", '{"path": "}"}'),
        ],
    ),
    ("mistral marker in prose", "the [TOOL_CALLS] token", ["the [TOOL_CALLS] token"]),
    (
        "mistral unknown name",
        '[TOOL_CALLS][{"name": "x", "arguments": {}}]',
        ['[TOOL_CALLS][{"name": "x", "arguments": {}}]'],
    ),
    ("llama json", ' {"name": "get_weather", "parameters": {"city": "Paris"}}\n', [W]),
    (
        "llama python tag",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        [W],
    ),
    (
        "llama json with prose after is text",
        '{"name": "get_weather", "parameters": {"city": "Paris"}} is what I would send',
        ['{"name": "get_weather", "parameters": {"city": "Paris"}} is what I would send'],
    ),
    (
        "llama json after prose is text",
        'Call: {"name": "get_weather", "parameters": {}}',
        ['Call: {"name": "get_weather", "parameters": {}}'],
    ),
    ("a JSON answer", '{"answer": 42}', ['{"answer": 42}']),
    (
        "json answer then a hermes call",
        '{"a": 1}<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
        ['{"a": 1}', W],
    ),
    (
        "non-ascii around",
        'é<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>ü',
        ["é", W, "ü"],
    ),
]


def _merged(pieces: list[str | TextToolCall]) -> list[str | TextToolCall]:
    out: list[str | TextToolCall] = []
    for piece in pieces:
        if type(piece) is str and out and type(out[-1]) is str:
            out[-1] += piece
        elif piece != "":
            out.append(piece)
    return out


@pytest.mark.parametrize(
    ("text", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_split(text: str, expected: list[str | TextToolCall]) -> None:
    assert _merged(split_text_tool_calls(text, TOOLS)) == expected


@pytest.mark.parametrize("text", [case[1] for case in CASES], ids=[case[0] for case in CASES])
def test_any_chunking_gives_the_same_pieces(text: str) -> None:
    whole = _merged(split_text_tool_calls(text, TOOLS))
    for cut in range(len(text) + 1):
        parser = TextToolCalls(TOOLS)
        pieces = parser.feed(text[:cut]) + parser.feed(text[cut:]) + parser.flush()
        assert _merged(pieces) == whole, cut
    parser = TextToolCalls(TOOLS)
    pieces = [piece for char in text for piece in parser.feed(char)] + parser.flush()
    assert _merged(pieces) == whole
    assert parser.found == sum(type(piece) is TextToolCall for piece in whole)


@pytest.mark.parametrize("text", [case[1] for case in CASES], ids=[case[0] for case in CASES])
def test_no_tools_offered_passes_everything_through(text: str) -> None:
    parser = TextToolCalls(())
    assert parser.feed(text) + parser.flush() == [text]


def test_prose_streams_without_delay() -> None:
    parser = TextToolCalls(TOOLS)
    assert parser.feed("Hello, ") == ["Hello, "]
    assert parser.feed("see <tool") == ["see "]
    assert parser.feed("box> now") == ["<toolbox> now"]
    assert parser.feed('<tool_call>{"name"') == []
    assert parser.flush() == ['<tool_call>{"name"']


def test_a_held_block_past_the_cap_is_text() -> None:
    body = '{"name": "read_file", "arguments": {"p": "' + "x" * text_tools.MAX_HELD + '"}}'
    text = f"<tool_call>{body}</tool_call>"
    parser = TextToolCalls(TOOLS)
    streamed = [p for at in range(0, len(text), 4096) for p in parser.feed(text[at : at + 4096])]
    assert "".join(streamed + parser.flush()) == text  # type: ignore[arg-type]
    assert _merged(split_text_tool_calls(text, TOOLS)) == [text]


@pytest.mark.parametrize(
    "opener",
    [
        "<tool_call>",
        "[TOOL_CALLS][",
        "[TOOL_CALLS]read_file[ARGS]{",
        "<tool_call>\n<function=read_file>\n",
    ],
)
def test_a_block_past_the_cap_is_text_and_calls_after_it_are_found(opener: str) -> None:
    """A block not ended within MAX_HELD characters goes out as text, the search goes on
    after them, whole or streamed: a looping model's call after the loop is still found."""
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    loop = opener + "[<" * text_tools.MAX_HELD
    assert _merged(split_text_tool_calls(loop + call, TOOLS)) == [loop, W]
    parser = TextToolCalls(TOOLS)
    text = loop + call
    pieces = [p for at in range(0, len(text), 1000) for p in parser.feed(text[at : at + 1000])]
    assert len(parser.held) < len(call)
    assert _merged(pieces + parser.flush()) == [loop, W]
