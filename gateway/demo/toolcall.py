"""The tiny demo model's one tool call: a line the chat template writes, which the model copies.

The chain of ``tinymodel`` cannot name a tool it has never seen, so when tools are offered the
chat template works out the call itself and writes it into the prompt, one *copy token* a
character, and one attention head copies it back out:

* the template (:data:`TEMPLATE_MACRO`, Jinja rendered by llama.cpp) picks the call: a tool named
  ``Bash`` with ``{"command": "echo demo-tool-loop", ...}``, else the first tool with its
  required parameters filled (``"demo"``, ``1``, ``true``, ``[]``, ``{}`` by JSON type; a
  required ``url`` string gets the first ``http(s)://`` URL of the last user message, if it
  holds a short plain one: :func:`first_url`, so ``web_fetch`` reads a page). It writes
  ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` as :data:`N_SLOTS` tokens,
  ``<|c|>`` for each character ``c`` (one special token per printable ASCII character and the
  newline) and then :data:`STOP` up to the end, at the end of the last user turn;
* every copy token's embedding holds a flag dimension and its character's 7-bit code (``ord``,
  ``0`` for :data:`STOP`) as +-1 in seven more dimensions; every other token is exactly zero
  there, so its key and value are zero and without copy tokens in the prompt the head adds
  exactly nothing: replies to requests without tools keep every byte;
* the head's query is the same for every token, its key the same for every copy token, and
  RoPE (llama's adjacent-pair rotation, base :data:`ROPE_BASE`, four frequencies) turns their
  product into ``sum(cos(theta_i * (distance - D)))``: the largest score, by a margin of
  :data:`SCORE_MARGIN` or more over every other copy token within reach, is the copy token
  exactly ``D`` positions back. ``D`` is the distance from the last prompt token to the first
  copy token (the slots plus the fixed tail after them), so generated token ``i`` is a copy of
  character ``i``;
* the head writes the code, scaled far above the token's own embedding, into the residual
  stream; the output head gives the byte token of each character (``<|im_end|>`` for code 0) the
  dot product of its code with it, so the copied character wins by a wide margin over the chain
  and every other code, and the first :data:`STOP` ends the reply.

The reply is then the call, in Hermes/Qwen's text format; llama.cpp passes it on as content and
the gateway's text tool-call parser (``gateway/local/text_tools.py``) makes it a ``tool_use``
block. A request whose messages since the last assistant turn hold a tool result gets no call
line, so the chain answers in text and the loop ends.

Pure Python except :func:`attention_weights` (numpy, imported by the caller's build).
"""

from __future__ import annotations

import json
import math
from typing import Any

N_SLOTS = 256  # copy tokens the template writes: the call and STOP after it
STOP = "<|copy-stop|>"
COPY_CHARS = "\n" + "".join(chr(c) for c in range(0x20, 0x7F))
CODE_BITS = 7
ROPE_BASE = 11.0  # the base whose four frequencies separate distances 1..N_SLOTS best
SCORE_MARGIN = 25.0  # the copied slot's attention score over any other copy token's, at least
BASH_COMMAND = "echo demo-tool-loop"
BASH_ARGUMENTS = {"command": BASH_COMMAND, "description": "Show the tool loop of the demo"}
_PEAK = 4 * SCORE_MARGIN / 0.6  # the score at the copied slot; the worst rival is 0.66/4 lower


def copy_token(char: str) -> str:
    return f"<|{char}|>"


def copy_tokens() -> list[str]:
    """The copy tokens in vocabulary order: one per character of :data:`COPY_CHARS`, then STOP."""
    return [copy_token(c) for c in COPY_CHARS] + [STOP]


def code(token_text: str) -> int:
    """The 7-bit code of a copy token: its character's ``ord``; 0 for STOP."""
    return 0 if token_text == STOP else ord(token_text[2:-2])


URL_SCAN = 4000  # characters of the last user message searched for a URL
MAX_URL = 160  # a longer URL is not copied (the call must fit in N_SLOTS)
URL_TRAILING = ".,;:!?"  # dropped from a URL's end (up to three): the sentence's, not the URL's
# the characters a copied URL may hold: RFC 3986's, less the quote and the backslash (so the
# call's JSON needs no escape and every character has a copy token)
URL_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~:/?#[]@!$&()*+,;=%"


