"""Mid-stream continuation against a real llama.cpp server (the demo model, xllamacpp).

The real gateway (``kind = "llamacpp"``) sits in front of a small HTTP proxy
(tests/cutting_proxy.py, 127.0.0.1 only) that forwards everything to the engine and, for the
first ``cuts`` streamed chat completions, resets the connection (no end of the chunked body)
after ``after`` SSE events of the reply: what the gateway sees when an engine dies mid-answer.

What holds, and why the continued text is not the uncut text
-------------------------------------------------------------
The tiny demo model (gateway/demo/tinymodel.py) picks its next token from the current token
alone, and by construction no prompt ever contains the reply's tokens: its pieces hold a
space before a word, where the tokenizer always cuts. So a prefill ``"Hello! I am"`` ends the
prompt on ordinary BPE tokens, and the model answers them as it answers any other prompt: the
whole ANSWER from its start. A real model continues the sentence; this one cannot, so a reply
cut after ``k`` pieces and continued is exactly ``pieces[:k] + ANSWER`` (a cut before any
text: exactly the uncut ANSWER). What this pins is everything around the model:

* the stream the client sees is one well-formed reply, ``end_turn`` (or ``max_tokens``),
  no error event, the continuation spliced into the open block;
* the continuation request carries the streamed part as a final assistant message and
  llama-server *continues* it: the prompt it renders ends with that text, no end of turn
  (a new turn would end ``<|im_start|>assistant\\n<think>`` and this model would reason
  first); ``max_tokens`` lowered by what was generated;
* a cut mid-thinking goes back as ``reasoning_content`` (gateway/messages/continuation.py,
  ``_REASONING_FIELD_KINDS``): llama-server leaves it open and parses the reply as reasoning
  until ``</think>`` (pinned below on the engine alone); sent inline as ``<think>...`` it
  parsed none of the continuation as reasoning.

Facts of llama-server seen here (xllamacpp 2026.10): a final assistant message is rendered
after the generation prompt, so with thinking on the prompt holds the template's ``<think>``
and then the message's own ``<think>\\n`` (two openers; harmless for this model, and nothing a
client can change); a trailing space in the prefill is kept as is (its own token).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.demo import tinymodel
from gateway.demo.llama import LlamaServer
from tests.anthropic_stream_check import check_stream
from tests.cutting_proxy import CuttingProxy
from tests.procs import Proc, post

pytestmark = [pytest.mark.e2e, pytest.mark.llamacpp, pytest.mark.timeout(180)]

HI = [{"role": "user", "content": "hi"}]
REASONING, ANSWER = tinymodel.REASONING_TEXT, tinymodel.ANSWER_TEXT
HEADERS = {"anthropic-version": "2023-06-01"}


def _running_proxy(llama: LlamaServer) -> Iterator[CuttingProxy]:
    assert llama.root_url is not None
    p = CuttingProxy(llama.root_url)
    p.start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def proxy(llama_upstream: LlamaServer) -> Iterator[CuttingProxy]:
    yield from _running_proxy(llama_upstream)


@pytest.fixture
def second_proxy(llama_upstream: LlamaServer) -> Iterator[CuttingProxy]:
    """Another way to the same engine: a second replica as the gateway sees it."""
    yield from _running_proxy(llama_upstream)


def _config(*base_urls: str) -> str:
    urls = (
        f"base_url = {json.dumps(base_urls[0])}"
        if len(base_urls) == 1
        else f"base_urls = {json.dumps(list(base_urls))}"
    )
    return f"""
[upstreams.llama]
{urls}
kind = "llamacpp"
max_continuations = 2

[[models]]
name = "demo"
upstream = "llama"
upstream_model = "demo"
context_window = 1024
"""


def _stream(
    base: str, headers: dict[str, str] | None = None, **body: Any
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A streamed reply through the gateway: its checked events and what they add up to."""
    # greedy (this model is deterministic at any temperature; a real one needs it for the
    # continued text to be comparable)
    req = {
        "model": "demo",
        "max_tokens": 200,
        "messages": HI,
        "stream": True,
        "temperature": 0,
        **body,
    }
    status, _, raw = post(
        f"{base}/llm/v1/messages", req, {**HEADERS, **(headers or {})}, timeout=60
    )
    assert status == 200, raw[:500]
    events = check_stream(raw)
    blocks: list[dict[str, Any]] = []
    for ev in events:
        if ev["type"] == "content_block_start":
            blocks.append({"type": ev["content_block"]["type"], "text": ""})
        elif ev["type"] == "content_block_delta":
            delta = ev["delta"]
            blocks[-1]["text"] += (
                delta.get("text") or delta.get("thinking") or delta.get("partial_json") or ""
            )
    [final] = [ev for ev in events if ev["type"] == "message_delta"] or [{}]
    return events, {
        "blocks": [(b["type"], b["text"]) for b in blocks],
        "stop_reason": final.get("delta", {}).get("stop_reason"),
        "errors": [ev for ev in events if ev["type"] == "error"],
        "usage": final.get("usage"),
    }


