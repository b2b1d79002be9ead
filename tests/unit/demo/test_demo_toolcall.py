"""The demo model's tool call (gateway/demo/toolcall.py): the call line the chat template writes,
the copy tokens it is written in, and the attention scores that copy it back out.

The template is rendered here with jinja2 (llama.cpp renders it for real in
tests/e2e/test_demo_tool_loop.py); the scores are computed from RoPE's formula.
"""

from __future__ import annotations

import json
import re

import pytest

from gateway.demo import tinymodel, toolcall

jinja2 = pytest.importorskip("jinja2")

BASH = {
    "type": "function",
    "function": {
        "name": "Bash",
        "description": "Run a command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
            "required": ["command"],
        },
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "hours": {"type": "array"},
                "extra": {"type": "object"},
                "any": {},
            },
            "required": ["city", "days", "metric", "hours", "extra", "any"],
        },
    },
}
NO_PARAMS = {"type": "function", "function": {"name": "ping", "parameters": {}}}
NO_SCHEMA = {"type": "function", "function": {"name": "noop"}}


def _render(messages: list[dict], tools: list[dict] | None, **kw: object) -> str:
    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda value: json.dumps(value)
    template = env.from_string(tinymodel.CHAT_TEMPLATE)
    return template.render(messages=messages, tools=tools, add_generation_prompt=True, **kw)


def _copied(prompt: str) -> str | None:
    """The text the copy tokens spell, up to the first STOP; None without copy tokens."""
    slots = re.findall(r"<\|copy-stop\|>|<\|[\s\S]\|>", prompt)
    if not slots:
        return None
    assert len(slots) == toolcall.N_SLOTS
    text = "".join("\0" if s == toolcall.STOP else s[2:-2] for s in slots)
    assert text.index("\0") == text.rstrip("\0").__len__()  # STOP only after the call
    return text.split("\0", 1)[0]


HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("tools", "name", "arguments"),
    [
        ([WEATHER, BASH], "Bash", toolcall.BASH_ARGUMENTS),  # Bash preferred wherever it is
        (
            [WEATHER],
            "get_weather",
            {"city": "demo", "days": 1, "metric": True, "hours": [], "extra": {}, "any": None},
        ),
        ([NO_PARAMS, BASH], "Bash", toolcall.BASH_ARGUMENTS),
        ([NO_PARAMS], "ping", {}),
        ([NO_SCHEMA], "noop", {}),
    ],
)
def test_template_writes_the_call_that_demo_call_describes(tools, name, arguments):
    assert toolcall.demo_call(tools) == (name, arguments)
    prompt = _render(HI, tools)
    text = _copied(prompt)
    assert text == toolcall.call_text(name, arguments)
    assert json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")) == {
        "name": name,
        "arguments": arguments,
    }
    # the slots end the user turn; the fixed tail the head's distance counts follows
    assert prompt.endswith(toolcall.STOP + tinymodel._CALL_TAIL)


def test_bash_call_runs_a_harmless_echo():
    assert toolcall.BASH_ARGUMENTS["command"] == "echo demo-tool-loop"
    assert set(toolcall.call_text("Bash", toolcall.BASH_ARGUMENTS)) <= set(toolcall.COPY_CHARS)


@pytest.mark.parametrize(
    ("messages", "tools"),
    [
        (HI, None),  # no tools: the prompt of before, thinking opened
        (HI, []),
        # a tool result since the last assistant turn: answer in text, so the loop ends
        (
            [
                *HI,
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "a",
                            "type": "function",
                            "function": {"name": "Bash", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "a", "content": "demo-tool-loop"},
            ],
            [BASH],
        ),
        (
            [
                *HI,
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "a",
                            "type": "function",
                            "function": {"name": "Bash", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "a", "content": "demo-tool-loop"},
                {"role": "user", "content": "and now?"},
            ],
            [BASH],
        ),
        # a name too long for the slots: no call line
        (HI, [{"type": "function", "function": {"name": "x" * toolcall.N_SLOTS}}]),
    ],
)
def test_no_call_line_without_tools_or_after_a_tool_result(messages, tools):
    prompt = _render(messages, tools)
    assert _copied(prompt) is None
    if not tools:
        assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>"


def test_claude_code_turn_ending_in_a_system_message_calls():
    """Claude Code puts its environment in a system message after the user's."""
    messages = [*HI, {"role": "system", "content": [{"type": "text", "text": "# Environment"}]}]
    prompt = _render(messages, [BASH])
    assert _copied(prompt) == toolcall.call_text("Bash", toolcall.BASH_ARGUMENTS)
    assert "# Environment" + toolcall.copy_token("<") in prompt


