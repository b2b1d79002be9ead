"""Upstream refusals that name their cause: THE table of the wordings the engines really use.

An engine that cannot take something in a request says so in its error reply, often with a
5xx status (llama.cpp throws ``std::runtime_error`` for an image without a projector, which
its server answers as ``500 server_error``). Such a refusal is the request's fault, not a
passing failure: retried as a 5xx it fails forever. :func:`refusal` reads the cause out of the
reply, so :func:`gateway.errors.from_upstream` answers it as a 4xx (or a 501) the client
should not retry, and the Messages call (:mod:`gateway.messages.call`) can send the request
again with that content rendered as text.

Wordings, checked against the servers (llama.cpp: ``tools/server/server-common.cpp``,
``oaicompat_chat_params_parse`` and ``format_error_response``, and answered so by the
xllamacpp build the tests run; vLLM: ``vllm/multimodal/parse.py``'s limit check; Ollama:
``model/model.go``'s ``ErrNoVisionModel``). README.md's "Upstream errors" table lists them;
``tests/unit/test_capabilities.py`` checks that table against :data:`REFUSALS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CAPABILITIES", "REFUSALS", "Refusal", "refusal"]

# What a route may be unable to take (``[[models]]`` knobs of the same names).
CAPABILITIES = ("images", "tool_references")


@dataclass(frozen=True, slots=True)
class Refusal:
    """One upstream wording: who sends it, with what status, and what it refuses."""

    engines: str  # as README.md names them
    status: str  # the HTTP status the engine answers with, as README.md writes it
    pattern: re.Pattern[str]
    # the capability refused (a value of CAPABILITIES), or "server" for a route the
    # engine's server does not offer (answered 501)
    refuses: str
    # what the client reads (before the scrubbed upstream wording)
    says: str


_IMAGES = "this model does not support images"
_PARTS = "this model's server does not support a content part type in the request"

REFUSALS: tuple[Refusal, ...] = (
    Refusal("llama.cpp (no --mmproj)", "500", re.compile(r"image input is not supported"),
            "images", _IMAGES),
    Refusal("llama.cpp", "400", re.compile(r"unsupported content\[\]\.type"),
            "tool_references", _PARTS),
    Refusal("vLLM (text-only model)", "400",
            re.compile(r"At most 0 image\(s\) may be provided in one (?:prompt|request)"),
            "images", _IMAGES),
    Refusal("vLLM", "400", re.compile(r"is not a multimodal model"), "images", _IMAGES),
    Refusal("Ollama (no vision)", "500 or 400",
            re.compile(r"missing data required for image input"), "images", _IMAGES),
    Refusal("llama.cpp (no --embeddings)", "501",
            re.compile(r"does not support embeddings"), "server",
            "not supported by this model's server"),
)


def refusal(status: int, message: str) -> Refusal | None:
    """The refusal an upstream error reply's message names, if any. Any 4xx or 5xx status
    is read: engines disagree on the status, the wording is what is stable."""
    if status < 400:
        return None
    for known in REFUSALS:
        if known.pattern.search(message):
            return known
    return None
