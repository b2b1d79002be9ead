"""gateway/local/tool_args.py: tool-call arguments as open models write them.

A Messages API ``tool_use.input`` is always a JSON object, whatever the engine passed on as
``function.arguments``: strict JSON is taken as is ("ok"), almost-JSON is repaired, anything
else becomes ``{}`` ("failed").
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.local import tool_args
from gateway.local.tool_args import Repaired, repair_arguments

OK = [
    (None, {}),
    ("", {}),
    ("  \n\t", {}),
    ('{"location": "Paris", "unit": "celsius"}', {"location": "Paris", "unit": "celsius"}),
    ("{}", {}),
    ('{"code": "print(\'hi\')\\n"}', {"code": "print('hi')\n"}),
    ('\n\n  {\n\t"a" :\n 1 }  \n', {"a": 1}),
    ('{"a": {"b": [1, 2.5, null, true]}}', {"a": {"b": [1, 2.5, None, True]}}),
]

REPAIRED = [
    # Qwen2.5 / Llama 3.1 writing a Python dict (repr of the arguments).
    (
        "{'path': '/etc/hosts', 'recursive': True, 'limit': None}",
        {"path": "/etc/hosts", "recursive": True, "limit": None},
    ),
    ('{"flag": False, "other": True}', {"flag": False, "other": True}),
    ("{'a': 'None', 'b': 'True story'}", {"a": "None", "b": "True story"}),
    ("{'q': 'say \"hi\"'}", {"q": 'say "hi"'}),
    ("{'q': \"it's\"}", {"q": "it's"}),
    ('{"q": "it\\\'s"}', {"q": "it's"}),  # Python's \' is no JSON escape
    # trailing and doubled commas
    ('{"a": 1,}', {"a": 1}),
    ('{"a": [1, 2,],}', {"a": [1, 2]}),
    ('{"a": [1,, 2]}', {"a": [1, 2]}),
    # fenced blocks, with or without a language, with prose around
    ('```json\n{"command": "ls -la"}\n```', {"command": "ls -la"}),
    ('```\n{"a": 1}\n```', {"a": 1}),
    ('Here is the call:\n```json\n{"a": 1}\n```\nLet me know.', {"a": 1}),
    ('```json\n{"a": 1', {"a": 1}),  # fence cut off too
    # an object encoded twice
    ('"{\\"a\\": 1}"', {"a": 1}),
    ("\"{'a': True}\"", {"a": True}),
    # cut off by max_tokens
    ('{"path": "/tmp/a', {"path": "/tmp/a"}),
    ('{"a": [1, 2', {"a": [1, 2]}),
    ('{"a": 1, "b', {"a": 1}),
    ('{"a": 1, "b":', {"a": 1}),
    ('{"a": 1, "b": ', {"a": 1}),
    ('{"a": {"b": ', {"a": {}}),
    ('{"content": "line one\\nline t', {"content": "line one\nline t"}),
    ('{"a": "x\\', {"a": "x"}),  # half an escape
    ('{"a": "x\\\\', {"a": "x\\"}),  # a whole one
    (
        '{"file_path": "/a.py", "content": "def f():\n    return 1\n',
        {"file_path": "/a.py", "content": "def f():\n    return 1\n"},
    ),
    # unquoted keys, comments, missing commas, whitespace
    ('{a: 1, b: "x"}', {"a": 1, "b": "x"}),
    ('{"a": 1 // the count\n}', {"a": 1}),
    ('{"a": /* inline */ 1}', {"a": 1}),
    ('{"a": 1 "b": 2}', {"a": 1, "b": 2}),
    ('{\u00a0"a":\u3000 1}', {"a": 1}),  # no-break and ideographic spaces
    ('{"a": NaN}', {"a": None}),
    # tags and prose left around the object (Hermes templates, a late parser split)
    ('{"a": 1}</tool_call>', {"a": 1}),
    ('{"a": 1}\n</tool_call>\n', {"a": 1}),
    ('<tool_call>\n{"a": 1}\n</tool_call>', {"a": 1}),
    ("Sure! {'a': 1}", {"a": 1}),
    # a list holding one object
    ('[{"a": 1}]', {"a": 1}),
    ("[{'a': 1}]", {"a": 1}),
    # smart quotes: left to json_repair (short input only)
    ("{\u201ca\u201d: \u201cb\u201d}", {"a": "b"}),
]

FAILED = [
    "[1, 2]",
    '[{"a": 1}, {"b": 2}]',
    '{"a": 1} {"b": 2}',  # two objects: which one was meant is a guess
    '"just a string"',
    "42",
    "null",
    "true",
    "garbage",
    "I cannot call that tool.",
    '{"a": 1e400}',  # infinite: nothing can encode it again
    '"\\"nested\\""',
]


@pytest.mark.parametrize(("raw", "value"), OK)
def test_strict_json_is_taken_as_is(raw: str | None, value: dict[str, Any]) -> None:
    assert repair_arguments(raw) == Repaired(value, "ok")


@pytest.mark.parametrize(("raw", "value"), REPAIRED)
def test_what_local_models_write_is_repaired(raw: str, value: dict[str, Any]) -> None:
    assert repair_arguments(raw) == Repaired(value, "repaired")


@pytest.mark.parametrize("raw", FAILED)
def test_what_is_no_object_fails_to_an_empty_one(raw: str) -> None:
    assert repair_arguments(raw) == Repaired({}, "failed")


def test_strict_json_of_any_size_is_ok() -> None:
    big = '{"content": "' + "x" * (tool_args.MAX_REPAIR_CHARS * 2) + '"}'
    assert repair_arguments(big).outcome == "ok"


def test_input_past_the_cap_is_not_repaired() -> None:
    cut = '{"content": "' + "x" * tool_args.MAX_REPAIR_CHARS
    assert repair_arguments(cut) == Repaired({}, "failed")
    within = '{"content": "' + "x" * (tool_args.MAX_REPAIR_CHARS - 20)
    assert repair_arguments(within).outcome == "repaired"


HOSTILE = [
    "[" * tool_args.MAX_REPAIR_CHARS,
    '{"' * (tool_args.MAX_REPAIR_CHARS // 2),
    "{" + '"' * (tool_args.MAX_REPAIR_CHARS - 1),
    "{" + "a:1," * (tool_args.MAX_REPAIR_CHARS // 4 - 1),
    "[" + "1," * (tool_args.MAX_REPAIR_CHARS // 2 - 1),
    "{'" + "'" * 510,  # short: json_repair's turn
    "{{1/'" * 102,
    "{ " * 256,
]


@pytest.mark.parametrize("raw", HOSTILE, ids=lambda raw: repr(raw[:8]))
def test_hostile_input_is_cheap(raw: str) -> None:
    """The bounds hold one repair to tens of milliseconds (0.2 s allows a slow CI runner)."""
    started = time.perf_counter()
    result = repair_arguments(raw)
    assert time.perf_counter() - started < 0.2
    assert type(result.value) is dict


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("{}[]\"':,.\\/*`\n aT1eN-")) | st.characters()))
def test_never_raises_and_always_an_object(raw: str) -> None:
    result = repair_arguments(raw)
    assert type(result.value) is dict
    assert result.outcome in ("ok", "repaired", "failed")
    assert result.outcome != "failed" or result.value == {}


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(),
        st.recursive(
            st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
            lambda inner: (
                st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3)
            ),
            max_leaves=8,
        ),
    )
)
def test_a_cut_object_repairs_to_an_object(value: dict[str, Any]) -> None:
    """Whatever prefix of a real object a model is cut at, the result is an object."""
    from gateway.text import jsonutil

    text = jsonutil.dumps(value)
    assert repair_arguments(text) == Repaired(value, "ok")
    for end in range(1, len(text), max(1, len(text) // 16)):
        assert type(repair_arguments(text[:end]).value) is dict


# --- one reply's repairs, together ------------------------------------------------------

_BIG = '{"content": "' + "x" * 200_000 + '",}'  # a file written with a trailing comma
# a reply of many broken calls: (what each call's arguments are, how many, its repaired value)
REPLIES = [
    ("big", _BIG, 20, {"content": "x" * 200_000}),
    ("small", "{'a': 1,}", 300, {"a": 1}),
    ("tokens", "{" + "'k': 1, " * 2500 + "}", 20, {"k": 1}),  # 15,000 tokens each
]


def _repairs_seen(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The text of every repair pass tried, in order (the pass starts by unwrapping it)."""
    seen: list[str] = []
    unwrap = tool_args._unwrap

    def spy(raw: str) -> str:
        seen.append(raw)
        return unwrap(raw)

    monkeypatch.setattr(tool_args, "_unwrap", spy)
    return seen


