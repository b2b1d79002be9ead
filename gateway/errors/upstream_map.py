"""Upstream errors: the one map of an upstream's error reply or in-band error object to the
error the client sees, scrubbed once (:func:`from_upstream`).

Protocol facts relied on:

* Upstream text reaches a client only through :func:`scrub`: a 5xx message is
  replaced whole; a 4xx message first loses every secret the process knows (the
  redactor built by gateway/upstream/known.py: every upstream's key, the clients' keys,
  the signing keys), then traceback lines, URLs, IP addresses (IPv4, and IPv6 bare or
  bracketed, with a port or not), ``host:port`` tokens, every upstream's host names and
  file paths, and is capped at 500 characters.
* :func:`from_upstream` is the one map of an upstream's error (a status reply's body, at
  most :data:`MAX_UPSTREAM_BODY` bytes of it, or an in-band error object), run once per
  error; the error keeps its scrubbed message only, never the body.
* An upstream 503 means "busy": it is answered as 529 ``overloaded_error``.
  A 401/403/404 from the upstream is the gateway's own misconfiguration (its
  key or its ``upstream_model``), so the client gets a 500 it should not retry.
* An upstream refusal that names its cause (:mod:`gateway.text.refusals`: an image to a
  text-only model, a content part type the server does not parse) is the request's fault
  whatever the status: ``400 invalid_request_error`` saying what the model does not
  support, with the upstream's wording scrubbed as a 4xx's is; the error's ``refused``
  names the capability, so the Messages call can retry with that content as text. An
  upstream 501 (a route the engine's server does not offer, e.g. llama.cpp's embeddings
  without ``--embeddings``) is ``501 not_supported`` with ``x-should-retry: false``.
* Claude Code acts on exactly two context-overflow wordings; the upstreams' own wordings
  are rewritten into them (:mod:`gateway.text.overflow` lists those recognised).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway.errors.tree import INTERNAL, STATUS_TYPES, UpstreamError, error_type_for
from gateway.text import jsonutil
from gateway.text.overflow import context_overflow_message
from gateway.text.redact import NO_SECRETS, Secrets
from gateway.text.refusals import refusal
from gateway.text.scrub import clean

__all__ = [
    "MAX_UPSTREAM_BODY",
    "from_inband",
    "from_upstream",
    "inband_error",
    "inband_status",
    "scrub",
]

_ANTHROPIC_TYPES = frozenset(STATUS_TYPES.values())
_MAX_MESSAGE = 500  # characters of an upstream's (scrubbed) words a client reads
# What a client reads when the upstream's own words scrub down to nothing.
_FALLBACK_MESSAGES: Mapping[str, str] = {
    "invalid_request_error": "Invalid request",
    "authentication_error": "Authentication failed",
    "billing_error": "Payment required",
    "permission_error": "Permission denied",
    "not_found_error": "Not found",
    "timeout_error": "Request timed out",
    "conflict_error": "Conflict",
    "request_too_large": "Request too large",
    "rate_limit_error": "Rate limited",
    "overloaded_error": "Overloaded",
}


def scrub(
    status: int, message: str, hosts: Iterable[str] = (), secrets: Secrets = NO_SECRETS
) -> str:
    """Make upstream text safe for a client. One function for every path: a 5xx message is
    replaced whole; a 4xx one loses what :func:`gateway.text.scrub.clean` removes."""
    if status >= 500:
        return INTERNAL
    text = clean(message, hosts, secrets)
    if len(text) > _MAX_MESSAGE:
        text = text[: _MAX_MESSAGE - 3] + "..."
    return text or _FALLBACK_MESSAGES.get(error_type_for(status), "Invalid request")


# --- upstream error bodies -----------------------------------------------------------


def _message_of(body: Any) -> tuple[str, str | None]:
    """(message, Anthropic error.type or None) from any upstream error body."""
    if not isinstance(body, Mapping):
        return "", None
    err = body.get("error")
    if isinstance(err, Mapping):
        msg = err.get("message")
        etype = err.get("type") if body.get("type") == "error" else None
        return (msg if isinstance(msg, str) else ""), (
            etype if isinstance(etype, str) and etype in _ANTHROPIC_TYPES else None
        )
    if isinstance(err, str):
        return err, None
    for key in ("message", "detail"):
        value = body.get(key)
        if isinstance(value, str):
            return value, None
        if isinstance(value, list):  # FastAPI validation: [{"loc": [...], "msg": "..."}]
            msgs = [d["msg"] for d in value if isinstance(d, Mapping) and "msg" in d]
            msgs = [m for m in msgs if isinstance(m, str)]
            if msgs:
                return "; ".join(msgs), None
    return "", None


def _status_code_of(payload: Mapping[str, Any]) -> int | None:
    for holder in (payload.get("error"), payload):
        if not isinstance(holder, Mapping):
            continue
        for key in ("code", "status", "status_code"):
            value = holder.get(key)
            if isinstance(value, str) and value.isdigit():
                value = int(value)
            if isinstance(value, int) and not isinstance(value, bool) and 400 <= value <= 599:
                return value
    return None


# the longest upstream body the mapping reads (the client reads at most this of a status
# reply's body); nothing of it outlives the mapping: the error keeps only its message
MAX_UPSTREAM_BODY = 64 * 1024


def from_upstream(
    status: int,
    body: bytes | Mapping[str, Any],
    *,
    hosts: Iterable[str] = (),
    secrets: Secrets = NO_SECRETS,
    max_tokens: int | None = None,
) -> UpstreamError:
    """THE map of an upstream's error to the error the client sees, scrubbed once.

    ``body`` is a status reply's raw body (at most :data:`MAX_UPSTREAM_BODY` bytes are
    read), or the decoded error object of an in-band error (:func:`from_inband`).
    ``secrets`` is the app's redactor of every secret the process knows
    (gateway/upstream/known.py), ``hosts`` the answering upstream's host names. The error
    holds the status, the type and the scrubbed message (:data:`_MAX_MESSAGE` characters
    of upstream text), never the body."""
    if isinstance(body, Mapping):
        decoded: Any = body
        raw_text = ""
    else:
        raw = body[:MAX_UPSTREAM_BODY]
        try:
            decoded = jsonutil.loads(raw) if raw else None
        except ValueError:
            decoded = None
        raw_text = raw.decode("utf-8", "replace") if decoded is None else ""
    err = _map_upstream(status, decoded, raw_text, hosts, secrets, max_tokens)
    err.upstream_status = status
    return err


def _map_upstream(
    status: int,
    body: Any,
    raw_text: str,
    hosts: Iterable[str],
    secrets: Secrets,
    max_tokens: int | None,
) -> UpstreamError:
    if body is not None:
        text, anthropic_type = _message_of(body)
    else:
        # whole (at most MAX_UPSTREAM_BODY), as a JSON message is: a cut before scrub()
        # would leave the start of a key, address or host name that no rule then matches
        text, anthropic_type = raw_text, None
        if text.lstrip().startswith("<"):  # an HTML error page from a proxy: no words worth keeping
            text = ""
    if status not in (401, 403, 404, 429, 503, 529):
        overflow = context_overflow_message(
            body if isinstance(body, Mapping) else None, text, max_tokens
        )
        if overflow is not None:
            return UpstreamError(overflow, status=400, error_type="invalid_request_error")
    known = refusal(status, text) if status not in (401, 403, 404, 429, 503, 529) else None
    if known is not None and known.refuses != "server":
        err = UpstreamError(
            f"{known.says}: {scrub(400, text, hosts, secrets)}",
            status=400,
            error_type="invalid_request_error",
        )
        err.refused = known.refuses
        return err
    if status == 501 or known is not None:
        return UpstreamError("Not supported by this model's server", status=501, should_retry=False)
    if status in (503, 529):
        return UpstreamError("Overloaded", status=529)
    if status in (401, 403, 404):
        # The gateway's own credentials or upstream_model are wrong: not the client's to fix.
        return UpstreamError(status=500, should_retry=False)
    if status >= 500:
        return UpstreamError(status=504 if status == 504 else 500)
    if status not in STATUS_TYPES:
        status = 400
    return UpstreamError(
        scrub(status, text, hosts, secrets), status=status, error_type=anthropic_type
    )


MAX_RETRY_AFTER = 300  # seconds of an upstream's Retry-After passed on, at most


def retry_after_hint(value: bytes | None) -> int | None:
    """An upstream's ``Retry-After`` in whole seconds (1..:data:`MAX_RETRY_AFTER`), for the
    429/529 the client gets in its place; None for an absent, HTTP-date or malformed value
    (the error's own default then stands)."""
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or len(text) > 6:
        return None
    return min(max(int(text), 1), MAX_RETRY_AFTER)


def inband_status(payload: Mapping[str, Any]) -> int | None:
    """The status an in-band error in ``payload`` stands for (no code: 500), without
    mapping it; None when ``payload`` reports no error."""
    if payload.get("error") is not None:
        return _status_code_of(payload) or 500
    if payload.get("object") == "error" or payload.get("type") == "error":
        return _status_code_of({"error": payload}) or 500
    return None


def from_inband(
    payload: Any, *, hosts: Iterable[str] = (), secrets: Secrets = NO_SECRETS
) -> UpstreamError:
    """An error object inside an upstream 200 reply or SSE stream; no code counts as 5xx.

    Shapes: ``{"error": {"message", "code"?, ...}}`` (vLLM, llama.cpp, Ollama) and
    ``{"object": "error", "message", "code"}`` (SGLang, older vLLM).
    """
    if not isinstance(payload, Mapping):
        return from_upstream(500, b"", hosts=hosts, secrets=secrets)
    return from_upstream(_status_code_of(payload) or 500, payload, hosts=hosts, secrets=secrets)


def inband_error(
    payload: Mapping[str, Any], *, hosts: Iterable[str] = (), secrets: Secrets = NO_SECRETS
) -> UpstreamError | None:
    """The error a decoded chunk or reply reports in-band (``{"error": {...}}``,
    ``{"object": "error", ...}`` or ``{"type": "error", ...}``), scrubbed; None when it is
    no error."""
    if payload.get("error") is not None:
        return from_inband(payload, hosts=hosts, secrets=secrets)
    if payload.get("object") == "error" or payload.get("type") == "error":
        return from_inband({"error": payload}, hosts=hosts, secrets=secrets)
    return None
