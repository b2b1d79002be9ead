"""A scripted OpenAI-compatible upstream for end-to-end tests (run as a real process).

    python tests/stub_upstream.py PORT

The scenario is picked by the request's ``model`` (the gateway sends the
route's ``upstream_model``), so one stub serves many gateway routes:

    ok              a short text reply (buffered or streamed, vLLM-shaped chunks)
    reasoning       reasoning_content, then content
    tools           one tool call with split arguments
    length          finish_reason "length"
    cached          the ok reply, its usage reporting 8 of the 12 prompt tokens as cached
                    (``prompt_tokens_details.cached_tokens``, as vLLM, SGLang, llama.cpp do)
    status:N[:K]    HTTP N with body K: traceback | context | plain (default plain) |
                    quote-key (a message quoting the key it was sent: see ``quoted_key``)
    hang-headers    never answers (until the client goes away)
    hang-mid        two chunks, then silence
    cut-mid         two chunks, then the connection is cut
    cut-every:N     the ok reply, but every Nth stream of this model (counted across routes)
                    is cut as cut-mid is: a known share of streams fails mid-stream
    malformed       a chunk that is not JSON
    inband-error    an in-band {"error": ...} chunk
    quote-key:CODE  a 200 whose in-band error (code CODE) quotes the key it was sent: the
                    error body when buffered, else after two events of a stream (Responses:
                    an ``error`` event, then ``response.failed`` quoting it too); on every
                    route
    eof-no-finish   chunks without finish_reason, then EOF
    slow:MS         a content chunk every MS milliseconds, 50 chunks
    prefill:MS      response headers at once, then MS milliseconds of silence, then a reply
    big:N           N chunks of 1,000 characters each, as fast as the reader takes them
                    (buffered: one reply of N x 1,000 characters)
    reset-once      the connection is cut before any response byte on every odd request
    reset-always    the connection is cut before any response byte, every time
    end-late:MS     the ok stream, but the body's end (the chunked terminator) comes MS
                    milliseconds after ``[DONE]``
    delay:MS        the ok reply (buffered or streamed) after MS milliseconds of silence
    fail-first:N:S  HTTP S (plain body) for the first N requests carrying the same last
                    user message, then the ok reply: a transient failure per request
    think-tool:NAME:ARGS  reasoning + a call to tool NAME; after its result, reasoning + text
    agent:NAME:ARGS one call of tool NAME with the JSON ARGS, until the last message is a
                    ``role: "tool"`` one; then text: ``The tool said: <its content>``
                    (an agent's tool loop; buffered or streamed)
    cc-steps:STEPS  STEPS is a JSON list of ``[NAME, ARGS]``: one tool call per assistant turn,
                    in order, then text: ``The tool said: <the last tool result>``
    tool-cut:N      text (``Let me check the weather.``), then a call of get_weather whose
                    arguments (``{"city": "Paris"}``) the first N streams of a conversation
                    cut halfway (counted in ``cut``); a request ending in an assistant prefill
                    (a continuation) gets the call alone, with a new id; buffered: the whole
                    reply
    text-tool-cut:N the same as ``tool-cut:N`` with the call written as text, as an engine
                    without its tool parser writes it (``\n\n<tool_call>\n{...}\n</tool_call>``
                    in 7-character deltas, finish "stop"): the first N streams of a
                    conversation are cut halfway through the call text; a request ending in
                    an assistant prefill gets the call text alone, whole (a model writing the
                    call again, whatever the prefill)
    golden:CASE     replays ``tests/golden/streams/CASE/upstream.sse`` (what a local engine
                    really sent), one write per event; buffered, the completion its deltas
                    join into (:func:`buffered_completion`)

Web search (the gateway's ``web_search`` server tool, #27): whatever the model, a request
that offers a function named ``web_search`` is one turn of a searching model (buffered or
streamed; the turn is what follows the last ``role: "user"`` message):

    - while fewer ``web_search`` calls than wanted have a ``tool`` answer, a call of
      ``web_search`` with ``{"query": <the last user text>}`` (Claude Code's side-request
      prefix ``Perform a web search for the query: `` taken off; the n-th call, n > 1, adds
      `` (search n)``); arguments streamed in 3 pieces
    - then, for the model ``search-tool:NAME:ARGS``, one call of the client tool NAME with the
      JSON ARGS, until its ``tool`` answer
    - then text: ``According to <URL>, that is the answer.`` naming the first ``http(s)://``
      URL in the search results (the ``tool`` messages answering ``web_search``), or, when
      none holds a URL, ``The search found nothing: <the last one's text>``

    search:N        N searches in a turn (other models: one), e.g. past a ``max_uses``
    search-parallel:N  the N searches at once: one assistant message with N ``web_search``
                    calls (queries ``<text> (part k)``), each streamed in its own index
    search-args:ARGS   the one search called with the raw arguments ARGS (e.g. no ``query``)
    search-quote    the answer quotes the first result's snippet verbatim (the SearXNG stub's
                    ``Snippet 1 about ...``): ``According to <URL>: <snippet> That is all.``

Web fetch (the gateway's ``web_fetch`` server tool, #36): a request that offers a function
named ``web_fetch`` to a model whose name starts with ``fetch`` is one turn of a fetching
model: while no ``web_fetch`` call has a ``tool`` answer, a call of ``web_fetch`` with
``{"url": <the first URL of the last user text>}`` (arguments in 3 pieces); then text:
``Fetched: <the first line of the document's text after the tool message's header>``.

    fetch-url:URL   the call fetches URL instead (e.g. one the conversation does not hold)
    fetch-quote     the answer quotes the document's first line verbatim:
                    ``The page says: <line> That is all.``
    fetch-search    a web_search first (as ``search``), then a fetch of its first result URL

Local engines without their parsers (Claude Code tests; ``LocalEngine`` below). Each
answers a tool's result with text holding it: ``The file says: <its content>``:

    text-tool:PATH      a Read of PATH written as text (Hermes ``<tool_call>{...}</tool_call>``,
                        finish "stop", no ``tool_calls``), streamed in 7-character chunks
    broken-args:PATH    a real Read call of PATH whose arguments are Python-quoted with a
                        trailing comma (``{'file_path': 'PATH',}``), streamed in 5 pieces
    inline-think:PATH   ``<think>...</think>`` in content before each turn: the text Read call,
                        then the answer
    chat                text naming the turn and echoing the start of the last user message
                        (``Reply N: <its start>``); to Claude Code's /compact prompt,
                        ``<summary>Summary N: ...</summary>``: for sessions (``--continue``)

In the tool scenarios, "the last message" skips trailing ``role: "system"`` turns, which
Claude Code appends after a tool result (e.g. ``<total_tokens>`` in a subagent).

``POST /v1/completions``, ``/v1/embeddings`` and ``/v1/responses`` answer as vLLM does
(``ok``; ``status:N[:K]``; ``quote-key:CODE``; streamed completions and responses also
``cut-mid``); the completions stream ends with a usage chunk when
``stream_options.include_usage`` asks for it, embeddings honour ``encoding_format``
(``float`` or ``base64``).

A continuation: a streamed ``ok``-family request whose last message is an assistant prefill
that begins the ok text (``Hello from the stub.``) gets the rest of that text, so a gateway
continuing a cut stream is checkable (the client must see the whole text once).

``python tests/stub_upstream.py PORT cut-all``: this process cuts every chat stream of the
``ok`` family after its second event (a continuation too), as ``cut-mid`` does: one replica
of a fleet cutting every stream halfway.

``GET /_requests`` returns every request seen (method, path, headers, body, and the
client's port: ``peer``, which tells connections apart);
``DELETE /_requests`` clears it; ``GET /_stats`` counts streams open now, streams
whose client went away, chat requests in progress (``active``), chat requests
cancelled because the gateway closed the connection (``cancelled``) and chat streams
the stub cut (``cut``).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from aiohttp import web

CREATED = 1700000000
GOLDEN_STREAMS = Path(__file__).resolve().parent / "golden" / "streams"
_CASE_NAME = re.compile(r"[a-z0-9_]+")
TEXT = ["Hello", " from", " the", " stub", "."]
TRACEBACK = (
    'Traceback (most recent call last):\n  File "/opt/vllm/entrypoints/openai/'
    'serving_chat.py", line 42, in create\nRuntimeError: CUDA out of memory at '
    "http://10.1.2.3:8000/v1"
)
CONTEXT = (
    "This model's maximum context length is 4096 tokens. However, you requested 5000 "
    "tokens (4000 in the messages, 1000 in the completion). Please reduce the length "
    "of the messages or completion."
)


def chunk(
    model: str,
    delta: dict,
    finish: str | None = None,
    usage: dict | None = None,
    choices: bool = True,
) -> bytes:
    body: dict = {
        "id": "chatcmpl-stub",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
    }
    body["choices"] = (
        [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}] if choices else []
    )
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def _tool_text(message: dict, *, as_json: bool = False) -> str:
    """A tool message's content as text: a string as is; a list of parts as its texts joined,
    or (``as_json``) as JSON, so a test can see every part, images and documents too."""
    content = message["content"]
    if isinstance(content, str):
        return content
    if as_json:
        return json.dumps(content)
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def _compact(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


def completion(model: str, message: dict, finish: str, usage: dict) -> dict:
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": CREATED,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": usage,
    }


INBAND_ERROR = (
    b'data: {"error":{"message":"boom at http://10.0.0.9/x",'
    b'"type":"InternalServerError","code":500}}\n\n'
)
USAGE = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
USAGE_CACHED = {**USAGE, "prompt_tokens_details": {"cached_tokens": 8}}


def script(model: str) -> tuple[list[bytes], dict]:
    """(stream frames, buffered body) for a scenario."""
    role = chunk(model, {"role": "assistant", "content": ""})
    if model == "reasoning":
        frames = [role] + [chunk(model, {"reasoning_content": t}) for t in ["Let me", " think."]]
        frames += [chunk(model, {"content": t}) for t in TEXT]
        frames += [chunk(model, {}, "stop"), chunk(model, {}, usage=USAGE, choices=False)]
        body = completion(
            model,
            {"role": "assistant", "content": "".join(TEXT), "reasoning_content": "Let me think."},
            "stop",
            USAGE,
        )
        return [*frames, b"data: [DONE]\n\n"], body
    if model == "tools":
        call = {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        }
        frames = [role, chunk(model, {"tool_calls": [call]})]
        frames += [
            chunk(model, {"tool_calls": [{"index": 0, "function": {"arguments": a}}]})
            for a in ['{"city": ', '"Paris"}']
        ]
        frames += [chunk(model, {}, "tool_calls", usage=USAGE)]
        body = completion(
            model,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            "tool_calls",
            USAGE,
        )
        return [*frames, b"data: [DONE]\n\n"], body
    finish = "length" if model == "length" else "stop"
    usage = USAGE_CACHED if model == "cached" else USAGE
    frames = [role] + [chunk(model, {"content": t}) for t in TEXT]
    frames += [chunk(model, {}, finish), chunk(model, {}, usage=usage, choices=False)]
    body = completion(model, {"role": "assistant", "content": "".join(TEXT)}, finish, usage)
    return [*frames, b"data: [DONE]\n\n"], body


def _prefill(body: Any) -> str | None:
    """The text of a final assistant message that begins the ok text (a continuation's
    prefill), else None."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not messages or not isinstance(messages[-1], dict):
        return None
    last = messages[-1]
    content = last.get("content")
    if last.get("role") != "assistant" or not isinstance(content, str):
        return None
    return content if "".join(TEXT).startswith(content) else None