def _buffered(arguments: list[str]) -> tuple[list[dict[str, Any]], int, int, int]:
    from gateway.messages.from_chat.message import from_chat

    fixed = {"repaired": 0, "unrepairable": 0}
    completion = {
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"call_{i}",
                            "type": "function",
                            "function": {"name": "write", "arguments": a},
                        }
                        for i, a in enumerate(arguments)
                    ],
                },
            }
        ]
    }
    budget = tool_args.RepairBudget()
    message = from_chat(
        completion,
        model="m",
        signing_key=b"k" * 32,
        repair_budget=budget,
        on_bad_tool_args=lambda: fixed.__setitem__("unrepairable", fixed["unrepairable"] + 1),
        on_repaired=lambda: fixed.__setitem__("repaired", fixed["repaired"] + 1),
    )
    inputs = [block["input"] for block in message["content"]]
    return inputs, fixed["repaired"], fixed["unrepairable"], budget.refused


def _streamed(arguments: list[str]) -> tuple[list[dict[str, Any]], int, int, int]:
    """Parallel calls in one read: the first streams, the others wait and are sent whole
    when its block closes (all their repairs in one step)."""
    from gateway.messages.from_chat.aggregate import aggregate
    from gateway.messages.stream.translator import StreamTranslator
    from gateway.text import jsonutil

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return jsonutil.dumpb(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )

    payloads = [chunk({"role": "assistant", "content": None})]
    payloads += [
        chunk(
            {
                "tool_calls": [
                    {
                        "index": i,
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": "write", "arguments": a},
                    }
                ]
            }
        )
        for i, a in enumerate(arguments)
    ]
    payloads += [chunk({}, "tool_calls"), b"[DONE]"]
    translator = StreamTranslator(model="m", message_id="msg_1", signing_key=b"k" * 32)
    message = aggregate(translator.feed_all(payloads) + translator.eof())
    inputs = [block["input"] for block in message["content"]]
    return inputs, *translator.tool_arguments_fixed, translator.tool_arguments_over_budget