def _engine_prompt(llama: LlamaServer, chat: dict[str, Any]) -> str:
    """The prompt llama-server renders for a chat request (its /apply-template route)."""
    keys = ("messages", "tools", "chat_template_kwargs")
    _, _, raw = post(f"{llama.root_url}/apply-template", {k: chat[k] for k in keys if k in chat})
    return str(json.loads(raw)["prompt"])


def _prefill(proxy: CuttingProxy) -> dict[str, Any] | None:
    """The assistant message the continuation carried (None: none was sent, or it carried
    no prefill: the cut came before any text)."""
    assert len(proxy.chats) <= 2
    if len(proxy.chats) < 2:
        return None
    last = proxy.chats[1]["messages"][-1]
    return last if last["role"] == "assistant" else None


def _pieces_prefix(pieces: list[str], text: str) -> int:
    """How many of the reply's pieces ``text`` is (it is always whole pieces)."""
    for k in range(len(pieces) + 1):
        if "".join(pieces[:k]) == text:
            return k
    raise AssertionError(f"{text!r} is not a prefix of whole pieces")


@pytest.mark.parametrize("how", ["reset", "eof"])
def test_a_text_answer_cut_after_every_event_is_continued(
    how: str,
    proxy: CuttingProxy,
    llama_upstream: LlamaServer,
    tiny_model: Any,
    gateway_factory: Callable[..., tuple[Proc, str]],
) -> None:
    """Thinking off. The stream is cut after event 1, 2, ... of the engine's reply until a
    stream has fewer events; every reply is well-formed, end_turn, no error, and is the
    streamed part followed by the model's answer to the prefilled prompt."""
    _, expect = tiny_model
    answer, pieces = expect["answer"], expect["answer_pieces"]
    _, base = gateway_factory(_config(proxy.base_url))
    off = {"thinking": {"type": "disabled"}}
    proxy.arm(0, 0)
    _, uncut = _stream(base, **off)
    assert uncut["blocks"] == [("text", answer)] and uncut["stop_reason"] == "end_turn"
    continued: list[int] = []  # how many pieces each continued reply had streamed
    # llama.cpp's events: the role, two prompt-progress chunks (the gateway asks for
    # return_progress), a piece each, the finish, the usage, [DONE]
    finish_event = 3 + len(pieces) + 1
    for after in range(1, 40):
        proxy.arm(1, after, how)
        _, got = _stream(base, **off)
        if not proxy.cut:  # the whole stream had fewer events: every point was tried
            break
        assert got["errors"] == [] and got["stop_reason"] == "end_turn", (after, got)
        prefill = _prefill(proxy)
        if after >= finish_event:
            assert len(proxy.chats) == 1, after  # the answer was whole
        if prefill is None:  # cut before any text (the role, the prompt's progress): asked
            # again as it was; or after the finish (before the usage, [DONE]): not asked again
            assert len(proxy.chats) == (1 if after >= finish_event else 2), after
            assert got["blocks"] == uncut["blocks"], after  # the same answer, equal
            continue
        assert set(prefill) == {"role", "content"}  # no reasoning: thinking is off
        k = _pieces_prefix(pieces, prefill["content"])
        continued.append(k)
        # the model cannot continue a prefill (module docstring): it answers it whole
        assert got["blocks"] == [("text", prefill["content"] + answer)], after
        assert got["usage"]["output_tokens"] == k + expect["completion_tokens_plain"]
        chat = proxy.chats[1]
        assert chat["max_tokens"] == 200 - k  # the pieces streamed, one token each
        # llama-server continued the assistant message: its prompt ends with it, no end of
        # turn and no new generation prompt after it
        assert _engine_prompt(llama_upstream, chat).endswith(
            "<|im_start|>assistant\n<think></think><think>\n\n</think>\n\n" + prefill["content"]
        )
    else:
        raise AssertionError("the stream never ended")
    # a cut after every piece but the last (after the last, the finish is all that is left)
    assert continued[0] == 1 and continued == sorted(continued)
    assert set(continued) >= set(range(1, len(pieces)))