def continued_frames(model: str, prefill: str) -> list[bytes]:
    """The ok stream's frames continuing ``prefill``: the rest of the ok text, in pieces."""
    rest = "".join(TEXT)[len(prefill) :]
    pieces = re.findall(r"\s*\S+|\s+", rest)
    usage = {
        "prompt_tokens": 20,
        "completion_tokens": len(pieces),
        "total_tokens": 20 + len(pieces),
    }
    frames = [chunk(model, {"role": "assistant", "content": ""})]
    frames += [chunk(model, {"content": p}) for p in pieces]
    frames += [chunk(model, {}, "stop"), chunk(model, {}, usage=usage, choices=False)]
    return [*frames, b"data: [DONE]\n\n"]


def buffered_completion(upstream_sse: bytes) -> dict:
    """The buffered completion equal to a recorded chat-completion stream: its deltas joined
    into one ``message`` (content, reasoning, each tool call's arguments joined), its last
    ``finish_reason`` and ``usage``; a new ``id`` at a used tool-call index is a new call
    (Ollama reuses index 0)."""
    first: dict = {}
    content, reasoning = [], []
    calls: list[dict] = []
    at: dict[int, dict] = {}
    finish = None
    usage = None
    for frame in upstream_sse.split(b"\n\n"):
        if not frame.startswith(b"data: {"):
            continue
        chunk_ = json.loads(frame[6:])
        first = first or chunk_
        usage = chunk_.get("usage") or usage
        for choice in chunk_.get("choices") or ():
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            reasoning.append(delta.get("reasoning_content") or delta.get("reasoning") or "")
            for tc in delta.get("tool_calls") or ():
                call = at.get(tc["index"])
                if call is None or (tc.get("id") and call["id"] and tc["id"] != call["id"]):
                    call = {
                        "id": tc.get("id"),
                        "type": "function",
                        "function": {"name": None, "arguments": ""},
                    }
                    at[tc["index"]] = call
                    calls.append(call)
                function = tc.get("function") or {}
                call["function"]["name"] = call["function"]["name"] or function.get("name")
                call["function"]["arguments"] += function.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    message: dict = {"role": "assistant", "content": "".join(content) or None}
    if "".join(reasoning):
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    body = {
        "id": first.get("id", "chatcmpl-stub"),
        "object": "chat.completion",
        "created": first.get("created", CREATED),
        "model": first.get("model", ""),
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


SEARCH_PREFIX = "Perform a web search for the query: "  # Claude Code's WebSearch side request
_URL = re.compile(r"https?://[^\s\"'<>()\[\]{},]+")


def offers_web_search(body: Any) -> bool:
    """Whether the request offers the model a function named ``web_search``."""
    tools = body.get("tools") if isinstance(body, dict) else None
    return any(
        isinstance(t, dict)
        and isinstance(t.get("function"), dict)
        and t["function"].get("name") == "web_search"
        for t in tools or ()
    )


def search_turn(messages: list[dict]) -> dict:
    """The current turn of a searching model (what follows the last user message): the
    query (the last user text), how many ``web_search`` calls have a ``tool`` answer, those
    answers' texts, and how many other tools' answers there are."""
    start = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    query = _tool_text(messages[start]).strip() if start >= 0 else ""
    query = query.removeprefix(SEARCH_PREFIX).strip()
    names = {
        c.get("id"): (c.get("function") or {}).get("name")
        for m in messages[start + 1 :]
        if m.get("role") == "assistant"
        for c in m.get("tool_calls") or ()
    }
    answers = [m for m in messages[start + 1 :] if m.get("role") == "tool"]
    texts = [_tool_text(m) for m in answers if names.get(m.get("tool_call_id")) == "web_search"]
    return {
        "query": " ".join(query.split()),
        "searches": len(texts),
        "search_texts": texts,
        "client_results": len(answers) - len(texts),
    }


def offers_function(body: Any, name: str) -> bool:
    """Whether the request offers the model a function named ``name``."""
    tools = body.get("tools") if isinstance(body, dict) else None
    return any(
        isinstance(t, dict)
        and isinstance(t.get("function"), dict)
        and t["function"].get("name") == name
        for t in tools or ()
    )


def fetch_turn(messages: list[dict]) -> dict:
    """The current turn of a fetching model: the last user text, and the texts of the
    ``tool`` answers to its ``web_fetch`` and ``web_search`` calls."""
    start = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    names = {
        c.get("id"): (c.get("function") or {}).get("name")
        for m in messages[start + 1 :]
        if m.get("role") == "assistant"
        for c in m.get("tool_calls") or ()
    }
    answers = [m for m in messages[start + 1 :] if m.get("role") == "tool"]
    return {
        "text": _tool_text(messages[start]) if start >= 0 else "",
        "fetched": [_tool_text(m) for m in answers if names.get(m["tool_call_id"]) == "web_fetch"],
        "searched": [
            _tool_text(m) for m in answers if names.get(m["tool_call_id"]) == "web_search"
        ],
    }


def last_turn(messages: list[dict]) -> dict:
    """The last message that is not a ``role: "system"`` turn (or the last one)."""
    return next((m for m in reversed(messages) if m.get("role") != "system"), messages[-1])


def quoted_key(headers: Mapping[str, str]) -> str:
    """What a careless upstream (or a proxy in front of it) says about the credential it
    was sent: the header, the bare key, its URL-encoded form, and internal addresses."""
    auth = headers.get("Authorization", "")
    key = auth.removeprefix("Bearer ")
    return (
        f"invalid key '{key}' (header 'Authorization: {auth}', query key="
        f"{quote(key, safe='')}) refused by gpu-node-7.internal.example:8000 via fd00::17"
        f" and [fd00::17]:8000"
    )


def status_reply(model: str, headers: Mapping[str, str] | None = None) -> web.Response:
    """``status:N[:K]``: HTTP N with body K (traceback | context | plain | quote-key)."""
    parts = model.split(":")
    code = int(parts[1])
    kind = parts[2] if len(parts) > 2 else "plain"
    if kind == "traceback":
        return web.Response(status=code, text=TRACEBACK)
    if kind == "quote-key":
        return web.json_response(
            {
                "object": "error",
                "message": quoted_key(headers or {}),
                "type": "BadRequestError",
                "param": None,
                "code": code,
            },
            status=code,
        )
    if kind == "context":
        return web.json_response(
            {
                "object": "error",
                "message": CONTEXT,
                "type": "BadRequestError",
                "param": None,
                "code": code,
            },
            status=code,
        )
    return web.json_response(
        {
            "object": "error",
            "message": f"stub says {code}",
            "type": "Error",
            "param": None,
            "code": code,
        },
        status=code,
    )


# --- the other OpenAI routes, shaped as vLLM's ---------------------------------------------


def text_completion_chunk(
    model: str, text: str, finish: str | None = None, usage: dict | None = None
) -> bytes:
    body: dict = {
        "id": "cmpl-stub",
        "object": "text_completion",
        "created": CREATED,
        "model": model,
        "choices": [],
    }
    if usage is None:
        body["choices"] = [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        ]
    else:
        body["usage"] = usage
    return b"data: " + _compact(body).encode() + b"\n\n"


def completions_script(model: str, body: dict) -> tuple[list[bytes], dict]:
    """(stream frames, buffered body) of ``/v1/completions``: the text of ``ok``."""
    options = body.get("stream_options") or {}
    frames = [text_completion_chunk(model, t) for t in TEXT]
    frames.append(text_completion_chunk(model, "", "stop"))
    if options.get("include_usage"):
        frames.append(text_completion_chunk(model, "", usage=USAGE))
    buffered = {
        "id": "cmpl-stub",
        "object": "text_completion",
        "created": CREATED,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": "".join(TEXT),
                "logprobs": None,
                "finish_reason": "stop",
                "stop_reason": None,
                "prompt_logprobs": None,
            }
        ],
        "usage": USAGE,
    }
    return [*frames, b"data: [DONE]\n\n"], buffered


