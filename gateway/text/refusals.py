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
``model/model.go``'s ``ErrNoVisionModel``). The "Upstream errors" table of
docs/local-engines.md lists them;
``tests/unit/local/test_capabilities.py`` checks that table against :data:`REFUSALS`.

A refusal is the engine's whole message, never a wording found somewhere in it: engines quote
the client's input in their errors (llama.cpp answers a JSON schema ``{"type": "<text>"}`` with
``400 "... JSON schema error at #: unrecognized type <text>"``), so a wording searched anywhere
would let any client make a request's error read as a refusal. Each :class:`Refusal`'s
``shape`` is matched against the whole message (``re.fullmatch``), and holds nothing the client
wrote (the only variable part, vLLM's model name, is the operator's). The shapes, as the
engines write them:

* llama.cpp: ``image input is not supported - hint: if this is unexpected, you may need to
  provide the mmproj`` (500; builds before the hint: the first clause alone) and
  ``unsupported content[].type`` (400), ``e.what()`` answered as is by ``format_error_response``;
* vLLM: ``At most 0 image(s) may be provided in one prompt.`` (older: ``request.``; since
  ``VLLMValidationError``: followed by `` (parameter=image)``), and ``<model> is not a multimodal
  model`` (``MultiModalRegistry.create_processor``, the served model name or path);
* Ollama: ``this model is missing data required for image input`` (``ErrNoVisionModel``);
* SGLang: no wording of its own is known; a refusal it forwards from the model's processor is
  not read as one.

:func:`echoed` says whether a request's own bytes hold a refusal's wording (in any case): a
reply to such a request may be the client's words, so the route learns nothing from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CAPABILITIES", "REFUSALS", "Refusal", "echoed", "refusal"]

# What a route may be unable to take (``[[models]]`` knobs of the same names).
CAPABILITIES = ("images", "tool_references")


@dataclass(frozen=True, slots=True)
class Refusal:
    """One upstream wording: who sends it, with what status, and what it refuses."""

    engines: str  # as docs/local-engines.md names them
    status: str  # the HTTP status the engine answers with, as docs/local-engines.md writes it
    # the wording (as docs/local-engines.md shows it); searched, in any case, in a
    # request's own bytes
    pattern: re.Pattern[str]
    # the capability refused (a value of CAPABILITIES), or "server" for a route the
    # engine's server does not offer (answered 501)
    refuses: str
    # what the client reads (before the scrubbed upstream wording)
    says: str
    # the engine's whole message (re.fullmatch)
    shape: re.Pattern[str]

    @property
    def echo(self) -> re.Pattern[bytes]:
        return _ECHOES[self.pattern.pattern]


_IMAGES = "this model does not support images"
_PARTS = "this model's server does not support a content part type in the request"

_LLAMA_MMPROJ = re.escape(" - hint: if this is unexpected, you may need to provide the mmproj")

REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        "llama.cpp (no --mmproj)",
        "500",
        re.compile(r"image input is not supported"),
        "images",
        _IMAGES,
        re.compile(rf"image input is not supported(?:{_LLAMA_MMPROJ})?"),
    ),
    Refusal(
        "llama.cpp",
        "400",
        re.compile(r"unsupported content\[\]\.type"),
        "tool_references",
        _PARTS,
        re.compile(r"unsupported content\[\]\.type"),
    ),
    Refusal(
        "vLLM (text-only model)",
        "400",
        re.compile(r"At most 0 image\(s\) may be provided in one (?:prompt|request)"),
        "images",
        _IMAGES,
        re.compile(
            r"At most 0 image\(s\) may be provided in one (?:prompt|request)\."
            r"(?: \(parameter=image\))?"
        ),
    ),
    # the name is the operator's (served name or model path): no spaces, bounded
    Refusal(
        "vLLM",
        "400",
        re.compile(r"is not a multimodal model"),
        "images",
        _IMAGES,
        re.compile(r"\S{1,512} is not a multimodal model"),
    ),
    Refusal(
        "Ollama (no vision)",
        "500 or 400",
        re.compile(r"missing data required for image input"),
        "images",
        _IMAGES,
        re.compile(r"this model is missing data required for image input"),
    ),
    Refusal(
        "llama.cpp (no --embeddings)",
        "501",
        re.compile(r"does not support embeddings"),
        "server",
        "not supported by this model's server",
        re.compile(r"This server does not support embeddings\. Start it with `--embeddings`"),
    ),
)

# each wording as bytes, in any case: what :func:`echoed` looks for in a request
_ECHOES = {
    r.pattern.pattern: re.compile(r.pattern.pattern.encode(), re.IGNORECASE) for r in REFUSALS
}


def refusal(status: int, message: str) -> Refusal | None:
    """The refusal an upstream error reply's message is, whole (surrounding white space
    aside), if any. Any 4xx or 5xx status is read: engines disagree on the status, the
    wording is what is stable."""
    if status < 400:
        return None
    message = message.strip()
    for known in REFUSALS:
        if known.shape.fullmatch(message):
            return known
    return None


def echoed(capability: str, request: bytes) -> bool:
    """Whether the bytes of a request hold, in any case, the wording of a refusal of
    ``capability``: then an error naming it may quote the client, not the engine."""
    return any(r.echo.search(request) for r in REFUSALS if r.refuses == capability)