def first_url(text: str) -> str | None:
    """The URL the template copies into a ``url`` argument: the first ``http(s)://`` word of
    the first :data:`URL_SCAN` characters of ``text`` (up to three of :data:`URL_TRAILING`
    dropped from its end), if it is at most :data:`MAX_URL` characters of :data:`URL_CHARS`.
    Mirrors the macro's ``demo_url``."""
    for word in text[:URL_SCAN].replace("\n", " ").replace("\t", " ").split(" "):
        if not word.startswith(("http://", "https://")):
            continue
        for _ in range(3):
            if word[-1] in URL_TRAILING:
                word = word[:-1]
        if 8 < len(word) <= MAX_URL and set(word) <= set(URL_CHARS):
            return word
    return None


# The call is chosen and written here. `ns.fresh`: no tool result since the last assistant turn.
TEMPLATE_MACRO = (
    """\
{%- macro demo_url(text) -%}
{%- set found = namespace(url='') -%}
{%- for word in text[:"""
    + str(URL_SCAN)
    + """].replace('\\n', ' ').replace('\\t', ' ').split(' ') -%}
{%- if not found.url and (word.startswith('http://') or word.startswith('https://')) -%}
{%- set w = namespace(url=word, ok=true) -%}
{%- for _ in range(3) -%}
{%- if w.url[w.url | length - 1] in '"""
    + URL_TRAILING
    + """' -%}{%- set w.url = w.url[:w.url | length - 1] -%}{%- endif -%}
{%- endfor -%}
{%- for i in range(w.url | length) -%}
{%- if w.url[i] not in '"""
    + URL_CHARS
    + """' -%}{%- set w.ok = false -%}{%- endif -%}
{%- endfor -%}
{%- if w.ok and w.url | length <= """
    + str(MAX_URL)
    + """ and w.url | length > 8 -%}{%- set found.url = w.url -%}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{{- found.url -}}
{%- endmacro -%}
{%- macro demo_call(tools, text) -%}
{%- set ns = namespace(name='', args='') -%}
{%- for tool in tools -%}
{%- if not ns.name and tool['function']['name'] == 'Bash' -%}
{%- set ns.name = 'Bash' -%}
{%- set ns.args = '"""
    + json.dumps(BASH_ARGUMENTS)
    + """' -%}
{%- endif -%}
{%- endfor -%}
{%- if not ns.name -%}
{%- set fn = tools[0]['function'] -%}
{%- set ns.name = fn['name'] -%}
{%- set params = fn['parameters'] if fn['parameters'] is defined and fn['parameters'] else {} -%}
{%- set props = params['properties'] if params['properties'] is defined else {} -%}
{%- for key in (params['required'] if params['required'] is defined else []) -%}
{%- set kind = props[key]['type'] if key in props and props[key]['type'] is defined else '' -%}
{%- set value = {'string': '"demo"', 'integer': '1', 'number': '1', 'boolean': 'true', \
'array': '[]', 'object': '{}'}[kind] if kind in ['string', 'integer', 'number', 'boolean', \
'array', 'object'] else 'null' -%}
{%- set url = demo_url(text) if key == 'url' and kind == 'string' else '' -%}
{%- set value = (url | tojson) if url else value -%}
{%- set ns.args = ns.args + (', ' if ns.args else '') + (key | tojson) + ': ' + value -%}
{%- endfor -%}
{%- set ns.args = '{' + ns.args + '}' -%}
{%- endif -%}
{%- set call = '<tool_call>\\n{"name": ' + (ns.name | tojson) + ', "arguments": ' + ns.args \
+ '}\\n</tool_call>' -%}
{%- if call | length < """
    + str(N_SLOTS)
    + """ -%}
{%- for i in range(call | length) -%}{{- '<|' + call[i] + '|>' -}}{%- endfor -%}
{%- for _ in range("""
    + str(N_SLOTS)
    + """ - call | length) -%}{{- '"""
    + STOP
    + """' -}}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
"""
)


