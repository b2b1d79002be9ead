"""Mid-stream continuation (gateway/messages/continuation.py): a stream cut after part of its
text is sent again with the text as an assistant prefill, and the continuation is spliced into
the same translator: the client sees one well-formed stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway import errors
from gateway.local.normalise import ContentNormaliser
from gateway.messages import continuation
from gateway.messages.continuation import continuation_payload, relay
from gateway.messages.stream.pump import Timing
from gateway.messages.stream.splice import Continued
from gateway.messages.stream.translator import StreamTranslator
from gateway.ops.metrics import Metrics
from tests.anthropic_stream_check import check_stream

WHOLE = ["Hello", " from", " the", " stub", "."]

# a fresh registry: the tests read what a continuation counted
BUDGET = 2  # upstreams.X.max_continuations' default
REGISTRY = CollectorRegistry()
METRICS = Metrics(REGISTRY)


def _continuations() -> float:
    return sum(
        s.value
        for family in REGISTRY.collect()
        for s in family.samples
        if s.name == "llm_gateway_stream_continuations_total"
    )


def chunk(
    delta: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None
) -> bytes:
    body: dict[str, Any] = {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


ROLE = chunk({"role": "assistant", "content": ""})


def answer(pieces: list[str], *, cut: str | None = None, prompt: int = 12) -> list[bytes]:
    """A streamed answer of ``pieces``; ``cut``: "eof" (no finish), "inband" (a 500 error
    chunk), "raise" (reading fails) after them."""
    frames = [ROLE] + [chunk({"content": p}) for p in pieces]
    if cut == "eof":
        return [*frames, b'data: {"id":"c","choi']  # a partial last event, then EOF
    if cut == "inband":
        return [*frames, b'data: {"error":{"message":"engine died","code":500}}\n\n']
    if cut == "inband_split":  # the error event in two reads, its key in the first
        return [*frames, b'data: {"error":', b'{"message":"engine died","code":500}}\n\n']
    if cut == "raise":
        return [*frames, b"RAISE"]
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": len(pieces),
        "total_tokens": prompt + len(pieces),
    }
    return [*frames, chunk({}, "stop", usage), b"data: [DONE]\n\n"]


class FakeResponse:
    def __init__(self, frames: list[bytes]) -> None:
        self.frames = frames
        self.abandoned = False
        self.closed = False

    def progress(self) -> None:
        pass

    def release_if_complete(self, *, ended: bool = False) -> None:
        pass

    def abandon(self) -> None:
        self.abandoned = True

    async def chunks(self) -> AsyncIterator[bytes]:
        for frame in self.frames:
            if frame == b"RAISE":
                raise errors.UpstreamError("Upstream connection lost", status=500)
            if frame == b"STUCK":
                raise errors.UpstreamTimeout("Upstream stopped sending")
            yield frame

    async def __aenter__(self) -> FakeResponse:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.closed = True


class Histogram:
    def observe(self, value: float) -> None:
        pass


def make_call(kind: str = "vllm", max_tokens: int | None = 100) -> Any:
    payload: dict[str, Any] = {
        "model": "m",
        "stream": True,
        "messages": [{"role": "user", "content": "Say hello"}],
    }
    if max_tokens is not None:
        payload["max_tokens"] = max_tokens
    upstream = SimpleNamespace(kind=kind, name="up", max_continuations=BUDGET)
    return FakeCall(
        payload=json.dumps(payload).encode(),
        session="s1",
        route=SimpleNamespace(name="m", upstream=upstream),
        deps=SimpleNamespace(upstreams=None, metrics=METRICS),
    )


class FakeCall(SimpleNamespace):
    """The call a continuation reads (gateway.messages.continuation.Continuable): the chat
    request it sent is ``payload``, which a test may change."""

    def chat_request(self) -> dict[str, Any]:
        return json.loads(self.payload)  # type: ignore[no-any-return]


def translator(normaliser: ContentNormaliser | None = None) -> StreamTranslator:
    return StreamTranslator(
        model="m",
        message_id="msg_1",
        signing_key=b"k" * 32,
        input_tokens=7,
        normaliser=normaliser,
        keep_streamed=True,
    )


async def run(
    first: FakeResponse,
    later: list[FakeResponse],
    monkeypatch: pytest.MonkeyPatch,
    call: Any = None,
    tr: StreamTranslator | None = None,
    **kw: Any,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Relay ``first``; each continuation is the next of ``later``. (events, sent bodies)"""
    sent: list[dict[str, Any]] = []
    queue = list(later)
    given: list[FakeResponse] = []

    async def fake_send(
        ups: Any, route: Any, path: str, payload: bytes, **kwargs: Any
    ) -> FakeResponse:
        # closed_before: whether each continuation handed out so far was closed by now
        sent.append(
            {"body": json.loads(payload), **kwargs, "closed_before": [r.closed for r in given]}
        )
        if not queue:
            raise errors.UpstreamUnavailable()
        given.append(queue.pop(0))
        return given[-1]

    monkeypatch.setattr(continuation, "send", fake_send)
    out: list[bytes] = []

    async def write(data: bytes) -> None:
        out.append(data)

    await relay(
        call or make_call(),
        first,
        tr or translator(),
        write,  # type: ignore[arg-type]
        Timing(0.0),
        Histogram(),
        **kw,
    )
    return check_stream(b"".join(out)), sent


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(
        e["delta"]["text"]
        for e in events
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta"
    )