@pytest.mark.parametrize("path", [_buffered, _streamed], ids=["buffered", "streamed"])
@pytest.mark.parametrize(
    ("raw", "calls", "value"), [r[1:] for r in REPLIES], ids=[r[0] for r in REPLIES]
)
def test_a_reply_of_many_broken_calls_costs_a_bounded_repair(
    monkeypatch: pytest.MonkeyPatch, path: Any, raw: str, calls: int, value: dict[str, Any]
) -> None:
    """What the repairs of one reply read is bounded as a whole (the characters, calls and
    tokens of the passes tried), however many broken calls it holds; a call past the budget
    is ``{}`` and counted as unrepairable (and as over the budget), never dropped."""
    seen = _repairs_seen(monkeypatch)
    inputs, repaired, unrepairable, over_budget = path([raw] * calls)
    assert len(inputs) == calls
    assert repaired + unrepairable == calls
    assert over_budget == unrepairable  # each call alone is repairable
    assert inputs[0] == value
    assert all(i in (value, {}) for i in inputs)
    assert sum(i == value for i in inputs) == repaired
    assert len(seen) <= tool_args.MAX_REPLY_REPAIRS
    assert sum(map(len, seen)) <= tool_args.MAX_REPLY_REPAIR_CHARS
    read = sum(
        min(len(list(tool_args._TOKEN.finditer(text))), tool_args.MAX_REPAIR_TOKENS + 1)
        for text in seen
    )
    assert read <= tool_args.MAX_REPLY_REPAIR_TOKENS + tool_args.MAX_REPAIR_TOKENS + 1


@pytest.mark.parametrize(
    ("spent", "left"),
    [
        ({"calls": 0}, False),
        ({"chars": 8}, False),
        ({"tokens": 0}, False),
        ({"seconds": 0.0}, False),
        ({"chars": 9}, True),
        ({}, True),
    ],
)
def test_a_repair_the_budget_cannot_afford_is_not_tried(
    monkeypatch: pytest.MonkeyPatch, spent: dict[str, Any], left: bool
) -> None:
    seen = _repairs_seen(monkeypatch)
    budget = tool_args.RepairBudget(**spent)
    result = repair_arguments("{'a': 1,}", budget)  # 9 characters
    assert result == (Repaired({"a": 1}, "repaired") if left else Repaired({}, "failed"))
    assert len(seen) == int(left)
    assert budget.refused == int(not left)
    assert repair_arguments('{"a": 1}', budget).outcome == "ok"  # strict JSON costs nothing
