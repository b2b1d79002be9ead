"""Each engine's real context window, read from what the engine says of itself: pure, no I/O.

Where each engine states it (read in their servers' sources, and from llama-server itself):

* vLLM: ``GET /v1/models`` lists ``ModelCard``s, each with ``max_model_len`` (the
  ``--max-model-len`` in force; LoRA modules carry the base model's).
* SGLang: ``GET /v1/models`` answers the same shape; the served model's card has
  ``max_model_len`` (``model_config.context_len``), a LoRA adapter's card ``null`` and a
  ``parent``. SGLang takes any ``model`` in a request, so an id that matches no card falls back
  to the one window every card that states one agrees on. (``/get_model_info`` holds no
  length.)
* llama.cpp: ``GET /props`` (beside ``/v1``) has ``default_generation_settings.n_ctx``: one
  slot's context, the whole context divided by ``--parallel`` unless the KV cache is unified.
  That is what one request may use (llama-server started with 2048 and two slots says 1024:
  tests/golden/engine_windows/llamacpp_props.json). Some builds also put ``n_ctx`` at the top.
* Ollama: ``POST /api/show`` with ``{"model": name}`` answers ``parameters`` (the Modelfile's
  options, one ``name value`` a line, the name padded to 30 columns) and ``model_info``
  (``<general.architecture>.context_length``: what the model was trained for). A ``num_ctx`` in
  the parameters is the window the model runs with and wins; without it the trained length is
  taken (the server's own default, ``OLLAMA_CONTEXT_LENGTH``, is not visible over the API).

Every value is checked: an integer (JSON's, not a string, not a boolean) within
``1..MAX_WINDOW``; anything else is "unknown" (None) and the route keeps what it had.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.text import jsonutil

# 16 Mi tokens: above any window served today (10 M is the largest published); a larger figure
# is a broken or hostile answer, not a window
MAX_WINDOW = 1 << 24
# the largest engine answer read (an Ollama /api/show carries the license and the template)
MAX_REPLY_BYTES = 1 << 20
# the kinds whose window is read (a generic ``openai`` server states none: not asked)
KINDS = ("vllm", "sglang", "llamacpp", "ollama")


@dataclass(frozen=True)
class Ask:
    """One request that tells an engine's window: method, target (from the engine's root,
    ``root`` True, or its ``/v1`` base) and body."""

    method: str
    path: str
    root: bool
    body: bytes | None = None


def ask(kind: str, upstream_model: str) -> Ask | None:
    """The request that reads ``upstream_model``'s window from an engine of ``kind``; None:
    this kind states none."""
    if kind in ("vllm", "sglang"):
        return Ask("GET", "/models", root=False)
    if kind == "llamacpp":
        return Ask("GET", "/props", root=True)
    if kind == "ollama":
        body = jsonutil.dumpb({"model": upstream_model, "name": upstream_model})
        return Ask("POST", "/api/show", root=True, body=body)
    return None


def window(value: Any) -> int | None:
    """``value`` as a window: a JSON integer in 1..MAX_WINDOW, else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 1 <= value <= MAX_WINDOW else None


def parse(kind: str, upstream_model: str, body: bytes) -> int | None:
    """The window an engine of ``kind`` states for ``upstream_model`` in ``body`` (its reply to
    :func:`ask`); None: not stated, or not a sane figure."""
    if len(body) > MAX_REPLY_BYTES:
        return None
    try:
        doc = jsonutil.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    if kind in ("vllm", "sglang"):
        return from_model_list(doc, upstream_model)
    if kind == "llamacpp":
        return from_props(doc)
    if kind == "ollama":
        return from_show(doc)
    return None


def from_model_list(doc: Mapping[str, Any], model: str) -> int | None:
    """vLLM's and SGLang's ``/v1/models``: the card whose ``id`` is ``model``; failing that
    (SGLang serves any name) the one window all cards stating one agree on."""
    cards = doc.get("data")
    if not isinstance(cards, list):
        return None
    cards = [c for c in cards if isinstance(c, dict)]
    by_id = {c.get("id"): c for c in cards if isinstance(c.get("id"), str)}
    card = by_id.get(model)
    if card is not None:
        own = window(card.get("max_model_len"))
        if own is not None:
            return own
        parent = by_id.get(card.get("parent"))  # an SGLang LoRA adapter: its base's
        if parent is not None:
            return window(parent.get("max_model_len"))
        return None
    stated = {window(c.get("max_model_len")) for c in cards} - {None}
    return stated.pop() if len(stated) == 1 else None


def from_props(doc: Mapping[str, Any]) -> int | None:
    """llama.cpp's ``/props``: one slot's ``n_ctx``."""
    settings = doc.get("default_generation_settings")
    if isinstance(settings, dict):
        found = window(settings.get("n_ctx"))
        if found is not None:
            return found
    return window(doc.get("n_ctx"))


def from_show(doc: Mapping[str, Any]) -> int | None:
    """Ollama's ``/api/show``: ``num_ctx`` from the parameters, else the trained length."""
    params = doc.get("parameters")
    if isinstance(params, str):
        for line in params.splitlines()[:256]:
            name, _, value = line.strip().partition(" ")
            if name == "num_ctx":
                text = value.strip()
                if text.isascii() and text.isdigit() and len(text) <= 9:
                    return window(int(text))
                return None
    info = doc.get("model_info")
    if not isinstance(info, dict):
        return None
    arch = info.get("general.architecture")
    if isinstance(arch, str) and len(arch) <= 64:
        found = window(info.get(f"{arch}.context_length"))
        if found is not None:
            return found
    stated = {window(v) for k, v in info.items() if str(k).endswith(".context_length")} - {None}
    return stated.pop() if len(stated) == 1 else None
