"""Generate a tiny llama-architecture GGUF whose every reply is a known text.

No weights can be downloaded here, so the demo and the test suite make their own model. It is a
real llama (one layer: attention + SwiGLU with random weights) that llama.cpp loads and runs, but
the layer's contributions to the residual stream are scaled almost to nothing and the output head
is wired so that the next token depends only on the current one:

* each token of the canned reply owns one embedding dimension ("state"); every other token shares
  state 0;
* the output head gives the successor of each state a logit of about 80 (RMS norm turns a one-hot
  over 64 dims into 8, times a weight of 10), and every other token about 0.

So sampling is deterministic at any usual temperature / top-p / seed, and:

* a prompt ending in ``<think>`` (the template's default generation prompt) continues with
  ``REASONING</think>`` ``\\n\\n`` ``ANSWER<|im_end|>``;
* a prompt ending in ``</think>`` (``enable_thinking: false``) continues with
  ``\\n\\nANSWER<|im_end|>``;
* a prompt ending in anything else continues with ``ANSWER<|im_end|>``;
* a request offering tools, with no tool result since the last assistant turn, is answered with
  one tool call in Hermes/Qwen's text format, copied by the one attention head from a line the
  chat template writes in copy tokens (``toolcall``); without copy tokens in the prompt that
  head adds exactly nothing.

The tokenizer is llama.cpp's byte-level BPE ("gpt2", GPT-2's pre-tokenizer): the 256 byte
tokens, ChatML specials, ``<think>``/``</think>``, one token per piece of the canned texts (two
words or more each) and the 16,000 merges of ``bpe.py`` with the tokens they build. English and
JSON take about 3.5 bytes a token, so Claude Code's 78 KB full-mode request is about 23k tokens.
A piece of words holds a space before a word, where the pre-tokenizer always cuts, so no merge
can build it, and none may build ``\\n\\n`` (``reserved_spellings``): prompts never contain the
reply's tokens, the model only ever *emits* them. ``<|im_end|>`` is the end-of-generation token
and counts as a completion token in llama.cpp's usage.

The prompt is what costs: attention grows with its square. So the model has one layer with one
attention head of 8 dimensions (n_embd stays 64, one dimension per chain state), and its
training context is 131,072 tokens, the demo's slot size.

The chat template is ChatML with Qwen3-style thinking (``<think>`` opened by the generation prompt,
``<think></think>`` when ``enable_thinking`` is false or a tool call is due); llama.cpp's jinja
mode recognises the open ``<think>`` and splits the reply into ``reasoning_content`` and
``content``. It leaves an assistant turn's earlier tool calls out of the prompt: llama.cpp learns
a tool-call syntax from how a template writes them and then parses replies itself, and the demo
means to show the gateway's own text tool-call parser (the path of an engine without one).

gguf and numpy (the optional ``demo`` extra) are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.demo import bpe, toolcall

# Bump whenever the bytes written change, so cached copies are rebuilt.
GENERATOR_VERSION = 4
MODEL_NAME = "llm-gateway-tiny-demo"

REASONING_TEXT = "The user sent a message, so I will reply with the one sentence that I know."
ANSWER_TEXT = (
    "Hello! I am the tiny demo model of llm-gateway, and every reply you get from me "
    "is exactly this sentence."
)

_SEED = 7
# Attention is the only cost that grows with the prompt (quadratically), so it is made as small
# as llama.cpp allows: one layer, one head of 8 dimensions. n_embd only has to exceed the number
# of chain states.
_N_LAYER = 1
_N_EMBD = 64
_N_HEAD = 1
_HEAD_DIM = 8
_N_FF = 32
_N_CTX_TRAIN = 131072
_LOGIT_WEIGHT = 10.0
_RESIDUAL_SCALE = 0.001  # the feed-forward runs, but barely moves the residual stream
# the copy head's dimensions (toolcall): a flag, then a 7-bit code
_COPY_FLAG = _N_EMBD - 1 - toolcall.CODE_BITS
_COPY_CODE = range(_COPY_FLAG + 1, _N_EMBD)

# gguf token type numbers (gguf.TokenType), kept here so expectations need no gguf import.
_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4

_BOS = "<|endoftext|>"
_IM_START = "<|im_start|>"
_IM_END = "<|im_end|>"
_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"
_SPECIALS = (
    (_BOS, _CONTROL),
    (_IM_START, _CONTROL),
    (_IM_END, _CONTROL),
    # user-defined, not control: llama.cpp must print them so its reasoning parser sees them
    (_THINK_OPEN, _USER_DEFINED),
    (_THINK_CLOSE, _USER_DEFINED),
)
_PARAGRAPH = "\n\n"
# what the template writes after the copy tokens: toolcall.attention_weights needs its length
_CALL_TAIL = "<|im_end|>\n<|im_start|>assistant\n<think></think>"

CHAT_TEMPLATE = (
    toolcall.TEMPLATE_MACRO
    + """\
{%- macro text_of(content) -%}
{%- if content is string -%}{{- content -}}
{%- elif content -%}{%- for part in content -%}
{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}
{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- set tools_first = tools is defined and tools -%}
{%- set turn = namespace(asked=false, answered=false) -%}
{%- for message in messages -%}
{%- if message['role'] == 'assistant' -%}
{%- set turn.asked = false -%}{%- set turn.answered = false -%}
{%- elif message['role'] == 'tool' -%}{%- set turn.answered = true -%}
{%- elif message['role'] == 'user' -%}{%- set turn.asked = true -%}{%- endif -%}
{%- endfor -%}
{%- set calling = tools_first and add_generation_prompt and turn.asked and not turn.answered \
and messages[-1]['role'] in ['user', 'system'] -%}
{%- if tools_first -%}
{{- '<|im_start|>system\\n' -}}
{%- if messages and messages[0]['role'] == 'system' -%}
{{- text_of(messages[0]['content']) + '\\n\\n' -}}
{%- endif -%}
{{- 'You may call these tools:\\n<tools>' -}}
{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\\n</tools><|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if not (tools_first and loop.first and message['role'] == 'system') -%}
{{- '<|im_start|>' + message['role'] + '\\n' -}}
{%- if message['role'] == 'assistant' -%}
{%- if message['reasoning_content'] is defined and message['reasoning_content'] -%}
{{- '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' -}}
{%- endif -%}
{{- text_of(message['content']) -}}
{%- elif message['role'] == 'tool' -%}
{{- '<tool_response>\\n' + text_of(message['content']) + '\\n</tool_response>' -}}
{%- else -%}
{{- text_of(message['content']) -}}
{%- if calling and loop.last -%}{{- demo_call(tools, text_of(message['content'])) -}}{%- endif -%}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if calling or (enable_thinking is defined and enable_thinking is false) -%}
{{- '<think></think>' -}}
{%- else -%}
{{- '<think>' -}}
{%- endif -%}
{%- endif -%}
"""
)


@dataclass(frozen=True)
class _Plan:
    """Everything about the model except the float weights (no numpy, no gguf needed)."""

    tokens: list[str]
    types: list[int]
    ids: dict[str, int]
    reasoning: list[str]
    answer: list[str]
    edges: list[tuple[int, int]]  # (token, its only successor)
    default_next: int  # successor of every token outside the chain
    merges: list[tuple[str, str]]  # the BPE merges kept, best first
    copies: dict[int, int]  # copy token -> the token it makes the model emit (toolcall)


_ALPHABET = bpe.ALPHABET
_spell = bpe.spell


def _word_pieces(text: str, taken: set[str]) -> list[str]:
    """Cut text into whitespace-led words, each distinct from every piece in `taken`.

    A token must have exactly one successor, so a word seen before is joined to the next one until
    the result is new; a one-byte piece would be a byte token, so it is joined too.
    """
    words = re.findall(r"\s*\S+", text)
    pieces: list[str] = []
    while words:
        piece = words.pop(0)
        while (piece in taken or len(piece.encode()) == 1) and words:
            piece += words.pop(0)
        if piece in taken or len(piece.encode()) == 1:
            if not pieces:
                raise ValueError(f"no unique piece can be made of {text!r}")
            taken.discard(pieces[-1])
            piece = pieces.pop() + piece
        taken.add(piece)
        pieces.append(piece)
    return pieces


def _pairs(pieces: list[str]) -> list[str]:
    """Join word-pieces two by two (an odd last one joins the last pair).

    A piece of two words holds a space before a word, which the GPT-2 pre-tokenizer always cuts
    at, so no BPE merge can ever build it: the reply's tokens stay out of every prompt, and the
    merges need not avoid common words such as " the".
    """
    if len(pieces) < 2:
        raise ValueError(f"a reply needs two words at least, got {pieces!r}")
    pairs = [a + b for a, b in zip(pieces[::2], pieces[1::2], strict=False)]
    if len(pieces) % 2:
        pairs[-1] += pieces[-1]
    return pairs


def _pieces() -> tuple[list[str], list[str]]:
    taken = {_PARAGRAPH}
    reasoning = _pairs(_word_pieces(REASONING_TEXT, taken))
    answer = _pairs(_word_pieces(ANSWER_TEXT, taken))
    everything = [_PARAGRAPH, *reasoning, *answer]
    if len(set(everything)) != len(everything):
        raise ValueError("the reply's pieces are not unique")
    return reasoning, answer


def reserved_spellings() -> frozenset[str]:
    """The vocabulary entries no BPE merge may build: special tokens and the reply's pieces."""
    reasoning, answer = _pieces()
    specials = {text for text, _ in _SPECIALS}
    return frozenset(
        {
            *specials,
            *toolcall.copy_tokens(),
            *(_spell(p) for p in (_PARAGRAPH, *reasoning, *answer)),
        }
    )


