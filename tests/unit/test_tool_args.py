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
    ("{'path': '/etc/hosts', 'recursive': True, 'limit': None}",
     {"path": "/etc/hosts", "recursive": True, "limit": None}),
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
    ('"{\'a\': True}"', {"a": True}),
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
    ('{"file_path": "/a.py", "content": "def f():\n    return 1\n',
     {"file_path": "/a.py", "content": "def f():\n    return 1\n"}),
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
@given(st.dictionaries(st.text(), st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8)))
def test_a_cut_object_repairs_to_an_object(value: dict[str, Any]) -> None:
    """Whatever prefix of a real object a model is cut at, the result is an object."""
    from gateway.text import jsonutil

    text = jsonutil.dumps(value)
    assert repair_arguments(text) == Repaired(value, "ok")
    for end in range(1, len(text), max(1, len(text) // 16)):
        assert type(repair_arguments(text[:end]).value) is dict
