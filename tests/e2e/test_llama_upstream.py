"""llama.cpp's server (xllamacpp) serving the tiny model, asked directly: no gateway.

These pin what the gateway relies on from this upstream, as observed:

* jinja mode splits the ``<think>`` part into ``reasoning_content``; the ``</think>``, the
  paragraph break after it and ``<|im_end|>`` produce no delta, yet count as completion tokens;
* ``chat_template_kwargs: {"enable_thinking": false}`` is honoured (no ``reasoning_content``);
* a matched stop string is cut from the text and reported only as ``finish_reason: "stop"``:
  the OpenAI-compatible reply has no field naming it;
* ``max_tokens`` reached -> ``finish_reason: "length"``;
* a prompt longer than a slot's context -> HTTP 400 with
  ``{"error": {"code": 400, "type": "exceed_context_size_error", "message",
  "n_prompt_tokens", "n_ctx"}}``, also for ``stream: true`` (before any SSE byte);
* concurrent generations overflowing a shared (unified) KV cache end each stream with
  ``data: {"error": {"code": 500, "message": "Context size has been exceeded.",
  "type": "server_error"}}`` and no ``[DONE]``.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gateway.demo import toolcall
from gateway.demo.llama import LlamaServer, _assign
from tests.fixtures_llama import *  # noqa: F403 - the pytest fixtures
from tests.fixtures_llama import UNIFIED_CTX_SIZE
from tests.procs import require_demo_extra

pytestmark = [pytest.mark.e2e, pytest.mark.llamacpp]

HI = [{"role": "user", "content": "hi"}]
# "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>": 4 special tokens + 8 BPE
# tokens ("user", "\n", "hi", "\n", "ass", "ist", "ant", "\n")
HI_PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>"
HI_PROMPT_TOKENS = 12


def _post(url: str, body: dict[str, Any], timeout: float = 60) -> tuple[int, str, bytes]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.headers.get("Content-Type", ""), err.read()


def _chat(base: str, **body: Any) -> dict[str, Any]:
    status, _, raw = _post(f"{base}/chat/completions", {"model": "demo", **body})
    assert status == 200, raw
    return json.loads(raw)


def _sse_data(raw: bytes) -> list[str]:
    """The data payloads of an SSE body, in order (llama.cpp frames events with LF LF)."""
    text = raw.decode()
    assert text.endswith("\n\n"), text[-200:]
    out = []
    for event in text.split("\n\n")[:-1]:
        assert event.startswith("data: "), event
        out.append(event[len("data: ") :])
    return out


def _stream(base: str, **body: Any) -> list[str]:
    status, ctype, raw = _post(
        f"{base}/chat/completions", {"model": "demo", "stream": True, **body}
    )
    assert status == 200, raw
    assert ctype.startswith("text/event-stream"), ctype
    return _sse_data(raw)


# --- buffered ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "with_reasoning", "count_key"),
    [
        ({}, True, "completion_tokens_thinking"),
        ({"chat_template_kwargs": {"enable_thinking": True}}, True, "completion_tokens_thinking"),
        ({"chat_template_kwargs": {"enable_thinking": False}}, False, "completion_tokens_nothink"),
    ],
    ids=["default", "thinking-on", "thinking-off"],
)
def test_buffered_reply_is_the_known_text(
    llama_server, tiny_model, extra, with_reasoning, count_key
):
    expect = tiny_model[1]
    reply = _chat(llama_server, messages=HI, **extra)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop"
    message = choice["message"]
    assert message["content"] == expect["answer"]
    assert message.get("reasoning_content") == (expect["reasoning"] if with_reasoning else None)
    assert reply["usage"]["completion_tokens"] == expect[count_key]
    assert reply["model"] == "demo"  # the server's alias
    prompt_tokens = HI_PROMPT_TOKENS + (0 if with_reasoning else 1)  # + "</think>"
    assert reply["usage"]["prompt_tokens"] == prompt_tokens


def test_plain_prompt_gets_the_answer_alone(llama_server, tiny_model):
    """A raw prompt not ending in <think> skips the reasoning chain (legacy completions route)."""
    expect = tiny_model[1]
    status, _, raw = _post(
        f"{llama_server}/completions",
        {"model": "demo", "prompt": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"},
    )
    assert status == 200, raw
    reply = json.loads(raw)
    assert reply["choices"][0]["text"] == expect["answer"]
    assert reply["usage"]["completion_tokens"] == expect["completion_tokens_plain"]


def test_max_tokens_ends_with_length(llama_server, tiny_model):
    expect = tiny_model[1]
    reply = _chat(llama_server, messages=HI, max_tokens=4)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["reasoning_content"] == "".join(expect["reasoning_pieces"][:4])
    assert choice["message"]["content"] == ""
    assert reply["usage"]["completion_tokens"] == 4


def test_stop_sequence_is_cut_and_not_reported(llama_server, tiny_model):
    expect = tiny_model[1]
    stop_word = expect["answer_pieces"][3]  # " demo"
    reply = _chat(llama_server, messages=HI, stop=[stop_word, "never-there"])
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == "".join(expect["answer_pieces"][:3])
    # llama.cpp names no matched stop string anywhere in the OpenAI-compatible reply
    assert set(choice) == {"finish_reason", "index", "message"}
    assert stop_word not in json.dumps(reply)
    n_reason = len(expect["reasoning_pieces"])
    assert reply["usage"]["completion_tokens"] == n_reason + 2 + 4  # the stop token counts


# --- streamed ---------------------------------------------------------------------------------


def _deltas(payloads: list[str], field: str) -> str:
    return "".join(
        c["delta"].get(field) or ""
        for p in payloads
        if p != "[DONE]"
        for c in json.loads(p)["choices"]
    )


@pytest.mark.parametrize(
    ("extra", "with_reasoning", "count_key"),
    [
        ({}, True, "completion_tokens_thinking"),
        ({"chat_template_kwargs": {"enable_thinking": False}}, False, "completion_tokens_nothink"),
    ],
    ids=["thinking", "no-thinking"],
)
def test_stream_chunks(llama_server, tiny_model, extra, with_reasoning, count_key):
    expect = tiny_model[1]
    payloads = _stream(llama_server, messages=HI, stream_options={"include_usage": True}, **extra)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert _deltas(payloads, "reasoning_content") == (expect["reasoning"] if with_reasoning else "")
    assert _deltas(payloads, "content") == expect["answer"]
    # one delta per emitted word-piece: the control tokens and "\n\n" produce none
    pieces = expect["answer_pieces"] + (expect["reasoning_pieces"] if with_reasoning else [])
    assert len(chunks) == 1 + len(pieces) + 2
    finish, usage = chunks[-2], chunks[-1]
    assert finish["choices"] == [{"finish_reason": "stop", "index": 0, "delta": {}}]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == expect[count_key]
    assert all(c["id"] == chunks[0]["id"] for c in chunks)


def test_stream_without_include_usage_has_no_usage_chunk(llama_server):
    chunks = [json.loads(p) for p in _stream(llama_server, messages=HI)[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert not any("usage" in c for c in chunks)


def test_stream_length_and_stop(llama_server, tiny_model):
    expect = tiny_model[1]
    length = _stream(llama_server, messages=HI, max_tokens=4)
    assert json.loads(length[-2])["choices"][0]["finish_reason"] == "length"
    assert _deltas(length, "reasoning_content") == "".join(expect["reasoning_pieces"][:4])
    stop = _stream(llama_server, messages=HI, stop=[expect["answer_pieces"][3]])
    last = json.loads(stop[-2])["choices"][0]
    assert last == {"finish_reason": "stop", "index": 0, "delta": {}}
    assert _deltas(stop, "content") == "".join(expect["answer_pieces"][:3])


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_context_overflow_is_a_400_before_any_byte(llama_server, stream):
    n_ctx = 1024  # 2048 shared by 2 slots
    status, ctype, raw = _post(
        f"{llama_server}/chat/completions",
        {"model": "demo", "stream": stream, "messages": [{"role": "user", "content": "x" * 1100}]},
    )
    assert status == 400
    assert ctype.startswith("application/json")
    body = json.loads(raw)
    n_prompt = HI_PROMPT_TOKENS - 1 + 1100  # "hi" is one token, "x" * 1100 is 1100
    assert body == {
        "error": {
            "code": 400,
            "message": f"request ({n_prompt} tokens) exceeds the available context size "
            f"({n_ctx} tokens), try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": n_prompt,
            "n_ctx": n_ctx,
        }
    }


def test_concurrent_overflow_of_shared_context_errors_mid_stream(llama_unified):
    """Two slots sharing a 256-token KV cache, each asked for 200 tokens: both streams break."""
    results: list[bytes] = []

    def run(i: int) -> None:
        body = {
            "model": "demo",
            "stream": True,
            "max_tokens": 200,
            "ignore_eos": True,  # keep generating past <|im_end|>
            "messages": [{"role": "user", "content": f"hello {i}"}],
        }
        status, _, raw = _post(f"{llama_unified.base_url}/chat/completions", body)
        assert status == 200
        results.append(raw)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 2
    broken = [_sse_data(raw) for raw in results if b'"error"' in raw]
    assert broken, "no stream overflowed the shared context"
    for payloads in broken:
        assert json.loads(payloads[-1]) == {
            "error": {
                "code": 500,
                "message": "Context size has been exceeded.",
                "type": "server_error",
            }
        }
        assert "[DONE]" not in payloads
        assert len(payloads) > 2  # content was already streamed
        assert 200 * 2 > UNIFIED_CTX_SIZE


# --- the routes count_tokens relies on ------------------------------------------------------


def test_apply_template_then_tokenize_counts_the_prompt(llama_upstream, tiny_model):
    root = llama_upstream.root_url
    status, _, raw = _post(f"{root}/apply-template", {"messages": HI})
    assert status == 200
    prompt = json.loads(raw)["prompt"]
    assert prompt == HI_PROMPT
    status, _, raw = _post(f"{root}/apply-template", {
        "messages": HI, "chat_template_kwargs": {"enable_thinking": False}})  # fmt: skip
    assert json.loads(raw)["prompt"] == HI_PROMPT + "</think>"
    status, _, raw = _post(f"{root}/tokenize", {"content": prompt, "parse_special": True})
    assert status == 200
    assert len(json.loads(raw)["tokens"]) == HI_PROMPT_TOKENS
    status, _, raw = _post(f"{root}/tokenize", {"content": "hello"})
    [hello] = json.loads(raw)["tokens"]  # one BPE token (ids under 256 are the bytes)
    assert hello >= 256
    status, _, raw = _post(f"{root}/tokenize", {"content": "xxx"})
    assert json.loads(raw)["tokens"] == list(b"xxx")  # a run of one letter: a token per byte


def test_count_tokens_reads_the_real_replies_without_a_new_encode(llama_upstream, monkeypatch):
    """llama-server's /apply-template reply is compact, so count_tokens sends its prompt string
    on as it came; its /tokenize reply is compact, so its ids are counted, not decoded
    (gateway/text/tokenizer_json.py)."""
    from gateway.text import jsonutil, tokenizer_json

    root = llama_upstream.root_url
    text = 'Grüße "quoted" \\ back\tslash\n' * 20
    status, _, raw = _post(
        f"{root}/apply-template", {"messages": [{"role": "user", "content": text}]}
    )
    assert status == 200
    encodes: list[object] = []
    monkeypatch.setattr(jsonutil, "dumpb", lambda obj: encodes.append(obj) or b"")
    body = tokenizer_json.llamacpp_tokenize_body(raw)
    assert body is not None and not encodes  # spliced
    assert json.loads(body)["content"] == json.loads(raw)["prompt"]
    status, _, counted = _post(f"{root}/tokenize", json.loads(body))
    assert status == 200
    assert tokenizer_json._compact_ids(counted) is not None  # counted without a decode
    assert tokenizer_json.token_count(counted, "tokens") == len(json.loads(counted)["tokens"])


def test_tokenizer_counts_as_the_python_encoder_does(llama_upstream):
    """tinymodel.count_tokens (which tests use to size prompts) is llama.cpp's tokenizer."""
    from gateway.demo.tinymodel import count_tokens

    samples = [
        Path(__file__).read_text(),  # code, prose, JSON-ish
        json.dumps({"tools": [{"name": "Read", "description": "Reads a file.\n\nUsage: ..."}]}),
        "Grüße, naïve café — 東京 ½ 2026-12-01 3.14159 can't won't\t\ttabs   spaces\r\n",
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    ]
    for text in samples:
        status, _, raw = _post(
            f"{llama_upstream.root_url}/tokenize", {"content": text, "parse_special": True}
        )
        assert status == 200
        assert len(json.loads(raw)["tokens"]) == count_tokens(text), text[:80]