@functools.lru_cache(maxsize=1)
def _merges() -> tuple[tuple[str, str], ...]:
    """The shipped merges, less any that builds a reserved entry or needs a dropped one."""
    reserved = reserved_spellings()
    built = set(_ALPHABET.values())
    kept = []
    for left, right in bpe.load_merges():
        if left in built and right in built and bpe.allowed(left, right, reserved):
            kept.append((left, right))
            built.add(left + right)
    return tuple(kept)


def _plan() -> _Plan:
    tokens = [_ALPHABET[b] for b in range(256)]
    types = [_NORMAL] * 256
    ids: dict[str, int] = {}
    for text, kind in _SPECIALS:
        ids[text] = len(tokens)
        tokens.append(text)
        types.append(kind)
    reasoning, answer = _pieces()
    for piece in [_PARAGRAPH, *reasoning, *answer]:
        ids[piece] = len(tokens)
        tokens.append(_spell(piece))
        types.append(_NORMAL)
    merges = list(_merges())
    known = set(tokens)
    for left, right in merges:
        if left + right not in known:
            known.add(left + right)
            tokens.append(left + right)
            types.append(_NORMAL)
    copies = {}
    for text in toolcall.copy_tokens():  # last, so that no other token's id moves
        ids[text] = len(tokens)
        tokens.append(text)
        types.append(_CONTROL)
        char = text[2:-2]
        copies[ids[text]] = ids[_IM_END] if text == toolcall.STOP else ord(char)
    chain = [
        ids[_THINK_OPEN],
        *(ids[p] for p in reasoning),
        ids[_THINK_CLOSE],
        ids[_PARAGRAPH],
        *(ids[p] for p in answer),
        ids[_IM_END],
    ]
    edges = list(itertools.pairwise(chain))
    return _Plan(tokens, types, ids, reasoning, answer, edges, ids[answer[0]], merges, copies)