def embedding_vector(i: int) -> list[float]:
    return [float(i + 1), 0.5, -0.25, 0.125]  # exact in float32, so base64 round-trips


def embeddings_reply(model: str, body: dict) -> dict:
    """``/v1/embeddings``: one 4-dimension vector per input, as floats or base64 float32."""
    given = body.get("input")
    inputs = (
        given if isinstance(given, list) and given and not isinstance(given[0], int) else [given]
    )
    data = []
    for i in range(len(inputs)):
        vector = embedding_vector(i)
        value: object = vector
        if body.get("encoding_format") == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"index": i, "object": "embedding", "embedding": value})
    return {
        "id": "embd-stub",
        "object": "list",
        "created": CREATED,
        "model": model,
        "data": data,
        "usage": {
            "prompt_tokens": USAGE["prompt_tokens"],
            "total_tokens": USAGE["prompt_tokens"],
            "completion_tokens": 0,
            "prompt_tokens_details": None,
        },
    }


RESPONSE_USAGE = {
    "input_tokens": 12,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 5,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 17,
}


def response_object(model: str, status: str, output: list, usage: dict | None) -> dict:
    return {
        "id": "resp_stub",
        "created_at": CREATED,
        "incomplete_details": None,
        "instructions": None,
        "metadata": None,
        "model": model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "background": False,
        "max_output_tokens": None,
        "previous_response_id": None,
        "reasoning": None,
        "service_tier": "auto",
        "status": status,
        "text": None,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
    }