def test_a_thinking_answer_cut_anywhere_is_continued(
    proxy: CuttingProxy,
    llama_upstream: LlamaServer,
    tiny_model: Any,
    gateway_factory: Callable[..., tuple[Proc, str]],
) -> None:
    """Thinking on. Cut mid-thought: the thought goes back as ``reasoning_content`` with no
    content, which llama-server leaves open, and the continuation is read as reasoning (this
    model then answers: its ANSWER ends the thinking block, no text block follows). Cut in
    the text: the thinking block is the uncut one exactly, the text as without thinking."""
    _, expect = tiny_model
    answer, reasoning = expect["answer"], expect["reasoning"]
    r_pieces, pieces = expect["reasoning_pieces"], expect["answer_pieces"]
    _, base = gateway_factory(_config(proxy.base_url))
    on = {"thinking": {"type": "adaptive"}}
    proxy.arm(0, 0)
    _, uncut = _stream(base, **on)
    assert uncut["blocks"] == [("thinking", reasoning), ("text", answer)]
    mid_thought = mid_text = 0
    for after in range(4, 3 + len(r_pieces) + len(pieces) + 1):  # every piece event
        proxy.arm(1, after)
        _, got = _stream(base, **on)
        assert proxy.cut == 1 and got["errors"] == [] and got["stop_reason"] == "end_turn"
        prefill = _prefill(proxy)
        assert prefill is not None, after
        prompt = _engine_prompt(llama_upstream, proxy.chats[1])
        if not prefill["content"]:
            mid_thought += 1
            thought = prefill["reasoning_content"]
            k = _pieces_prefix(r_pieces, thought)
            assert k == after - 3
            assert prompt.endswith("<|im_start|>assistant\n<think><think>\n" + thought)
            assert got["blocks"] == [("thinking", thought + answer)], after
        else:
            mid_text += 1
            assert prefill["reasoning_content"] == reasoning
            k = _pieces_prefix(pieces, prefill["content"])
            assert k == after - 3 - len(r_pieces)
            assert prompt.endswith(f"<think>\n{reasoning}\n</think>\n\n{prefill['content']}")
            assert got["blocks"] == [("thinking", reasoning), ("text", prefill["content"] + answer)]
    assert (mid_thought, mid_text) == (len(r_pieces), len(pieces))


def test_llama_server_reads_a_continued_thought_as_reasoning(llama_upstream: LlamaServer) -> None:
    """The engine alone, streamed: a prefill whose open ``reasoning_content`` ends in
    ``<think>`` (the one prompt ending after which this model thinks) gets its thought back as
    ``reasoning_content`` and the answer after its ``</think>`` as ``content``; the same
    prefill inline in ``content`` gets everything back as ``content``, ``</think>`` too (what
    the gateway sent before: a continued thought reached the client as text)."""

    def ask(last: dict[str, Any]) -> tuple[str, str]:
        body = {"model": "demo", "stream": True, "messages": [*HI, {"role": "assistant", **last}]}
        status, _, raw = post(f"{llama_upstream.base_url}/chat/completions", body)
        assert status == 200, raw
        deltas = [
            c["delta"]
            for event in raw.decode().split("\n\n")
            if event.startswith("data: {")
            for c in json.loads(event[len("data: ") :])["choices"]
        ]
        return (
            "".join(d.get("reasoning_content") or "" for d in deltas),
            "".join(d.get("content") or "" for d in deltas),
        )

    reasoning, content = ask({"content": "", "reasoning_content": "<think>"})
    assert (reasoning, content) == (REASONING, ANSWER)
    reasoning, content = ask({"content": "<think>"})
    assert (reasoning, content) == ("", f"{REASONING}</think>\n\n{ANSWER}")
    # a trailing space is kept as it is (on its own a token a BPE model seldom sees there)
    prompt = _engine_prompt(
        llama_upstream, {"messages": [*HI, {"role": "assistant", "content": "Hello! I am "}]}
    )
    assert prompt.endswith("</think>\n\nHello! I am ")


TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]


# what the demo model writes, a character a token, for TOOLS (the gateway makes it a tool_use)
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "demo"}}\n</tool_call>'


def test_a_text_tool_call_cut_midway(
    proxy: CuttingProxy,
    llama_upstream: LlamaServer,
    gateway_factory: Callable[..., tuple[Proc, str]],
) -> None:
    """The demo model writes its call as text, a character a token (gateway/demo/toolcall.py),
    which the gateway's text parser makes a tool_use block. Cut before the call: asked again,
    the same call. Cut inside the call text (a possible opener ``<tool_`` held, the open
    block, the whole body before ``</tool_call>``, a partial close): the gateway held all of
    it, so the client has seen none of it; the held text is dropped and the request is sent
    again with no prefill (nothing else was shown), and the model writes the call again
    whole: the same tool_use block as uncut, ``tool_use``, no error, the same output tokens.
    (Prefilled with ``<tool_call>\n{"nam``, this model's copy head resumed a character or so
    off, ``"namame"``, and the garbled call reached the client as text.)"""
    _, base = gateway_factory(_config(proxy.base_url))
    proxy.arm(0, 0)
    _, uncut = _stream(base, tools=TOOLS)
    assert uncut["blocks"] == [("tool_use", '{"city":"demo"}')]
    assert uncut["stop_reason"] == "tool_use"
    assert uncut["usage"]["output_tokens"] >= len(CALL_TEXT)
    proxy.arm(1, 2)  # the role and a prompt-progress chunk
    _, got = _stream(base, tools=TOOLS)
    assert proxy.cut == 1 and _prefill(proxy) is None and len(proxy.chats) == 2
    assert got["blocks"] == uncut["blocks"] and got["errors"] == []
    # the role, two prompt-progress chunks, then a character of the call an event
    for chars in (1, 6, 11, 17, 40, len(CALL_TEXT) - 12, len(CALL_TEXT) - 1):
        proxy.arm(1, 3 + chars)
        _, got = _stream(base, tools=TOOLS)
        assert proxy.cut == 1 and len(proxy.chats) == 2, chars
        assert _prefill(proxy) is None, chars  # the held call text is not sent back
        first, again = proxy.chats
        assert again["messages"] == first["messages"], chars
        assert again["max_tokens"] == first["max_tokens"] == 200, chars  # nothing was shown
        assert got["errors"] == [] and got["stop_reason"] == "tool_use", (chars, got)
        assert got["blocks"] == uncut["blocks"], (chars, got)
        assert got["usage"]["output_tokens"] == uncut["usage"]["output_tokens"], chars


def test_a_replica_that_cuts_every_stream_is_continued_on_the_other(
    proxy: CuttingProxy,
    second_proxy: CuttingProxy,
    tiny_model: Any,
    gateway_factory: Callable[..., tuple[Proc, str]],
) -> None:
    """``base_urls`` = two proxies to the one engine; the first cuts every stream after a
    piece of text. Each session's reply is whole and well-formed; a cut one was continued on
    the other replica (the cut one is ejected), with the text so far as the prefill."""
    _, expect = tiny_model
    answer = expect["answer"]
    cutting, healthy = proxy, second_proxy
    _, base = gateway_factory(_config(cutting.base_url, healthy.base_url))
    cutting.arm(99, 4)  # the role, two prompt-progress chunks, one piece
    healthy.arm(0, 0)
    off = {"thinking": {"type": "disabled"}}
    for n in range(32):  # sessions are homed by rendezvous hashing of the replicas' URLs
        _, got = _stream(base, {"x-claude-code-session-id": f"cont-session-{n}"}, **off)
        assert got["errors"] == [] and got["stop_reason"] == "end_turn", n
        assert got["blocks"] in (
            [("text", answer)],
            [("text", expect["answer_pieces"][0] + answer)],
        ), n
        if cutting.cut and n >= 7:
            break
    assert cutting.cut >= 1  # some session was homed on it before it was ejected
    assert cutting.cut == len(cutting.chats)  # it answered no stream whole
    continued = [c for c in healthy.chats if c["messages"][-1]["role"] == "assistant"]
    assert len(continued) == cutting.cut  # every cut one went on on the other replica
    assert all(c["messages"][-1]["content"] == expect["answer_pieces"][0] for c in continued)