def count_tokens(prompt: str) -> int:
    """How many tokens llama.cpp makes of ``prompt`` (special tokens written out are parsed)."""
    ranks = {pair: rank for rank, pair in enumerate(_merges())}
    specials = {*(text for text, _ in _SPECIALS), *toolcall.copy_tokens()}
    count = 0
    alternatives = sorted(specials, key=len, reverse=True)
    for part in re.split("(" + "|".join(map(re.escape, alternatives)) + ")", prompt):
        if part in specials:
            count += 1
        elif part:
            count += len(bpe.encode(part, ranks))
    return count


def expectations() -> dict[str, Any]:
    """What the model answers, computed without building it (stable for a GENERATOR_VERSION)."""
    plan = _plan()
    n_reason, n_answer = len(plan.reasoning), len(plan.answer)
    return {
        "generator_version": GENERATOR_VERSION,
        "model_name": MODEL_NAME,
        "n_vocab": len(plan.tokens),
        "n_ctx_train": _N_CTX_TRAIN,
        "reasoning": "".join(plan.reasoning),
        "answer": "".join(plan.answer),
        "reasoning_pieces": list(plan.reasoning),
        "answer_pieces": list(plan.answer),
        # completion_tokens of a whole reply; the closing <|im_end|> is counted by llama.cpp
        "completion_tokens_thinking": n_reason + 1 + 1 + n_answer + 1,  # + </think> + \n\n
        "completion_tokens_nothink": 1 + n_answer + 1,  # \n\n + answer
        "completion_tokens_plain": n_answer + 1,
        "eos_token": _IM_END,
    }


def copy_distance() -> int:
    """How many positions back from the last prompt token the first copy token is: the slots
    and the template's fixed tail after them (see toolcall)."""
    return toolcall.N_SLOTS + count_tokens(_CALL_TAIL) - 1