def test_tools_get_a_text_call_that_llama_cpp_leaves_as_content(llama_server, tiny_model):
    """Offered tools, the model writes one call as text (gateway/demo/toolcall.py). The template
    writes tools itself and earlier calls nowhere, so llama.cpp adds no grammar that would bend
    the text and parses no call out of it: the gateway's text parser is the one that does."""
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip
    reply = _chat(llama_server, messages=HI, tools=tools)
    message = reply["choices"][0]["message"]
    assert message["content"] == toolcall.call_text("get_weather", {})
    assert not message.get("tool_calls") and reply["choices"][0]["finish_reason"] == "stop"
    answered = [*HI, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]  # fmt: skip
    reply = _chat(llama_server, messages=answered, tools=tools)
    assert reply["choices"][0]["message"]["content"] == tiny_model[1]["answer"]
    assert reply["choices"][0]["finish_reason"] == "stop"


# --- the launcher itself --------------------------------------------------------------------


class _Params:
    def __init__(self) -> None:
        self.n_batch = 2048
        self.kv_unified = False
        self.names: set[str] = set()
        self.sampling = type("S", (), {"temp": 0.8})()


@pytest.mark.parametrize(
    ("assignment", "attr", "value"),
    [
        ("n_batch=256", "n_batch", 256),
        ("kv_unified=true", "kv_unified", True),
        ("kv_unified=0", "kv_unified", False),
        ("names=a,b", "names", {"a", "b"}),
        ("sampling.temp=0.5", "sampling.temp", 0.5),
    ],
)
def test_extra_args_assign_typed_params(assignment, attr, value):
    params = _Params()
    _assign(params, assignment)
    target = params
    for part in attr.split("."):
        target = getattr(target, part)
    assert target == value


def test_server_is_healthy_and_owned(llama_upstream):
    assert llama_upstream.pid is not None
    with urllib.request.urlopen(f"{llama_upstream.root_url}/health", timeout=5) as resp:
        assert resp.status == 200


def test_start_failure_reports_the_log(tmp_path):
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"not a gguf")
    require_demo_extra()
    server = LlamaServer(str(bogus))
    with pytest.raises(RuntimeError, match="did not start"):
        server.start(timeout=30)
    assert server.pid is None