def test_a_new_user_turn_after_a_text_answer_calls_again():
    messages = [*HI, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "x"}]
    assert _copied(_render(messages, [BASH])) == toolcall.call_text("Bash", toolcall.BASH_ARGUMENTS)


def test_earlier_calls_stay_out_of_the_prompt():
    """llama.cpp learns a tool-call syntax from how the template writes earlier calls, and then
    parses replies itself; written nowhere, the call reaches the gateway as content."""
    messages = [
        *HI,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "out"},
    ]
    prompt = _render(messages, [BASH])
    assert "<tool_call>" not in prompt and "<|im_start|>assistant\n<|im_end|>" in prompt


def test_copy_tokens_one_per_character_with_distinct_codes():
    tokens = toolcall.copy_tokens()
    assert len(tokens) == len(set(tokens)) == len(toolcall.COPY_CHARS) + 1
    codes = [toolcall.code(t) for t in tokens]
    assert len(set(codes)) == len(codes) and min(codes) == 0 == toolcall.code(toolcall.STOP)
    assert max(codes) < 2**toolcall.CODE_BITS
    plan = tinymodel._plan()
    for text in tokens:
        emitted = plan.copies[plan.ids[text]]
        if text == toolcall.STOP:
            assert emitted == plan.ids["<|im_end|>"]
        else:  # the byte token of the character
            assert plan.tokens[emitted] == tinymodel._spell(text[2:-2])
    # a prompt that writes copy tokens counts one token each
    assert tinymodel.count_tokens("<|a|><| |><|\n|>" + toolcall.STOP) == 4


def test_the_copied_slot_outscores_every_other_within_reach():
    """Generated token i reads slot i: every other copy token is 1..N_SLOTS positions off."""
    peak = toolcall.score_curve(0)
    rivals = max(
        toolcall.score_curve(d) for d in range(-toolcall.N_SLOTS, toolcall.N_SLOTS + 1) if d
    )
    assert peak - rivals >= toolcall.SCORE_MARGIN * 1.0
    # far above every non-copy token's score of 0, however long the prompt (131,072 tokens)
    assert peak > 100


def test_copy_distance_counts_the_slots_and_the_tail():
    assert tinymodel.count_tokens(tinymodel._CALL_TAIL) == 9
    assert tinymodel.copy_distance() == toolcall.N_SLOTS + 9 - 1


FETCH = {
    "type": "function",
    "function": {
        "name": "web_fetch",
        "parameters": {
            "type": "object",
            "properties": {"url": {"type": "string"}},
            "required": ["url"],
        },
    },
}
LONG = "http://example.com/" + "a" * toolcall.MAX_URL


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("Read http://127.0.0.1:8000/page.html please", "http://127.0.0.1:8000/page.html"),
        ("see https://example.com/a?b=1&c=(2)#x.", "https://example.com/a?b=1&c=(2)#x"),
        ("two:\nhttps://a.example/one, https://b.example/two", "https://a.example/one"),
        ('quoted "http://q.example/x" then http://ok.example/', "http://ok.example/"),
        ("non-ASCII http://ex\u00e4mple.com/ only", "demo"),
        (f"too long {LONG}", "demo"),
        ("ftp://example.com/ and http:// alone", "demo"),
        ("no URL here", "demo"),
        (" " * toolcall.URL_SCAN + "http://late.example/", "demo"),  # past the scanned part
    ],
)
def test_a_url_parameter_gets_the_first_url_of_the_last_user_message(text, url):
    assert toolcall.demo_call([FETCH], text) == ("web_fetch", {"url": url})
    messages = [
        {"role": "user", "content": "earlier http://old.example/ turn"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": text}]},
    ]
    copied = _copied(_render(messages, [FETCH]))
    assert copied == toolcall.call_text("web_fetch", {"url": url})


def test_only_a_string_url_parameter_is_filled():
    number = json.loads(json.dumps(FETCH))
    number["function"]["parameters"]["properties"]["url"] = {"type": "integer"}
    text = "Read http://127.0.0.1/page"
    assert toolcall.demo_call([number], text) == ("web_fetch", {"url": 1})
    assert _copied(_render([{"role": "user", "content": text}], [number])) == (
        toolcall.call_text("web_fetch", {"url": 1})
    )