def _weights(plan: _Plan) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(_SEED)
    n_vocab = len(plan.tokens)
    state: dict[int, int] = {}
    for token, _ in plan.edges:
        state.setdefault(token, len(state) + 1)
    if len(state) >= _COPY_FLAG:
        raise ValueError(f"{len(state)} chain states need more than {_COPY_FLAG} dimensions")

    embed = rng.normal(0.0, 0.01, (n_vocab, _N_EMBD))
    embed[np.arange(n_vocab), [state.get(t, 0) for t in range(n_vocab)]] += 1.0
    # the copy head reads only these dimensions: exactly zero unless a copy token's
    embed[:, _COPY_FLAG:] = 0.0
    head = np.zeros((n_vocab, _N_EMBD))
    for token, successor in plan.edges:
        head[successor, state[token]] = _LOGIT_WEIGHT
    head[plan.default_next, 0] = _LOGIT_WEIGHT
    for token, emitted in plan.copies.items():
        bits = toolcall.code_bits(toolcall.code(plan.tokens[token]))
        embed[token] = 0.0
        embed[token, _COPY_FLAG] = 1.0
        embed[token, _COPY_CODE] = bits
        head[emitted, _COPY_CODE] = np.asarray(bits) * _LOGIT_WEIGHT
    copy_head = toolcall.attention_weights(
        _N_EMBD, _HEAD_DIM, range(len(state) + 1), _COPY_FLAG, _COPY_CODE, copy_distance()
    )

    def rand(rows: int, cols: int, scale: float = 1.0) -> Any:
        return (rng.normal(0.0, 1.0 / np.sqrt(cols), (rows, cols)) * scale).astype(np.float32)

    ones = np.ones(_N_EMBD, dtype=np.float32)
    out: dict[str, Any] = {  # the two vocabulary-sized tables in f16: half the file
        "token_embd.weight": embed.astype(np.float16),
        "output_norm.weight": ones,
        "output.weight": head.astype(np.float16),
    }
    for layer in range(_N_LAYER):
        blk = f"blk.{layer}."
        out[blk + "attn_norm.weight"] = ones
        for name, array in copy_head.items():
            out[blk + name + ".weight"] = array
        out[blk + "ffn_norm.weight"] = ones
        out[blk + "ffn_gate.weight"] = rand(_N_FF, _N_EMBD)
        out[blk + "ffn_up.weight"] = rand(_N_FF, _N_EMBD)
        out[blk + "ffn_down.weight"] = rand(_N_EMBD, _N_FF, _RESIDUAL_SCALE)
    return out


def build_tiny_model(path: str) -> dict[str, Any]:
    """Write the model to `path` (same bytes every time) and return its expectations."""
    import gguf

    plan = _plan()
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(MODEL_NAME)
    writer.add_context_length(_N_CTX_TRAIN)
    writer.add_embedding_length(_N_EMBD)
    writer.add_block_count(_N_LAYER)
    writer.add_feed_forward_length(_N_FF)
    writer.add_head_count(_N_HEAD)
    writer.add_head_count_kv(_N_HEAD)
    writer.add_key_length(_HEAD_DIM)
    writer.add_value_length(_HEAD_DIM)
    writer.add_rope_dimension_count(_HEAD_DIM)
    writer.add_rope_freq_base(toolcall.ROPE_BASE)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(len(plan.tokens))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(plan.tokens)
    writer.add_token_types(plan.types)
    writer.add_token_merges([f"{left} {right}" for left, right in plan.merges])
    writer.add_bos_token_id(plan.ids[_BOS])
    writer.add_eos_token_id(plan.ids[_IM_END])
    writer.add_pad_token_id(plan.ids[_BOS])
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, array in _weights(plan).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expectations()


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "llm-gateway")


def ensure_model(cache_dir: str | None = None) -> tuple[str, dict[str, Any]]:
    """Return (path, expectations) of the model, building it once into `cache_dir`.

    The file name carries GENERATOR_VERSION, so a changed generator never serves a stale file;
    the file is written under a temporary name and renamed, so a concurrent or interrupted build
    never leaves a half-written model under the real name.
    """
    folder = Path(cache_dir or default_cache_dir())
    target = folder / f"tiny-demo-v{GENERATOR_VERSION}.gguf"
    if target.is_file():
        return str(target), expectations()
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tiny-demo-", suffix=".part", dir=folder)
    os.close(fd)
    try:
        expect = build_tiny_model(tmp)
        os.chmod(tmp, 0o644)  # mkstemp made it private
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return str(target), expect