def responses_script(model: str, body: dict) -> tuple[list[bytes], dict]:
    """(stream frames, buffered body) of ``/v1/responses``: vLLM's named events, each
    ``event: <type>`` with the event's JSON (``type`` last, as pydantic writes it); no
    ``[DONE]``. ``text-tool:PATH``: the message is a Read of PATH written as Hermes text,
    in 7-character deltas, as an engine without its tool parser writes it."""
    pieces = list(TEXT)
    if model.startswith("text-tool:"):
        call = json.dumps({"name": "Read", "arguments": {"file_path": model.split(":", 1)[1]}})
        whole = f"I'll read it.\n<tool_call>\n{call}\n</tool_call>"
        pieces = [whole[i : i + 7] for i in range(0, len(whole), 7)]
    text = "".join(pieces)
    part = {"annotations": [], "text": "", "type": "output_text", "logprobs": []}
    message = {
        "id": "msg_stub",
        "content": [{**part, "text": text}],
        "role": "assistant",
        "status": "completed",
        "type": "message",
    }
    at = {"item_id": "msg_stub", "output_index": 0, "content_index": 0}
    seq = itertools.count()

    def event(kind: str, **fields: object) -> bytes:
        data = _compact({**fields, "sequence_number": next(seq), "type": kind})
        return b"event: " + kind.encode() + b"\ndata: " + data.encode() + b"\n\n"

    started = response_object(model, "in_progress", [], None)
    frames = [
        event("response.created", response=started),
        event("response.in_progress", response=started),
        event(
            "response.output_item.added",
            item={**message, "content": [], "status": "in_progress"},
            output_index=0,
        ),
        event("response.content_part.added", **at, part=part),
    ]
    frames += [event("response.output_text.delta", **at, delta=t, logprobs=[]) for t in pieces]
    frames += [
        event("response.output_text.done", **at, text=text, logprobs=[]),
        event("response.content_part.done", **at, part={**part, "text": text}),
        event("response.output_item.done", item=message, output_index=0),
        event(
            "response.completed",
            response=response_object(model, "completed", [message], RESPONSE_USAGE),
        ),
    ]
    return frames, response_object(model, "completed", [message], RESPONSE_USAGE)