def demo_call(tools: list[dict[str, Any]], text: str = "") -> tuple[str, dict[str, Any]] | None:
    """(name, arguments) of the call the template writes for these OpenAI-style tools and the
    last user message's ``text``; None when it writes none (no tools, or a call too long for
    the slots). Mirrors the macro."""
    if not tools:
        return None
    names = [tool["function"]["name"] for tool in tools]
    args: dict[str, Any]
    if "Bash" in names:
        name, args = "Bash", dict(BASH_ARGUMENTS)
    else:
        fn = tools[0]["function"]
        name = fn["name"]
        params = fn.get("parameters") or {}
        props = params.get("properties", {})
        fill: dict[str, Any] = {
            "string": "demo",
            "integer": 1,
            "number": 1,
            "boolean": True,
            "array": [],
            "object": {},
        }
        args = {}
        for key in params.get("required", []):
            kind = (props.get(key) or {}).get("type", "")
            url = first_url(text) if key == "url" and kind == "string" else None
            args[key] = url or fill.get(kind)
    if len(call_text(name, args)) >= N_SLOTS:
        return None
    return name, args


def call_text(name: str, args: dict[str, Any]) -> str:
    return (
        f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {json.dumps(args)}}}\n'
        "</tool_call>"
    )


def _rope_thetas() -> list[float]:
    return [ROPE_BASE ** (-i / 4) for i in range(4)]


def score_curve(distance_from_target: int) -> float:
    """The head's score for a copy token this many positions off the one to copy, before
    llama.cpp's 1/sqrt(head_dim) scale."""
    return (
        _PEAK
        / 4
        * math.sqrt(8)
        * sum(math.cos(theta * distance_from_target) for theta in _rope_thetas())
    )


def attention_weights(
    n_embd: int,
    head_dim: int,
    state_dims: range,
    flag_dim: int,
    code_dims: range,
    distance: int,
) -> dict[str, Any]:
    """Q, K, V and output projections of the copy head (numpy arrays, float32).

    ``state_dims``: the dimensions that hold a non-copy token's one-hot (after RMS norm about
    ``sqrt(n_embd)``); ``flag_dim``, ``code_dims``: a copy token's (each 1 or +-1 before the
    norm); ``distance``: how many positions back the copied token is from the query.
    """
    import numpy as np

    if head_dim != 8 or len(code_dims) != CODE_BITS:
        raise ValueError("the copy head wants head_dim 8 and 7 code dimensions")
    thetas = _rope_thetas()
    # a copy token is 1 + 7 entries of magnitude 1: RMS sqrt(8 / n_embd)
    copy_norm = math.sqrt(n_embd / 8)
    one_hot_norm = math.sqrt(n_embd)
    # score = q . R(-distance * theta) k summed over the four pairs; q_i at angle
    # -distance * theta_i from k_i makes it peak at that distance.
    amplitude = math.sqrt(_PEAK / 4 * math.sqrt(head_dim))
    wq = np.zeros((head_dim, n_embd))
    wk = np.zeros((head_dim, n_embd))
    for i, theta in enumerate(thetas):
        angle = -distance * theta
        for d in state_dims:
            wq[2 * i, d] = amplitude * math.cos(angle) / one_hot_norm
            wq[2 * i + 1, d] = amplitude * math.sin(angle) / one_hot_norm
        wk[2 * i, flag_dim] = amplitude / copy_norm
    wv = np.zeros((head_dim, n_embd))
    for bit, d in enumerate(code_dims):
        wv[bit, d] = 1.0 / copy_norm
    wo = np.zeros((n_embd, head_dim))
    for bit, d in enumerate(code_dims):
        wo[d, bit] = 1000.0  # far above a token's own embedding (magnitude 1)
    return {
        name: array.astype(np.float32)
        for name, array in (("attn_q", wq), ("attn_k", wk), ("attn_v", wv), ("attn_output", wo))
    }


def code_bits(value: int) -> list[float]:
    """+-1 per bit of a 7-bit code, least significant first."""
    return [1.0 if value >> bit & 1 else -1.0 for bit in range(CODE_BITS)]