def final(events: list[dict[str, Any]]) -> dict[str, Any]:
    return next(e for e in events if e["type"] == "message_delta")


@pytest.mark.parametrize("cut", ["eof", "inband", "inband_split", "raise"])
async def test_a_cut_stream_is_continued_into_one_well_formed_stream(
    cut: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = FakeResponse(answer(WHOLE[:2], cut=cut))
    rest = FakeResponse(answer(WHOLE[2:], prompt=14))
    counted = _continuations()
    events, sent = await run(first, [rest], monkeypatch)
    assert _continuations() == counted + 1  # llm_gateway_stream_continuations_total
    assert text_of(events) == "Hello from the stub."
    assert [e["type"] for e in events].count("content_block_start") == 1  # the block went on
    assert not any(e["type"] == "error" for e in events)
    delta = final(events)
    assert delta["delta"]["stop_reason"] == "end_turn"
    # output: the 2 content chunks before the cut + the continuation's 3; the prompt is the
    # first part's (it reported none, so the estimate stays; the prefill's is not counted)
    assert delta["usage"] == {"output_tokens": 5}
    assert events[0]["message"]["usage"]["input_tokens"] == 7
    assert first.abandoned and rest.closed
    body = sent[0]["body"]
    assert body["messages"][-1] == {"role": "assistant", "content": "Hello from"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_tokens"] == 98 and sent[0]["max_tokens"] == 98
    assert sent[0]["session"] == "s1" and sent[0]["stream"] is True


async def test_the_first_parts_reported_prompt_is_kept_and_output_tokens_add_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    usage = {
        "prompt_tokens": 20,
        "completion_tokens": 2,
        "total_tokens": 22,
        "prompt_tokens_details": {"cached_tokens": 5},
    }
    first = FakeResponse(
        [
            ROLE,
            chunk({"content": "Hello"}, usage=usage),
            chunk({"content": " from"}, usage=usage),
            b"RAISE",
        ]
    )
    rest = FakeResponse(answer(WHOLE[2:], prompt=30))
    events, _ = await run(first, [rest], monkeypatch)
    assert text_of(events) == "Hello from the stub."
    assert final(events)["usage"] == {
        "input_tokens": 15,
        "cache_read_input_tokens": 5,
        "output_tokens": 5,
    }


async def test_a_continuation_cut_again_is_continued_within_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = FakeResponse(answer(WHOLE[:1], cut="eof"))
    second = FakeResponse(answer(WHOLE[1:3], cut="raise"))
    third = FakeResponse(answer(WHOLE[3:]))
    events, sent = await run(first, [second, third], monkeypatch)
    assert text_of(events) == "Hello from the stub."
    assert final(events)["delta"]["stop_reason"] == "end_turn"
    assert [s["body"]["messages"][-1]["content"] for s in sent] == ["Hello", "Hello from the"]
    assert second.abandoned and second.closed and third.closed


async def test_past_the_budget_the_stream_ends_with_todays_envelope(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = FakeResponse(answer(WHOLE[:1], cut="eof"))
    again = [FakeResponse(answer(WHOLE[1:2], cut="eof")) for _ in range(3)]
    events, sent = await run(first, again, monkeypatch)
    assert len(sent) == BUDGET
    assert text_of(events) == "Hello from from"  # what the (fake) continuations sent
    errors_ = [e for e in events if e["type"] == "error"]
    assert len(errors_) == 1 and events[-1]["type"] == "message_stop"


async def test_a_continuation_that_cannot_be_sent_ends_as_without_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = FakeResponse(answer(WHOLE[:2], cut="raise"))
    with pytest.raises(errors.UpstreamError, match="connection lost"):
        await run(first, [], monkeypatch)


async def test_a_stuck_stream_is_not_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream that stopped sending (idle_timeout) is stuck, not cut: asking again would make
    the client wait idle_timeout more each time (found by the drip-fed stream test)."""
    first = FakeResponse([*answer(WHOLE[:2])[:3], b"STUCK"])
    with pytest.raises(errors.UpstreamTimeout):
        await run(first, [FakeResponse(answer(WHOLE[2:]))], monkeypatch)
    assert not first.abandoned


# --- a tool call cut mid-arguments is generated again whole ------------------------------


def call_start(call_id: str, name: str = "get_weather", index: int = 0) -> bytes:
    return chunk(
        {
            "tool_calls": [
                {
                    "index": index,
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
            ]
        }
    )


def args(piece: str, index: int = 0) -> bytes:
    return chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})


CITY = ['{"city": ', '"Paris"}']
TOOL_USAGE = {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}
# the first answer: text, then one call whose arguments come in two pieces
SAY = "Let me check."
TOOL_STREAM = [
    ROLE,
    chunk({"content": SAY}),
    call_start("call_1"),
    args(CITY[0]),
    args(CITY[1]),
    chunk({}, "tool_calls", TOOL_USAGE),
    b"data: [DONE]\n\n",
]
CUTS = {
    "eof": [b'data: {"id":"c","choi'],
    "inband": [b'data: {"error":{"message":"engine died","code":500}}\n\n'],
    "raise": [b"RAISE"],
}


def regenerated(
    *,
    blank: bool = False,
    reasoning: bool = False,
    pieces: int = 3,
    call_id: str = "call_9",
    index: int = 0,
) -> list[bytes]:
    """The engine's new answer after the prefill: the same call, new id, new split."""
    whole = "".join(CITY)
    size = -(-len(whole) // pieces)
    frames = [ROLE]
    if reasoning:
        frames.append(chunk({"reasoning_content": "Again."}))
    if blank:
        frames.append(chunk({"content": "\n\n"}))
    frames.append(call_start(call_id, index=index))
    frames += [args(whole[i : i + size], index) for i in range(0, len(whole), size)]
    usage = {"prompt_tokens": 30, "completion_tokens": 6, "total_tokens": 36}
    return [*frames, chunk({}, "tool_calls", usage), b"data: [DONE]\n\n"]


def tool_blocks(events: list[dict[str, Any]]) -> list[tuple[str, str, Any]]:
    """(id, name, input) of every tool_use block, its input parsed from its deltas."""
    out: list[tuple[str, str, Any]] = []
    parts: dict[int, list[str]] = {}
    starts: dict[int, dict[str, Any]] = {}
    for e in events:
        if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use":
            starts[e["index"]] = e["content_block"]
            parts[e["index"]] = []
        elif e["type"] == "content_block_delta" and e["index"] in parts:
            parts[e["index"]].append(e["delta"]["partial_json"])
        elif e["type"] == "content_block_stop" and e["index"] in parts:
            block = starts[e["index"]]
            out.append((block["id"], block["name"], json.loads("".join(parts[e["index"]]))))
    return out


# (cut after this many frames of TOOL_STREAM, how the cut looks, the new answer's frames)
TOOL_CUTS = [
    (3, "eof", regenerated()),  # the call's block open, no arguments yet
    (4, "raise", regenerated()),  # half the arguments held
    (4, "inband", regenerated(blank=True)),  # blank text before the new call is dropped
    (4, "eof", regenerated(reasoning=True, pieces=1)),  # so is reasoning
    (5, "raise", regenerated(index=3)),  # all arguments held, no finish; another index
]


@pytest.mark.parametrize(("at", "cut", "again"), TOOL_CUTS)
async def test_a_tool_call_cut_mid_arguments_is_generated_again_whole(
    at: int, cut: str, again: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = FakeResponse([*TOOL_STREAM[:at], *CUTS[cut]])
    events, sent = await run(first, [FakeResponse(again)], monkeypatch)
    assert not [e for e in events if e["type"] == "error"]
    assert text_of(events) == SAY
    # one tool block, the id the client saw first, the whole input once
    assert tool_blocks(events) == [("call_1", "get_weather", {"city": "Paris"})]
    delta = final(events)
    assert delta["delta"]["stop_reason"] == "tool_use"
    # output: the one content chunk before the call + the new answer's 6
    assert delta["usage"] == {"output_tokens": 7}
    assert len(sent) == 1 and first.abandoned
    body = sent[0]["body"]
    assert body["messages"][-1] == {"role": "assistant", "content": SAY}
    assert body["max_tokens"] == 99  # lowered by the tokens before the call only


async def test_a_cut_before_the_call_is_a_text_continuation_that_brings_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = FakeResponse([*TOOL_STREAM[:2], *CUTS["eof"]])
    events, sent = await run(first, [FakeResponse(regenerated())], monkeypatch)
    assert text_of(events) == SAY
    assert tool_blocks(events) == [("call_9", "get_weather", {"city": "Paris"})]
    assert final(events)["delta"]["stop_reason"] == "tool_use"
    assert sent[0]["body"]["messages"][-1] == {"role": "assistant", "content": SAY}


async def test_parallel_calls_are_generated_again_without_the_held_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second call was whole (held while the first streamed) when the third was cut:
    each comes once, from the new answer."""
    first = FakeResponse(
        [
            ROLE,
            call_start("call_1"),
            args('{"city": "Paris"}'),
            call_start("call_2", index=1),
            args('{"city": "Rome"}', 1),
            call_start("call_3", index=2),
            args('{"ci', 2),
            b"RAISE",
        ]
    )
    again = FakeResponse(
        [
            ROLE,
            call_start("n1"),
            args('{"city": "Paris"}'),
            call_start("n2", index=1),
            args('{"city": "Oslo"}', 1),
            chunk({}, "tool_calls"),
            b"data: [DONE]\n\n",
        ]
    )
    events, sent = await run(first, [again], monkeypatch)
    assert tool_blocks(events) == [
        ("call_1", "get_weather", {"city": "Paris"}),
        ("n2", "get_weather", {"city": "Oslo"}),
    ]
    assert final(events)["delta"]["stop_reason"] == "tool_use"
    assert "messages" in sent[0]["body"] and sent[0]["body"]["messages"][-1]["role"] == "user"


MISFITS = {
    "text": [ROLE, chunk({"content": "Sorry, I cannot."}), chunk({}, "stop"), b"data: [DONE]\n\n"],
    "another_tool": [
        ROLE,
        call_start("x", name="get_time"),
        args("{}"),
        chunk({}, "tool_calls"),
        b"data: [DONE]\n\n",
    ],
    "no_call": [ROLE, chunk({}, "stop"), b"data: [DONE]\n\n"],
}


@pytest.mark.parametrize("misfit", sorted(MISFITS))
async def test_a_new_answer_that_does_not_fit_is_a_cut_within_the_budget(
    misfit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = FakeResponse([*TOOL_STREAM[:4], *CUTS["raise"]])
    misfitting = FakeResponse(MISFITS[misfit])
    events, sent = await run(first, [misfitting, FakeResponse(regenerated())], monkeypatch)
    assert len(sent) == 2 and not [e for e in events if e["type"] == "error"]
    # its replica did not fail (not ejected); its connection was closed (the engine stops)
    # before the next was sent
    assert not misfitting.abandoned and sent[1]["closed_before"] == [True]
    assert tool_blocks(events) == [("call_1", "get_weather", {"city": "Paris"})]
    assert "Sorry" not in text_of(events)


@pytest.mark.parametrize("misfit", sorted(MISFITS))
async def test_past_the_budget_a_cut_tool_call_ends_with_todays_envelope(
    misfit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = FakeResponse([*TOOL_STREAM[:4], *CUTS["eof"]])
    events, sent = await run(first, [FakeResponse(MISFITS[misfit]) for _ in range(3)], monkeypatch)
    assert len(sent) == BUDGET
    assert len([e for e in events if e["type"] == "error"]) == 1
    assert events[-1]["type"] == "message_stop"
    # as without a continuation: the held arguments, repaired, then the error
    today, _ = await run(FakeResponse([*TOOL_STREAM[:4], *CUTS["eof"]]), [], monkeypatch, budget=0)
    assert tool_blocks(events) == tool_blocks(today) == [("call_1", "get_weather", {})]
    assert len([e for e in today if e["type"] == "error"]) == 1


async def test_a_tool_block_already_closed_is_not_continued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Text after a call closed its block (its arguments went out): nothing to regenerate."""
    first = FakeResponse(
        [ROLE, call_start("call_1"), args('{"a": 1}'), chunk({"content": "and"}), *CUTS["eof"]]
    )
    events, sent = await run(first, [FakeResponse(regenerated())], monkeypatch)
    assert sent == []
    assert [e for e in events if e["type"] == "error"]


def test_reasoning_before_a_regenerated_call_goes_back_closed() -> None:
    t = translator()
    for frame in [
        ROLE,
        chunk({"reasoning_content": "Weather: a tool."}),
        call_start("c"),
        args('{"ci'),
    ]:
        t.feed(frame[len(b"data: ") : -2])
    assert t.regenerable_call() == (0, "c", "get_weather")
    body, max_tokens = continuation_payload(make_call(), t, tool_calls=True)
    decoded = json.loads(body)
    assert decoded["messages"][-1]["content"] == "<think>Weather: a tool.</think>"
    assert max_tokens == 99 and decoded["max_tokens"] == 99


@pytest.mark.parametrize("cut", ["raise", "eof", "inband"])
async def test_a_stream_cut_after_its_finish_is_whole_and_not_asked_again(
    cut: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama.cpp sends the finish, then the usage chunk, then [DONE]: a connection lost
    (or an in-band 5xx sent) between them lost no answer (asked again, the engine would
    repeat it after itself)."""
    frames = [ROLE, *(chunk({"content": p}) for p in WHOLE), chunk({}, "stop")]
    tail = {
        "raise": [b"RAISE"],
        "eof": [],
        "inband": [b'data: {"error":{"message":"engine died","code":500}}\n\n'],
    }[cut]
    first = FakeResponse([*frames, *tail])
    events, sent = await run(first, [FakeResponse(answer(WHOLE))], monkeypatch)
    assert sent == []
    assert text_of(events) == "Hello from the stub."
    assert not any(e["type"] == "error" for e in events)
    assert final(events)["delta"]["stop_reason"] == "end_turn"
    assert final(events)["usage"] == {"output_tokens": len(WHOLE)}  # counted chunks


async def test_an_unbroken_stream_sends_nothing_more(monkeypatch: pytest.MonkeyPatch) -> None:
    first = FakeResponse(answer(WHOLE))
    events, sent = await run(first, [], monkeypatch)
    assert sent == [] and not first.abandoned
    assert text_of(events) == "Hello from the stub."


def test_llamacpp_continues_a_final_assistant_message_without_flags() -> None:
    t = translator()
    for frame in answer(WHOLE[:2], cut="eof")[:-1]:
        t.feed(frame[len(b"data: ") : -2])
    body, max_tokens = continuation_payload(make_call("llamacpp", None), t)
    decoded = json.loads(body)
    assert decoded["messages"][-1] == {"role": "assistant", "content": "Hello from"}
    assert "continue_final_message" not in decoded and "max_tokens" not in decoded
    assert max_tokens is None


def test_reasoning_goes_back_inline() -> None:
    t = translator()
    t.feed(ROLE[len(b"data: ") : -2])
    t.feed(chunk({"reasoning_content": "Let me think."})[len(b"data: ") : -2])
    t.feed(chunk({"content": "Hel"})[len(b"data: ") : -2])
    body, _ = continuation_payload(make_call(), t)
    assert json.loads(body)["messages"][-1]["content"] == "<think>Let me think.</think>Hel"


@pytest.mark.parametrize(
    ("kind", "reasoning", "text", "tool_calls", "prefill"),
    [
        # vLLM/SGLang (and Ollama): the reasoning inline, open while nothing follows it
        ("vllm", "Let me think.", "", False, {"content": "<think>Let me think."}),
        ("vllm", "Let me think.", "Hel", False, {"content": "<think>Let me think.</think>Hel"}),
        ("ollama", "Let me think.", "", True, {"content": "<think>Let me think.</think>"}),
        ("sglang", "", "Hel", False, {"content": "Hel"}),
        # llama-server: the reasoning as reasoning_content (inline, it parses none of the reply
        # as reasoning); it leaves the reasoning open when the content is empty
        (
            "llamacpp",
            "Let me think.",
            "",
            False,
            {"content": "", "reasoning_content": "Let me think."},
        ),
        (
            "llamacpp",
            "Let me think.",
            "Hel",
            False,
            {"content": "Hel", "reasoning_content": "Let me think."},
        ),
        (
            "llamacpp",
            "Let me think.",
            "",
            True,
            {"content": "", "reasoning_content": "Let me think."},
        ),
        ("llamacpp", "", "Hel", False, {"content": "Hel"}),
    ],
)
def test_each_kind_gets_the_reasoning_its_way(
    kind: str, reasoning: str, text: str, tool_calls: bool, prefill: dict[str, str]
) -> None:
    t = translator()
    t.feed(ROLE[len(b"data: ") : -2])
    if reasoning:
        t.feed(chunk({"reasoning_content": reasoning})[len(b"data: ") : -2])
    if text:
        t.feed(chunk({"content": text})[len(b"data: ") : -2])
    decoded = json.loads(continuation_payload(make_call(kind), t, tool_calls=tool_calls)[0])
    assert decoded["messages"][-1] == {"role": "assistant", **prefill}
    flags = kind in ("vllm", "sglang")
    assert decoded.get("continue_final_message") is (True if flags else None)
    assert decoded.get("add_generation_prompt") is (False if flags else None)


async def test_continued_drops_the_role_chunk_only() -> None:
    t = translator()
    up = FakeResponse([ROLE, chunk({"content": "x"})])
    got = [c async for c in Continued(up, t).chunks()]  # type: ignore[arg-type]
    assert got == [chunk({"content": "x"})]


# --- a tool call written as text, cut while the normaliser held it -----------------------

HERMES = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
LLAMA = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
MISTRAL = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'

# (the content deltas before the cut, the prefill's content (None: no prefill), the deltas
# counted before the held text, the model's new answer after the prefill): the client was
# shown the text before the held part only, so only that goes back
TEXT_CALL_CUTS = {
    "a possible opener": (["Let me check.", "\n\n", "<tool_"], "Let me check.\n\n", 2, HERMES),
    "an opener split": (["Let me check.", " <tool", "_call>\n{"], "Let me check. ", 1, HERMES),
    "mid-name": (["Let me check.", "\n\n<tool_call>\n", '{"nam'], "Let me check.\n\n", 1, HERMES),
    "mid-arguments": (
        ["Let me check.\n", HERMES[:30], HERMES[30:50]],
        "Let me check.\n",
        1,
        HERMES,
    ),
    "a whole body before its close": (["Let me check.", HERMES[:-14]], "Let me check.", 1, HERMES),
    "no text before it": ([HERMES[:5], HERMES[5:20]], None, 0, HERMES),
    "a whole-message JSON": ([LLAMA[:10], LLAMA[10:30]], None, 0, LLAMA),
    "a whole-message JSON after a newline": (["\n", LLAMA[:10], LLAMA[10:30]], None, 0, LLAMA),
    # held at the start by the inline-reasoning parser (it may open <think>), not yet by the
    # call parser: not shown either
    "a first <": (["<"], None, 0, HERMES),
    "a first <t": (["\n", "<t"], None, 0, HERMES),
    "after an inline thought": (
        ["<think>Hmm.", "</think>\n\n", LLAMA[:20]],
        "<think>Hmm.</think>\n\n",
        2,
        LLAMA,
    ),
    "Mistral's marker": (["[TOOL_", "CALLS][{", '"name": "get'], None, 0, MISTRAL),
}


def text_call_answer(text: str) -> list[bytes]:
    """The model writes the call again whole, in 9-character deltas, and finishes."""
    usage = {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35}
    return [
        ROLE,
        *(chunk({"content": text[i : i + 9]}) for i in range(0, len(text), 9)),
        chunk({}, "stop", usage),
        b"data: [DONE]\n\n",
    ]


@pytest.mark.parametrize("case", sorted(TEXT_CALL_CUTS))
@pytest.mark.parametrize("cut", ["eof", "raise"])
async def test_a_cut_inside_a_call_written_as_text_writes_the_call_again(
    case: str, cut: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pieces, prefill, before, again = TEXT_CALL_CUTS[case]
    first = FakeResponse([ROLE, *(chunk({"content": p}) for p in pieces), *CUTS[cut]])
    norm = ContentNormaliser(thinking="auto", tool_names=["get_weather"])
    tr = translator(norm)
    events, sent = await run(first, [FakeResponse(text_call_answer(again))], monkeypatch, tr=tr)
    assert not [e for e in events if e["type"] == "error"]
    assert [b[1:] for b in tool_blocks(events)] == [("get_weather", {"city": "Paris"})]
    delta = final(events)
    assert delta["delta"]["stop_reason"] == "tool_use"
    # the client's text is what it was shown before the call, none of the call's text
    shown = text_of(events)
    assert "get_weather" not in shown and "<tool" not in shown and "{" not in shown
    assert shown == (prefill or "").removeprefix("<think>Hmm.</think>").strip()
    # output: the deltas before the held text + the new answer's 5
    assert delta["usage"] == {"output_tokens": before + 5}
    assert len(sent) == 1 and first.abandoned
    body = sent[0]["body"]
    if prefill is None:  # nothing shown but the held text: asked again as it was
        assert body["messages"] == [{"role": "user", "content": "Say hello"}]
    else:
        assert body["messages"][-1] == {"role": "assistant", "content": prefill}
    assert body["max_tokens"] == sent[0]["max_tokens"] == 100 - before
    assert norm.calls_found == 1 and tr.text_tool_calls == 1


async def test_held_text_is_dropped_only_when_a_call_may_be_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Prose with a trailing newline (held whitespace, no call) is continued as before."""
    first = FakeResponse(
        [ROLE, chunk({"content": "Hello"}), chunk({"content": " from\n"}), b"RAISE"]
    )
    again = answer(["the stub."])
    norm = ContentNormaliser(thinking="auto", tool_names=["get_weather"])
    events, sent = await run(first, [FakeResponse(again)], monkeypatch, tr=translator(norm))
    assert text_of(events) == "Hello from\nthe stub."
    assert sent[0]["body"]["messages"][-1] == {"role": "assistant", "content": "Hello from\n"}
    assert sent[0]["body"]["max_tokens"] == 98


@pytest.mark.parametrize(
    ("kind", "prefill"),
    [
        ("vllm", {"content": "<think>Hmm.</think>"}),  # closed: it ended as the call began
        ("llamacpp", {"content": "", "reasoning_content": "Hmm."}),  # llama-server's way
    ],
)
async def test_a_thought_before_a_held_text_call_goes_back_without_the_call(
    kind: str, prefill: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = FakeResponse(
        [ROLE, chunk({"reasoning_content": "Hmm."}), chunk({"content": HERMES[:25]}), b"RAISE"]
    )
    norm = ContentNormaliser(thinking="auto", tool_names=["get_weather"])
    events, sent = await run(
        first,
        [FakeResponse(text_call_answer(HERMES))],
        monkeypatch,
        call=make_call(kind),
        tr=translator(norm),
    )
    assert [b[1:] for b in tool_blocks(events)] == [("get_weather", {"city": "Paris"})]
    assert final(events)["delta"]["stop_reason"] == "tool_use"
    assert sent[0]["body"]["messages"][-1] == {"role": "assistant", **prefill}
    assert sent[0]["body"]["max_tokens"] == 99  # the thought's delta only


# (the client's final assistant turn as the chat request has it, the engine's kind, what
# streamed before the cut: reasoning, text; the one assistant message the continuation ends in)
PREFILLS = [
    (
        {"role": "assistant", "content": "The answer is"},
        "vllm",
        "",
        " forty",
        {"role": "assistant", "content": "The answer is forty"},
    ),
    (
        {"role": "assistant", "content": "The answer is"},
        "llamacpp",
        "",
        " forty",
        {"role": "assistant", "content": "The answer is forty"},
    ),
    (
        {"role": "assistant", "content": "The answer is"},
        "sglang",
        "Hmm.",
        " forty",
        {"role": "assistant", "content": "The answer is<think>Hmm.</think> forty"},
    ),
    (
        {"role": "assistant", "content": "Sure:", "reasoning_content": "Asked before."},
        "llamacpp",
        "More.",
        " yes",
        {"role": "assistant", "content": "Sure: yes", "reasoning_content": "Asked before.More."},
    ),
    (
        {"role": "assistant", "content": [{"type": "text", "text": "Parts"}]},
        "ollama",
        "",
        " go on",
        {"role": "assistant", "content": "Parts go on"},
    ),
]


@pytest.mark.parametrize(("prefill", "kind", "reasoning", "text", "turn"), PREFILLS)
def test_a_cut_after_the_clients_prefill_goes_on_in_that_turn(
    prefill: dict[str, Any], kind: str, reasoning: str, text: str, turn: dict[str, Any]
) -> None:
    """The client ended its messages with an assistant turn (a prefill) and the answer that
    continued it was cut: the continuation extends that one assistant turn with what
    streamed, not a second assistant turn after it (a finished turn, then a new one)."""
    call = make_call(kind)
    body = json.loads(call.payload)
    body["messages"].append(prefill)
    call.payload = json.dumps(body).encode()
    t = translator()
    t.feed(ROLE[len(b"data: ") : -2])
    if reasoning:
        t.feed(chunk({"reasoning_content": reasoning})[len(b"data: ") : -2])
    t.feed(chunk({"content": text})[len(b"data: ") : -2])
    decoded = json.loads(continuation_payload(call, t)[0])
    assert decoded["messages"] == [{"role": "user", "content": "Say hello"}, turn]


def test_a_final_assistant_turn_the_client_finished_gets_the_answer_after_it() -> None:
    """``continue_final_message: false``: the client's last assistant turn was sent as a
    finished one and the answer is a new turn: continued as a turn of its own."""
    call = make_call("vllm")
    body = json.loads(call.payload)
    body["messages"].append({"role": "assistant", "content": "Done."})
    body["continue_final_message"] = False
    call.payload = json.dumps(body).encode()
    t = translator()
    t.feed(ROLE[len(b"data: ") : -2])
    t.feed(chunk({"content": "Next"})[len(b"data: ") : -2])
    decoded = json.loads(continuation_payload(call, t)[0])
    assert decoded["messages"][1:] == [
        {"role": "assistant", "content": "Done."},
        {"role": "assistant", "content": "Next"},
    ]


async def test_a_prefilled_stream_cut_is_continued_as_one_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    call = make_call()
    body = json.loads(call.payload)
    body["messages"].append({"role": "assistant", "content": "Stub says:"})
    call.payload = json.dumps(body).encode()
    first = FakeResponse(answer(WHOLE[:2], cut="eof"))
    events, sent = await run(first, [FakeResponse(answer(WHOLE[2:]))], monkeypatch, call=call)
    assert text_of(events) == "Hello from the stub."
    roles = [m["role"] for m in sent[0]["body"]["messages"]]
    assert roles == ["user", "assistant"]
    assert sent[0]["body"]["messages"][-1]["content"] == "Stub says:Hello from"


def _real_call(max_continuations: int) -> Any:
    """A Messages call on a route with ``max_continuations`` (gateway/messages/call.py)."""
    from gateway.messages.call import Call
    from gateway.messages.deps import MessagesDeps
    from gateway.messages.request.validate import validate_messages
    from gateway.ops.config import ModelRoute, UpstreamConfig
    from gateway.text.redact import NO_SECRETS
    from gateway.upstream.client import UpstreamClient
    from gateway.upstream.send import Upstreams

    upstream = UpstreamConfig(
        name="u", base_url="http://127.0.0.1:9/v1", kind="vllm", max_continuations=max_continuations
    )
    route = ModelRoute(name="m", upstream=upstream, upstream_model="m")
    deps = MessagesDeps(
        upstreams=Upstreams(
            clients={"u": UpstreamClient(upstream)}, metrics=METRICS, secrets=NO_SECRETS
        ),
        signing_key=b"k" * 32,
    )
    req = validate_messages(
        {
            "model": "m",
            "max_tokens": 100,
            "stream": True,
            "messages": [{"role": "user", "content": "Say hello"}],
        }
    )
    return Call(deps, req, route)


@pytest.mark.parametrize(
    ("max_continuations", "kept"), [(0, ""), (1, "Hello from"), (2, "Hello from")]
)
def test_a_stream_keeps_its_text_only_where_it_may_be_continued(
    max_continuations: int, kept: str
) -> None:
    """A route that never continues a cut stream keeps none of its text (it would be held
    for the stream's whole life for nothing); one that does keeps it for the prefill."""
    call = _real_call(max_continuations)
    t = call.translator()
    for frame in answer(WHOLE[:2], cut="eof")[:-1]:
        t.feed(frame[len(b"data: ") : -2])
    t.feed(chunk({"reasoning_content": "Hm"})[len(b"data: ") : -2])
    assert t.keeps_streamed is bool(kept)
    assert (t.streamed_content, t.streamed_reasoning) == (kept, "Hm" if kept else "")
    assert (t._content is None, t._reasoning is None) == (not kept, not kept)


async def test_a_translator_that_keeps_nothing_is_not_continued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Relayed with a budget but a translator that kept no text: the cut ends the stream
    as it would without continuations (a prefill of nothing would start the answer again)."""
    tr = StreamTranslator(model="m", message_id="msg_1", signing_key=b"k" * 32)
    events, sent = await run(
        FakeResponse(answer(WHOLE[:2], cut="eof")),
        [FakeResponse(answer(WHOLE[2:]))],
        monkeypatch,
        tr=tr,
    )
    assert sent == []
    assert events[-2]["type"] == "error"


def test_the_prefill_is_made_from_the_clients_request() -> None:
    """The continuation's chat request is the call's, made again from the client's request
    (not its payload's bytes decoded): the same messages, with the prefill after them."""
    call = _real_call(2)
    t = call.translator()
    t.feed(ROLE[len(b"data: ") : -2])
    t.feed(chunk({"content": "Hel"})[len(b"data: ") : -2])
    sent = json.loads(call.payload)
    body, max_tokens = continuation_payload(call, t)
    decoded = json.loads(body)
    assert decoded["messages"] == [*sent["messages"], {"role": "assistant", "content": "Hel"}]
    assert {
        k: v
        for k, v in decoded.items()
        if k not in ("messages", "max_tokens", "continue_final_message", "add_generation_prompt")
    } == {k: v for k, v in sent.items() if k not in ("messages", "max_tokens")}
    assert max_tokens == decoded["max_tokens"] == 99


@pytest.mark.parametrize("n", [1, 15, 16, 17, 40])
def test_kept_text_is_whole_however_many_deltas(n: int) -> None:
    """The kept deltas are joined in groups (fewer objects per stream): none is lost or
    repeated, for a count below, at and past a group's size."""
    t = translator()
    t.feed(ROLE[len(b"data: ") : -2])
    pieces = [f"p{i} " for i in range(n)]
    for piece in pieces:
        t.feed(chunk({"content": piece})[len(b"data: ") : -2])
        t.feed(chunk({"reasoning_content": piece.upper()})[len(b"data: ") : -2])
    assert t.streamed_content == "".join(pieces)
    assert t.streamed_reasoning == "".join(pieces).upper()
