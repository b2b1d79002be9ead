"""How a reply proves it answers its request, per upstream ``kind``: pure, no I/O.

The gateway sends every attempt an id of its own (gateway/text/ids.py) as ``X-Request-Id``.
What each engine does with it (read in their servers' sources):

* vLLM takes the header as its request id whether or not ``--enable-request-id-headers`` is
  on (``_base_request_id`` in vllm/entrypoints/openai/engine/serving.py, formerly
  serving_engine.py) and names the chat completion ``chatcmpl-<id>``
  (vllm/entrypoints/openai/chat_completion/serving.py, formerly serving_chat.py: the
  ``ChatCompletionResponse`` and every stream chunk carry ``id=request_id``); the flag only
  adds the header echo (``XRequestIdMiddleware``).
* SGLang ignores the header; its chat request takes a ``rid`` field
  (``ChatCompletionRequest.rid``, python/sglang/srt/entrypoints/openai/protocol.py), passed
  as ``GenerateReqInput.rid`` (serving_chat.py ``_convert_to_internal_request``) and returned
  as ``meta_info["id"]``, the completion's ``id`` (buffered: ``ChatCompletionResponse(id=
  ret[0]["meta_info"]["id"])``; streamed: every chunk's ``chunk_id``). With ``n`` > 1 the
  ids are ``<rid>_<i>`` (io_struct.py ``_normalize_rid``).
* llama.cpp's server echoes nothing and names a completion ``chatcmpl-`` and 32 random
  characters (``gen_chatcmplid``; seen from llama-server itself, tests/e2e); Ollama's OpenAI
  route ``chatcmpl-<0..998>`` (middleware/openai.go, ``rand.Intn(999)``). Neither can prove
  anything: their connections carry one request each.

So a chat completion's body names its request on vLLM (``chatcmpl-`` + the id) and on SGLang
(the id, sent as ``rid``). Both engines write the ``id`` first (their response models declare
it first, serialised compactly), so the check reads only the body's first bytes: the first
JSON object (a stream's first ``data:`` event) must open with ``"id"`` and that value, ended
by its quote (or ``_``, SGLang's suffix for ``n`` > 1). Anything else names another request,
or none.
"""

from __future__ import annotations

import re

# kind -> (the completion id's prefix before the request id, whether the id goes in the body)
BODY_PROOF: dict[str, tuple[bytes, bool]] = {
    "vllm": (b"chatcmpl-", False),
    "sglang": (b"", True),
}
# only chat completions are named this way (vLLM's /completions says cmpl-<id>: not used)
PROVABLE_PATH = "/chat/completions"
# how far into a body the first object's id may be looked for
WINDOW = 8192

_ID = re.compile(rb'\{\s*"id"\s*:\s*"')


def with_rid(body: bytes, rid: bytes) -> bytes | None:
    """``body`` (a JSON object) with ``"rid"`` first; None when it does not start ``{"``
    or already says ``"rid"`` anywhere (a pass-through client's own: it would win, being
    later, and the reply would name the client's id, proving nothing)."""
    if body[:2] != b'{"' or body.find(b'"rid"') >= 0:  # (find: see gateway/text/sse.py)
        return None
    return b'{"rid":"' + rid + b'",' + body[1:]


def verdict(data: bytes, expect: bytes, *, final: bool) -> bool | None:
    """Does ``data`` (a body's first bytes) open with the completion id ``expect``?

    None: not yet known (more bytes needed; never past WINDOW or at the body's end).
    """
    start = data.find(b"{", 0, WINDOW)
    if start < 0:
        return False if final or len(data) >= WINDOW else None
    head = _ID.match(data, start)
    if head is None:
        # too few bytes to tell, or another first key
        if not final and len(data) - start < 16 and len(data) < WINDOW:
            return None
        return False
    at = head.end()
    end = at + len(expect)
    if len(data) <= end:
        return False if final or len(data) >= WINDOW else None
    return data[at:end] == expect and data[end : end + 1] in (b'"', b"_")
