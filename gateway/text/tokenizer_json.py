"""The JSON of ``count_tokens``' tokenizer calls, built and read by pure functions, so that
past ``server.decode_offload_bytes`` they run in the decoder child (gateway/http/decoder.py)
and not on the event loop (gateway/messages/tokens.py). ujson holds the GIL for a whole call:
a thread does not help the loop.

Facts the code relies on:

* llama.cpp's ``POST /apply-template`` answers ``{"prompt":"..."}`` (compact, that one key);
  its ``POST /tokenize`` takes ``{"content": str, "add_special": bool, "parse_special":
  bool}`` and answers ``{"tokens": [int, ...]}``: for a 30 MiB prompt some 60 MB of JSON.
* vLLM's ``POST /tokenize`` answers ``{"count": int, "max_model_len": int, "tokens": [...]}``.
* The templated prompt is the client's prompt and a few markers: encoding it again cost as
  much as encoding the request (a 30 MiB prompt of code: 0.29 s on a loaded machine). The
  reply already holds it as a JSON string; that string, checked to be one, is spliced into
  the tokenize body as it came.

Pure: imports nothing from aiohttp (the child imports this module, and ujson).
"""

from __future__ import annotations

from typing import Any

from gateway.text import jsonutil

_PROMPT = b'{"prompt":'
_TOKENIZE_TAIL = b',"add_special":true,"parse_special":true}'
_TOKENS = b'{"tokens":['
_DIGITS = b"0123456789"
# what an object or array costs to encode, in bytes of string it weighs as (size_at_least)
_NODE_BYTES = 16


def encode(value: Any) -> bytes:
    """``jsonutil.dumpb(value)``, a function the decoder child can run."""
    return jsonutil.dumpb(value)


def encoded_size(*values: Any) -> int:
    """The bytes of JSON the values encode to, together (an estimate's measure)."""
    return sum(len(jsonutil.dumpb(v)) for v in values)


def size_at_least(value: Any, limit: int) -> bool:
    """Whether ``value`` weighs more than ``limit`` bytes to encode: its strings' lengths and
    :data:`_NODE_BYTES` per value; the walk stops once past (at most ``limit / 16`` values
    looked at, however large the value)."""
    total = 0
    stack = [value]
    while stack:
        v = stack.pop()
        total += _NODE_BYTES
        if isinstance(v, str | bytes):
            total += len(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
            total += _NODE_BYTES * len(v)  # the keys
        elif isinstance(v, list | tuple):
            stack.extend(v)
        if total > limit:
            return True
    return False


def llamacpp_tokenize_body(template_reply: bytes) -> bytes | None:
    """The ``/tokenize`` body for the prompt of an ``/apply-template`` reply, or None when
    the reply is not ``{"prompt": str}``. The compact reply's string is used as it came
    (decoded only to check it is one JSON string: then the reply is exactly that object);
    another spelling of the reply is decoded and the prompt encoded."""
    text = template_reply.strip()
    if text.startswith(_PROMPT) and text.endswith(b"}"):
        token = text[len(_PROMPT) : -1]
        try:
            prompt = jsonutil.loads_upstream(token)
        except ValueError:
            prompt = None
        if isinstance(prompt, str):
            return b'{"content":' + token.strip() + _TOKENIZE_TAIL
    try:
        reply = jsonutil.loads_upstream(template_reply)
    except ValueError:
        return None
    prompt = reply.get("prompt") if isinstance(reply, dict) else None
    if not isinstance(prompt, str):
        return None
    return jsonutil.dumpb({"content": prompt, "add_special": True, "parse_special": True})


def token_count(reply: bytes, key: str) -> int | None:
    """The count in a tokenize reply: ``reply[key]`` if an integer, its length if a list
    (llama.cpp's tokens); None when the reply has neither. llama.cpp's compact reply is
    counted without a decode (a list of 7.8 million ids: 1 s to build, 40 ms to check)."""
    if key == "tokens":
        ids = _compact_ids(reply)
        if ids is not None:
            return ids.count(b",") + 1 if ids else 0
    try:
        value = jsonutil.loads_upstream(reply)
    except ValueError:
        return None
    got = value.get(key) if isinstance(value, dict) else None
    if isinstance(got, list):
        return len(got)
    if isinstance(got, int) and not isinstance(got, bool):
        return got
    return None


def _compact_ids(reply: bytes) -> bytes | None:
    """The ``1,2,3`` of a ``{"tokens":[1,2,3]}`` reply: digits and single commas only;
    None for any other reply."""
    text = reply.strip()
    if not (text.startswith(_TOKENS) and text.endswith(b"]}")):
        return None
    ids = text[len(_TOKENS) : -2]
    if ids.translate(None, _DIGITS + b",") or b",," in ids:
        return None
    if ids and (ids[:1] == b"," or ids[-1:] == b","):
        return None
    return ids