class Stub:
    def __init__(self, *, cut_all: bool = False) -> None:
        self.cut_all = cut_all  # every ok-family chat stream is cut (cut-mid)
        self.requests: list[dict] = []
        self.open_streams = 0
        self.client_gone = 0
        self.resets: dict[str, int] = {}  # requests seen per reset-* scenario
        self.active = 0  # chat requests being handled now
        self.cancelled = 0  # chat requests whose client (the gateway) went away
        self.cut = 0  # chat streams cut mid-stream (cut-mid, cut-every:N)
        self.streams: dict[str, int] = {}  # streams seen per cut-every:N scenario
        self.failures: dict[str, int] = {}  # fail-first:N:S requests seen per message
        self.tool_cuts: dict[str, int] = {}  # tool-cut:N streams seen per conversation

    @web.middleware
    async def track(self, request: web.Request, handler):  # type: ignore[no-untyped-def]
        if not request.path.endswith("/chat/completions"):
            return await handler(request)
        self.active += 1
        try:
            return await handler(request)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1

    async def _record(self, request: web.Request) -> Any:
        """Read and keep the request (for ``GET /_requests``); its JSON body, or None."""
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.requests.append(
            {
                "method": request.method,
                "path": request.path_qs,
                "headers": dict(request.headers),
                "body": body,
                "raw": raw.decode("utf-8", "replace"),
                "peer": peer[1] if peer else None,
            }
        )
        return body

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        model = body.get("model", "ok") if isinstance(body, dict) else "ok"
        stream = isinstance(body, dict) and body.get("stream") is True
        if model.startswith("status:"):
            return status_reply(model, request.headers)
        if model.startswith("quote-key:"):
            return await self.quote_key(request, "chat", model, body, stream)
        if model == "hang-headers":
            await asyncio.sleep(3600)
        if model.startswith("delay:"):
            await asyncio.sleep(int(model.split(":")[1]) / 1000)
        if model.startswith("fail-first:"):
            _, times, code = model.split(":")
            key = json.dumps(last_turn(body["messages"]).get("content"))
            self.failures[key] = self.failures.get(key, 0) + 1
            if self.failures[key] <= int(times):
                return status_reply(f"status:{code}")
        if model in ("reset-always", "reset-once"):
            self.resets[model] = self.resets.get(model, 0) + 1
            if model == "reset-always" or self.resets[model] % 2 == 1:
                assert request.transport is not None
                request.transport.abort()  # connection cut before any response byte
                await asyncio.sleep(3600)  # the handler is cancelled with the connection
        if model.startswith("fetch") and offers_function(body, "web_fetch"):
            return await self.web_fetch_turn(request, body, model, stream)
        if offers_web_search(body):
            return await self.web_search_turn(request, body, model, stream)
        if model.startswith("cc-tool:"):
            return await self.tool_round_trip(request, body, model, stream)
        if model.startswith("agent:"):
            return await self.agent_round_trip(request, body, model, stream)
        if model.startswith("think-tool:"):
            return await self.thinking_round_trip(request, body, model, stream)
        if model.startswith("cc-steps:"):
            return await self.tool_steps(request, body, model, stream)
        if model.startswith("golden:"):
            return await self.golden_replay(request, model, stream)
        if model.startswith(("tool-cut:", "text-tool-cut:")):
            return await self.tool_cut(request, body, model, stream)
        if model.split(":", 1)[0] in LocalEngine.SCENARIOS:
            return await LocalEngine(model, body).reply(request, stream)
        frames, buffered = script(
            model if model in ("reasoning", "tools", "length", "cached") else "ok"
        )
        frames = [
            f.replace(b'"model":"ok"', b'"model":' + json.dumps(model).encode()) for f in frames
        ]
        if not stream:
            buffered["model"] = model
            if model.startswith("big:"):
                buffered["choices"][0]["message"]["content"] = "x" * 1000 * int(model.split(":")[1])
            return web.json_response(buffered, dumps=_compact)
        prefill = _prefill(body)
        if prefill is not None and (model in ("ok", "cut-mid") or model.startswith("cut-every:")):
            frames = continued_frames(model, prefill)
        cut = model == "cut-mid" or (self.cut_all and model == "ok")
        if model.startswith("cut-every:"):
            self.streams[model] = self.streams.get(model, 0) + 1
            cut = self.streams[model] % int(model.split(":")[1]) == 0
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.open_streams += 1
        try:
            if model == "malformed":
                frames = [*frames[:2], b"data: {not json\n\n", *frames[2:]]
            elif model == "inband-error":
                frames = [*frames[:2], INBAND_ERROR]
            elif model == "eof-no-finish":
                frames = frames[:3]
            elif model.startswith("slow:"):
                delay = int(model.split(":")[1]) / 1000
                frames = [frames[0]] + [chunk(model, {"content": f"t{i} "}) for i in range(50)]
                for f in frames:
                    await resp.write(f)
                    await asyncio.sleep(delay)
                frames = [chunk(model, {}, "stop", usage=USAGE), b"data: [DONE]\n\n"]
            if model.startswith("prefill:"):
                await asyncio.sleep(int(model.split(":")[1]) / 1000)
            if model.startswith("big:"):
                piece = chunk(model, {"content": "x" * 1000})
                for _ in range(int(model.split(":")[1])):
                    await resp.write(piece)
            for i, f in enumerate(frames):
                if cut and i == 2:
                    assert request.transport is not None
                    request.transport.abort()
                    self.cut += 1
                    return resp
                if model == "hang-mid" and i == 2:
                    await asyncio.sleep(3600)
                await resp.write(f)
            if model.startswith("end-late:"):
                await asyncio.sleep(int(model.split(":")[1]) / 1000)
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            self.client_gone += 1
            raise
        finally:
            self.open_streams -= 1
        return resp

    async def tool_cut(
        self, request: web.Request, body: dict, model: str, stream: bool
    ) -> web.StreamResponse:
        """``tool-cut:N``: see the module docstring."""
        messages = body["messages"]
        prefilled = messages[-1].get("role") == "assistant"
        key = model + json.dumps(messages[:-1] if prefilled else messages)
        seen = self.tool_cuts[key] = self.tool_cuts.get(key, 0) + 1
        say, whole = "Let me check the weather.", '{"city": "Paris"}'
        call_id = f"call_{seen}"
        text = '\n\n<tool_call>\n{"name": "get_weather", "arguments": ' + whole + "}\n</tool_call>"
        if not stream and model.startswith("text-tool-cut:"):
            message = {"role": "assistant", "content": say + text}
            return web.json_response(completion(model, message, "stop", USAGE), dumps=_compact)
        if not stream:
            message = {
                "role": "assistant",
                "content": say,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": whole},
                    }
                ],
            }
            return web.json_response(
                completion(model, message, "tool_calls", USAGE), dumps=_compact
            )
        frames = [chunk(model, {"role": "assistant", "content": ""})]
        if not prefilled:
            frames += [
                chunk(model, {"content": "Let me check"}),
                chunk(model, {"content": " the weather."}),
            ]
        if model.startswith("text-tool-cut:"):
            calls = [chunk(model, {"content": text[i : i + 7]}) for i in range(0, len(text), 7)]
            half = len(frames) + len(calls) // 2  # cut halfway through the call text
            frames += [
                *calls,
                chunk(model, {}, "stop"),
                chunk(model, {}, usage=USAGE, choices=False),
                b"data: [DONE]\n\n",
            ]
            return await self._cut_at(request, frames, half, seen, model)
        frames.append(
            chunk(
                model,
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                },
            )
        )
        half = len(frames) + 1  # the stream is cut after the first half of the arguments
        frames += [
            chunk(model, {"tool_calls": [{"index": 0, "function": {"arguments": a}}]})
            for a in (whole[:9], whole[9:])
        ]
        frames += [
            chunk(model, {}, "tool_calls"),
            chunk(model, {}, usage=USAGE, choices=False),
            b"data: [DONE]\n\n",
        ]
        return await self._cut_at(request, frames, half, seen, model)

    async def _cut_at(
        self, request: web.Request, frames: list[bytes], half: int, seen: int, model: str
    ) -> web.StreamResponse:
        """Stream ``frames``, cut before frame ``half`` while ``seen`` is within the N of
        ``model`` (``...:N``)."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, frame in enumerate(frames):
            if i == half and seen <= int(model.split(":")[1]):
                assert request.transport is not None
                request.transport.abort()
                self.cut += 1
                return resp
            await resp.write(frame)
        await resp.write_eof()
        return resp

    async def _reply(
        self,
        request: web.Request,
        model: str,
        frames: list[bytes],
        message: dict,
        finish: str,
        stream: bool,
    ) -> web.StreamResponse:
        """A scripted turn: the buffered completion, or its frames then ``[DONE]``."""
        if not stream:
            return web.json_response(completion(model, message, finish, USAGE), dumps=_compact)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for f in [*frames, b"data: [DONE]\n\n"]:
            await resp.write(f)
        await resp.write_eof()
        return resp

    async def _call_or_answer(
        self,
        request: web.Request,
        model: str,
        stream: bool,
        *,
        call: tuple[str, str, str] | None,
        answer: str,
        reasoning: str = "",
        pieces: int = 1,
    ) -> web.StreamResponse:
        """Reply with the tool ``call`` (id, name, arguments sent in ``pieces``), or, when it
        is None, with the text ``answer``; ``reasoning`` first, in two chunks, if given."""
        frames = [chunk(model, {"role": "assistant", "content": ""})]
        message: dict = {"role": "assistant"}
        if reasoning:
            frames += [
                chunk(model, {"reasoning_content": reasoning[:12]}),
                chunk(model, {"reasoning_content": reasoning[12:]}),
            ]
            message["reasoning_content"] = reasoning
        if call is None:
            frames += [
                chunk(model, {"content": answer}),
                chunk(model, {}, "stop"),
                chunk(model, {}, usage=USAGE, choices=False),
            ]
            return await self._reply(
                request, model, frames, {**message, "content": answer}, "stop", stream
            )
        call_id, name, args = call
        frames.append(
            chunk(
                model,
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                },
            )
        )
        size = -(-len(args) // pieces) or 1
        frames += [
            chunk(model, {"tool_calls": [{"index": 0, "function": {"arguments": a}}]})
            for a in (args[i : i + size] for i in range(0, len(args), size))
        ]
        frames += [chunk(model, {}, "tool_calls"), chunk(model, {}, usage=USAGE, choices=False)]
        message.update(
            content=None,
            tool_calls=[
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            ],
        )
        return await self._reply(request, model, frames, message, "tool_calls", stream)

    async def tool_round_trip(
        self, request: web.Request, body: dict, model: str, stream: bool
    ) -> web.StreamResponse:
        """Ask for the `Read` tool on the file named in the model; then answer with its text."""
        last = last_turn(body["messages"])
        if last.get("role") == "tool":
            text = _tool_text(last, as_json=True).strip().replace("\n", " ")[:200]
            return await self._call_or_answer(
                request, model, stream, call=None, answer="The file says: " + text
            )
        args = json.dumps({"file_path": model.split(":", 1)[1]})
        return await self._call_or_answer(
            request, model, stream, answer="", pieces=2, call=("call_read_1", "Read", args)
        )

    async def agent_round_trip(
        self, request: web.Request, body: dict, model: str, stream: bool
    ) -> web.StreamResponse:
        """``agent:NAME:ARGS``: call tool NAME with ARGS; once its result is the last message,
        answer with that result's text, so a final answer proves the tool result arrived."""
        _, name, args = model.split(":", 2)
        last = last_turn(body["messages"])
        if last.get("role") == "tool":
            return await self._call_or_answer(
                request, model, stream, call=None, answer="The tool said: " + _tool_text(last)
            )
        return await self._call_or_answer(
            request, model, stream, answer="", pieces=2, call=("call_agent_1", name, args)
        )

    async def thinking_round_trip(
        self, request: web.Request, body: dict, model: str, stream: bool
    ) -> web.StreamResponse:
        """``think-tool:NAME:ARGS``: reason, then call tool NAME with ARGS; once its result is
        the last message, reason again and answer with it. Each turn's reasoning names the
        turn (``REASONING_1``...), so a test can see which reasoning came back upstream."""
        _, name, args = model.split(":", 2)
        turn = 1 + sum(1 for m in body["messages"] if m.get("role") == "assistant")
        reasoning = f"REASONING_{turn}: I need {name} before I can answer."
        last = last_turn(body["messages"])
        if last.get("role") == "tool":
            text = "The tool said: " + _tool_text(last, as_json=True).strip()[:200]
            return await self._call_or_answer(
                request, model, stream, call=None, answer=text, reasoning=reasoning
            )
        return await self._call_or_answer(
            request,
            model,
            stream,
            answer="",
            call=(f"call_think_{turn}", name, args),
            reasoning=reasoning,
        )

    async def tool_steps(
        self, request: web.Request, body: dict, model: str, stream: bool
    ) -> web.StreamResponse:
        """``cc-steps:STEPS``: the n-th assistant turn calls the n-th ``[NAME, ARGS]`` of
        STEPS; after the last, text holding the last tool result (a multi-tool script, e.g.
        ToolSearch to load a deferred tool, then that tool)."""
        steps = json.loads(model.split(":", 1)[1])
        done = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        if done < len(steps):
            name, args = steps[done][0], json.dumps(steps[done][1])
            return await self._call_or_answer(
                request, model, stream, answer="", call=(f"call_step_{done + 1}", name, args)
            )
        last = next(
            (m for m in reversed(body["messages"]) if m.get("role") == "tool"), {"content": ""}
        )
        return await self._call_or_answer(
            request, model, stream, call=None, answer="The tool said: " + _tool_text(last)
        )

    async def web_search_turn(
        self, request: web.Request, body: dict, model: str, stream: bool
    ) -> web.StreamResponse:
        """A searching model's turn (see the docstring: web search): search, maybe call a
        client tool (``search-tool:NAME:ARGS``), then answer citing the first URL found."""
        turn = search_turn(body["messages"])
        wanted = int(model.split(":")[1]) if model.startswith("search:") else 1
        done = turn["searches"]
        if model.startswith("search-parallel:") and not done:
            count = int(model.split(":")[1])
            return await self._parallel_calls(
                request,
                model,
                stream,
                [
                    (f"call_search_{k}", json.dumps({"query": f"{turn['query']} (part {k})"}))
                    for k in range(1, count + 1)
                ],
            )
        if model.startswith("search-args:") and not done:
            return await self._call_or_answer(
                request,
                model,
                stream,
                answer="",
                call=("call_search_1", "web_search", model.split(":", 1)[1]),
            )
        if done < wanted:
            query = turn["query"] + (f" (search {done + 1})" if done else "")
            return await self._call_or_answer(
                request,
                model,
                stream,
                answer="",
                pieces=3,
                call=(f"call_search_{done + 1}", "web_search", json.dumps({"query": query})),
            )
        if model.startswith("search-tool:") and not turn["client_results"]:
            _, name, args = model.split(":", 2)
            return await self._call_or_answer(
                request, model, stream, answer="", pieces=2, call=("call_client_1", name, args)
            )
        url = next(
            (u.rstrip(".:;") for text in turn["search_texts"] for u in _URL.findall(text)), None
        )
        answer = (
            f"According to {url}, that is the answer."
            if url
            else "The search found nothing: " + (turn["search_texts"] or [""])[-1][:300]
        )
        quote = re.search(r"Snippet 1 about .*?\.(?=\s|$)", "\n".join(turn["search_texts"]))
        if model == "search-quote" and url and quote:
            answer = f"According to {url}: {quote.group(0)} That is all."
        return await self._call_or_answer(request, model, stream, call=None, answer=answer)

    async def web_fetch_turn(
        self, request: web.Request, body: dict, model: str, stream: bool
    ) -> web.StreamResponse:
        """A fetching model's turn (see the docstring: web fetch)."""
        turn = fetch_turn(body["messages"])
        if model == "fetch-search" and not turn["searched"]:
            query = json.dumps({"query": turn["text"].strip()})
            return await self._call_or_answer(
                request, model, stream, answer="", call=("call_search_1", "web_search", query)
            )
        if not turn["fetched"]:
            if model.startswith("fetch-url:"):
                url = model.split(":", 1)[1]
            elif model == "fetch-search":
                url = next(iter(_URL.findall(turn["searched"][0])), "").rstrip(".:;")
            else:
                url = next(iter(_URL.findall(turn["text"])), "").rstrip(".:;")
            return await self._call_or_answer(
                request,
                model,
                stream,
                answer="",
                pieces=3,
                call=("call_fetch_1", "web_fetch", json.dumps({"url": url})),
            )
        text = turn["fetched"][-1]
        body_text = text.split("\n\n", 1)[1] if "\n\n" in text else text
        line = body_text.strip().splitlines()[0] if body_text.strip() else ""
        answer = f"Fetched: {line}"
        if model == "fetch-quote":
            answer = f"The page says: {line} That is all."
        return await self._call_or_answer(request, model, stream, call=None, answer=answer)

    async def _parallel_calls(
        self, request: web.Request, model: str, stream: bool, calls: list[tuple[str, str]]
    ) -> web.StreamResponse:
        """One assistant turn calling ``web_search`` once per (id, arguments), in parallel."""
        frames = [chunk(model, {"role": "assistant", "content": ""})]
        for index, (call_id, args) in enumerate(calls):
            frames.append(
                chunk(
                    model,
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call_id,
                                "type": "function",
                                "function": {"name": "web_search", "arguments": ""},
                            }
                        ]
                    },
                )
            )
            frames += [
                chunk(
                    model,
                    {"tool_calls": [{"index": index, "function": {"arguments": args[i : i + 9]}}]},
                )
                for i in range(0, len(args), 9)
            ]
        frames += [chunk(model, {}, "tool_calls"), chunk(model, {}, usage=USAGE, choices=False)]
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "web_search", "arguments": args},
                }
                for call_id, args in calls
            ],
        }
        return await self._reply(request, model, frames, message, "tool_calls", stream)

    async def golden_replay(
        self, request: web.Request, model: str, stream: bool
    ) -> web.StreamResponse:
        """``golden:CASE``: a recorded golden stream, replayed (or its buffered equal)."""
        case = model.split(":", 1)[1]
        if not _CASE_NAME.fullmatch(case) or not (GOLDEN_STREAMS / case).is_dir():
            return status_reply("status:404")
        raw = (GOLDEN_STREAMS / case / "upstream.sse").read_bytes()
        if not stream:
            return web.json_response(buffered_completion(raw), dumps=_compact)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in raw.split(b"\n\n"):
            if event:
                await resp.write(event + b"\n\n")
        await resp.write_eof()
        return resp

    async def quote_key(
        self, request: web.Request, route: str, model: str, body: dict, stream: bool
    ) -> web.StreamResponse:
        """``quote-key:CODE`` on ``route`` (chat, completions, embeddings, responses)."""
        message = quoted_key(request.headers)
        error = {
            "message": message,
            "type": "BadRequestError",
            "param": None,
            "code": int(model.split(":")[1]),
        }
        failed = {
            **response_object(model, "failed", [], None),
            "error": {"code": "server_error", "message": message},
        }
        if not stream:
            reply = failed if route == "responses" else {"error": error}
            return web.json_response(reply, dumps=_compact)
        if route == "responses":
            frames = responses_script(model, body)[0][:2]
            frames += [
                b"event: error\ndata: "
                + _compact(
                    {
                        "type": "error",
                        "code": str(error["code"]),
                        "message": message,
                        "param": None,
                        "sequence_number": 2,
                    }
                ).encode()
                + b"\n\n",
                b"event: response.failed\ndata: "
                + _compact(
                    {"response": failed, "sequence_number": 3, "type": "response.failed"}
                ).encode()
                + b"\n\n",
            ]
        else:
            head = (completions_script(model, body) if route == "completions" else script(model))[
                0
            ][:2]
            frames = [
                *head,
                b"data: " + _compact({"error": error}).encode() + b"\n\n",
                b"data: [DONE]\n\n",
            ]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for frame in frames:
            await resp.write(frame)
        await resp.write_eof()
        return resp

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize with chat messages: {"count", "max_model_len", "tokens"}."""
        body = await request.json()
        self.requests.append(
            {
                "method": "POST",
                "path": request.path,
                "body": body,
                "headers": dict(request.headers),
                "raw": "",
            }
        )
        if str(body.get("model", "")).startswith("status:404"):  # a router: no such route
            raise web.HTTPNotFound()
        n = len(json.dumps(body.get("messages", []))) // 3
        return web.json_response({"count": n, "max_model_len": 4096, "tokens": list(range(n))})

    async def get_requests(self, request: web.Request) -> web.Response:
        return web.json_response(self.requests)

    async def clear_requests(self, request: web.Request) -> web.Response:
        self.requests.clear()
        return web.json_response({})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "open_streams": self.open_streams,
                "client_gone": self.client_gone,
                "active": self.active,
                "cancelled": self.cancelled,
                "cut": self.cut,
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def openai_route(self, request: web.Request) -> web.StreamResponse:
        """``/v1/completions``, ``/v1/embeddings``, ``/v1/responses``."""
        body = await self._record(request)
        if not isinstance(body, dict):
            return web.json_response(
                {
                    "object": "error",
                    "message": "not JSON",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                },
                status=400,
            )
        model = str(body.get("model", "ok"))
        if model.startswith("status:"):
            return status_reply(model, request.headers)
        route = request.path.rsplit("/", 1)[1]
        if model.startswith("quote-key:"):
            return await self.quote_key(request, route, model, body, body.get("stream") is True)
        if route == "embeddings":
            return web.json_response(embeddings_reply(model, body), dumps=_compact)
        script_of = completions_script if route == "completions" else responses_script
        frames, buffered = script_of(model, body)
        if body.get("stream") is not True:
            return web.json_response(buffered, dumps=_compact)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, frame in enumerate(frames):
            if model == "cut-mid" and i == 2:
                assert request.transport is not None
                request.transport.abort()
                return resp
            await resp.write(frame)
        await resp.write_eof()
        return resp


# --- local engines without their parsers (Claude Code tests) ------------------------------


class LocalEngine:
    """One turn of ``text-tool:PATH``, ``broken-args:PATH``, ``inline-think:PATH`` or ``chat``:
    what an engine started without its tool or reasoning parser streams (see the docstring).
    Tool turns: a Read of PATH until the last message is a tool result, then text with it."""

    SCENARIOS = ("text-tool", "broken-args", "inline-think", "chat")
    CHUNK = 7  # odd chunks, so the tags are split across deltas

    def __init__(self, model: str, body: dict) -> None:
        self.model = model
        self.kind, _, self.path = model.partition(":")
        self.messages = body.get("messages") or []

    def _frames(self, content: str, size: int) -> list[bytes]:
        return [
            chunk(self.model, {"content": content[i : i + size]})
            for i in range(0, len(content), size)
        ]

    def turn(self) -> tuple[list[bytes], dict, str]:
        """(content and tool_calls frames, the buffered message, finish_reason)."""
        last = last_turn(self.messages)
        if self.kind == "chat":
            turn = 1 + sum(1 for m in self.messages if m.get("role") == "assistant")
            said = _tool_text(last) if last.get("role") == "user" else ""
            text = f"Reply {turn}: " + " ".join(said.split())[:60]
            if "CRITICAL: Respond with TEXT ONLY" in said:  # Claude Code's /compact prompt
                text = f"<summary>Summary {turn}: the user said hello.</summary>"
            return self._frames(text, self.CHUNK), {"content": text}, "stop"
        think = "<think>\nI should read the file.\n</think>\n\n"
        if last.get("role") == "tool":
            text = (
                "The file says: " + _tool_text(last, as_json=True).strip().replace("\n", " ")[:200]
            )
            if self.kind == "inline-think":
                text = think.replace("read the file", "quote the file") + text
            return self._frames(text, self.CHUNK), {"content": text}, "stop"
        if self.kind == "broken-args":
            args = "{'file_path': " + repr(self.path) + ",}"
            call = {
                "index": 0,
                "id": "call_broken_1",
                "type": "function",
                "function": {"name": "Read", "arguments": ""},
            }
            size = -(-len(args) // 5)
            frames = [chunk(self.model, {"tool_calls": [call]})]
            frames += [
                chunk(
                    self.model,
                    {"tool_calls": [{"index": 0, "function": {"arguments": args[i : i + size]}}]},
                )
                for i in range(0, len(args), size)
            ]
            message = {
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_broken_1",
                        "type": "function",
                        "function": {"name": "Read", "arguments": args},
                    }
                ],
            }
            return frames, message, "tool_calls"
        call = json.dumps({"name": "Read", "arguments": {"file_path": self.path}})
        text = f"I'll read it.\n<tool_call>\n{call}\n</tool_call>"
        if self.kind == "inline-think":
            text = think + text
        return self._frames(text, self.CHUNK), {"content": text}, "stop"

    async def reply(self, request: web.Request, stream: bool) -> web.StreamResponse:
        frames, message, finish = self.turn()
        message = {"role": "assistant", **message}
        if not stream:
            return web.json_response(completion(self.model, message, finish, USAGE), dumps=_compact)
        frames = [
            chunk(self.model, {"role": "assistant", "content": ""}),
            *frames,
            chunk(self.model, {}, finish),
            chunk(self.model, {}, usage=USAGE, choices=False),
            b"data: [DONE]\n\n",
        ]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for frame in frames:
            await resp.write(frame)
        await resp.write_eof()
        return resp


def make_app(*, cut_all: bool = False) -> web.Application:
    stub = Stub(cut_all=cut_all)
    app = web.Application(middlewares=[stub.track])
    app.router.add_post("/v1/chat/completions", stub.chat)
    for route in ("completions", "embeddings", "responses"):
        app.router.add_post(f"/v1/{route}", stub.openai_route)
    app.router.add_post("/tokenize", stub.tokenize)
    app.router.add_get("/_requests", stub.get_requests)
    app.router.add_delete("/_requests", stub.clear_requests)
    app.router.add_get("/_stats", stub.stats)
    app.router.add_get("/health", stub.health)
    return app


if __name__ == "__main__":
    web.run_app(
        make_app(cut_all=sys.argv[2:3] == ["cut-all"]),
        host="127.0.0.1",
        port=int(sys.argv[1]),
        print=None,
        handler_cancellation=True,
        access_log=None,
    )
