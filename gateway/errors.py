"""Every failure the gateway can meet, and the one place it is rendered.

Exception tree::

    GatewayError                 status + message; error.type comes from STATUS_TYPES
     ├── InvalidRequest          400 invalid_request_error (names the field path)
     ├── AuthenticationFailed    401 authentication_error
     ├── NotFound                404 not_found_error
     ├── RequestTooLarge         413 request_too_large
     ├── NotSupported            501 not_supported
     ├── Overloaded              529 overloaded_error, with retry-after
     └── UpstreamError           whatever the upstream said, mapped and scrubbed
          ├── UpstreamUnavailable  529: refused / reset before response headers
          ├── UpstreamTimeout      504: no headers, or no chunk, within the timeout
          └── StreamProcessingError 500: the upstream reply could not be understood

Raise them anywhere; :func:`anthropic_body`, :func:`openai_body`,
:func:`sse_error_event` and the pass-through's :func:`openai_sse_error` and
:func:`responses_sse_error` turn them into bytes. Nothing else builds error bodies.

Rendering cannot fail: a message is made encodable when the error is made (a lone
surrogate becomes the text ``\\ud800``) and capped at :data:`MAX_RENDERED` characters,
and a body that still does not encode (a message changed later, a ``details`` value) is
rendered again with every string made encodable and without ``details``. Client input
quoted in a message goes through :func:`echo` (shortened, escaped).

Protocol facts relied on:

* Anthropic's envelope is ``{"type":"error","error":{"type":T,"message":M}}``
  with an optional top-level ``request_id`` and an optional ``error.details``
  (``{"error_code": ...}``, which the SDKs branch on); T follows the HTTP status
  (:data:`STATUS_TYPES`). The SDKs and Claude Code retry 408, 409, 429 and
  every 5xx, and honour ``retry-after`` and ``x-should-retry``.
* Upstream text reaches a client only through :func:`scrub`: a 5xx message is
  replaced whole; a 4xx message first loses every configured upstream secret
  (:mod:`gateway.text.redact`), then traceback lines, URLs, IP addresses (IPv4, and
  IPv6 bare or bracketed, with a port or not), ``host:port`` tokens, the
  upstream's host names and file paths, and is capped at 500 characters.
  :func:`from_upstream` is the one map of an upstream's error (a status reply, an in-band
  error object), run once per error with the redactor of every secret the process knows
  (gateway/upstream/known.py); the error keeps its message only, never the body.
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
* Claude Code acts on exactly two context-overflow wordings (see
  :func:`context_overflow_message`); the upstreams' own wordings are rewritten
  into them. Wordings recognised (checked against the servers' sources):

  - vLLM <= 0.10: "This model's maximum context length is M tokens. However,
    you requested T tokens (P in the messages, C in the completion)." and
    "... However, your request has P input tokens." and "'max_tokens' or
    'max_completion_tokens' is too large: C. This model's maximum context
    length is M tokens and your request has P input tokens (C > M - P)."
  - vLLM renderer (0.11-0.17): "You passed P input tokens and requested C
    output tokens. However, the model's context length is only M tokens, ..."
    and the same with "input characters" (then only a bound on P is known).
  - vLLM >= 0.18: "This model's maximum context length is M tokens. However,
    you requested C output tokens and your prompt contains [at least ]P input
    tokens, for a total of [at least ]T tokens." (or "... contains N
    characters (more than X characters, which is the upper bound for Y input
    tokens)"), and "max_tokens=C cannot be greater than
    max_model_len=max_total_tokens=M".
  - vLLM engine: "The decoder prompt (length P) is longer than the maximum
    model length of M."
  - SGLang: "The input (P tokens) is longer than the model's context length
    (M tokens)." and "Requested token count exceeds the model's maximum
    context length of M tokens. You requested a total of T tokens: P tokens
    from the input messages and C tokens for the completion." and (scheduler)
    "Input length (P tokens) exceeds the maximum allowed length (X tokens)".
  - llama.cpp: ``{"error":{"code":400,"message":"request (P tokens) exceeds
    the available context size (M tokens), try increasing it","type":
    "exceed_context_size_error","n_prompt_tokens":P,"n_ctx":M}}``, and the
    older "input (P tokens) is larger than the max context size (M tokens)".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway.text import jsonutil
from gateway.text.overflow import context_overflow_message
from gateway.text.redact import NO_SECRETS, Secrets
from gateway.text.refusals import refusal
from gateway.text.scrub import clean

# THE status -> error.type table (Anthropic's documented types).
STATUS_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    501: "not_supported",
    504: "timeout_error",
    529: "overloaded_error",
}
_ANTHROPIC_TYPES = frozenset(STATUS_TYPES.values())
_RETRY_AFTER_STATUSES = frozenset({429, 529})
_INTERNAL = "Internal server error"
_MAX_MESSAGE = 500
MAX_RENDERED = 2000  # a message's longest rendering, whatever built it
_ECHO = 64  # characters of client input quoted in a message
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


def error_type_for(status: int) -> str:
    known = STATUS_TYPES.get(status)
    if known is not None:
        return known
    return "api_error" if status >= 500 else "invalid_request_error"


def echo(value: object, limit: int = _ECHO) -> str:
    """Client input as a message quotes it: at most ``limit`` characters, encodable."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = text[:limit] + "..."
    return _renderable(text)


def _renderable(text: str) -> str:
    """``text``, encodable as UTF-8 (a lone surrogate becomes ``\\udXXX``) and capped."""
    if len(text) > MAX_RENDERED:
        text = text[: MAX_RENDERED - 3] + "..."
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class GatewayError(Exception):
    """A failure with an HTTP status and a client-safe message."""

    status: int = 500
    default_message: str = _INTERNAL
    should_retry: bool | None = None
    # ``error.details`` of the envelope: a machine-readable ``error_code`` that SDKs branch on
    details: Mapping[str, Any] | None = None
    # the status the upstream answered, when this error is its reply (from_upstream); None
    # for the gateway's own failures (a connect error, a timeout, a malformed reply)
    upstream_status: int | None = None
    # the capability an upstream refused (gateway.text.refusals.CAPABILITIES), when this error
    # is such a refusal; the Messages call may then retry with that content as text
    refused: str | None = None

    def __init__(
        self,
        message: str | None = None,
        *,
        status: int | None = None,
        error_type: str | None = None,
        retry_after: int | None = None,
        should_retry: bool | None = None,
    ) -> None:
        if status is not None:
            self.status = status
        self.message = _renderable(message) if message is not None else self.default_message
        self.error_type = error_type or error_type_for(self.status)
        if retry_after is None and self.status in _RETRY_AFTER_STATUSES:
            retry_after = 1
        self.retry_after = retry_after
        if should_retry is not None:
            self.should_retry = should_retry
        super().__init__(self.message)

    @property
    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self.retry_after is not None:
            headers["retry-after"] = str(self.retry_after)
        if self.should_retry is not None:
            # Overrides the SDKs' status-based retry rule (a 5xx is retried otherwise).
            headers["x-should-retry"] = "true" if self.should_retry else "false"
        return headers

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.error_type}, {self.message!r})"


class InvalidRequest(GatewayError):
    status = 400

    def __init__(self, path: str, why: str, *, details: Mapping[str, Any] | None = None
                 ) -> None:
        self.path = path
        self.why = why
        if details is not None:
            self.details = details
        super().__init__(f"{path}: {why}" if path else why)


class AuthenticationFailed(GatewayError):
    status = 401
    default_message = "invalid x-api-key"


class NotFound(GatewayError):
    status = 404
    default_message = "Not found"


class RequestTooLarge(GatewayError):
    status = 413
    default_message = "Request exceeds the maximum allowed number of bytes."


class NotSupported(GatewayError):
    status = 501
    default_message = "Not supported by this upstream"
    should_retry = False


class Overloaded(GatewayError):
    status = 529
    default_message = "Overloaded"


class UpstreamError(GatewayError):
    """A failure that came from (or on the way to) the upstream."""


class UpstreamUnavailable(UpstreamError):
    status = 529
    default_message = "Overloaded"


class UpstreamTimeout(UpstreamError):
    status = 504
    default_message = "Upstream request timed out"


class StreamProcessingError(UpstreamError):
    status = 500
    default_message = "Stream processing error"


# --- scrubbing (the rules live in gateway/text/scrub.py) ------------------------------


def scrub(status: int, message: str, hosts: Iterable[str] = (),
          secrets: Secrets = NO_SECRETS) -> str:
    """Make upstream text safe for a client. One function for every path: a 5xx message is
    replaced whole; a 4xx one loses what :func:`gateway.text.scrub.clean` removes."""
    if status >= 500:
        return _INTERNAL
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


def _map_upstream(status: int, body: Any, raw_text: str, hosts: Iterable[str],
                  secrets: Secrets, max_tokens: int | None) -> UpstreamError:
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
        err = UpstreamError(f"{known.says}: {scrub(400, text, hosts, secrets)}", status=400,
                            error_type="invalid_request_error")
        err.refused = known.refuses
        return err
    if status == 501 or known is not None:
        return UpstreamError("Not supported by this model's server", status=501,
                             should_retry=False)
    if status in (503, 529):
        return UpstreamError("Overloaded", status=529)
    if status in (401, 403, 404):
        # The gateway's own credentials or upstream_model are wrong: not the client's to fix.
        return UpstreamError(status=500, should_retry=False)
    if status >= 500:
        return UpstreamError(status=504 if status == 504 else 500)
    if status not in STATUS_TYPES:
        status = 400
    return UpstreamError(scrub(status, text, hosts, secrets), status=status,
                         error_type=anthropic_type)


def inband_status(payload: Mapping[str, Any]) -> int | None:
    """The status an in-band error in ``payload`` stands for (no code: 500), without
    mapping it; None when ``payload`` reports no error."""
    if payload.get("error") is not None:
        return _status_code_of(payload) or 500
    if payload.get("object") == "error" or payload.get("type") == "error":
        return _status_code_of({"error": payload}) or 500
    return None


def from_inband(payload: Any, *, hosts: Iterable[str] = (), secrets: Secrets = NO_SECRETS
                ) -> UpstreamError:
    """An error object inside an upstream 200 reply or SSE stream; no code counts as 5xx.

    Shapes: ``{"error": {"message", "code"?, ...}}`` (vLLM, llama.cpp, Ollama) and
    ``{"object": "error", "message", "code"}`` (SGLang, older vLLM).
    """
    if not isinstance(payload, Mapping):
        return from_upstream(500, b"", hosts=hosts, secrets=secrets)
    return from_upstream(_status_code_of(payload) or 500, payload, hosts=hosts,
                         secrets=secrets)


def inband_error(payload: Mapping[str, Any], *, hosts: Iterable[str] = (),
                 secrets: Secrets = NO_SECRETS) -> UpstreamError | None:
    """The error a decoded chunk or reply reports in-band (``{"error": {...}}``,
    ``{"object": "error", ...}`` or ``{"type": "error", ...}``), scrubbed; None when it is
    no error."""
    if payload.get("error") is not None:
        return from_inband(payload, hosts=hosts, secrets=secrets)
    if payload.get("object") == "error" or payload.get("type") == "error":
        return from_inband({"error": payload}, hosts=hosts, secrets=secrets)
    return None


# --- rendering ---------------------------------------------------------------------


def _encode(body: dict[str, Any]) -> bytes:
    """``body`` as JSON; if something in it does not encode (a message changed after the
    error was made, a ``details`` value), the same body with every string made
    encodable and ``details`` left out."""
    try:
        return jsonutil.dumpb(body)
    except (ValueError, OverflowError, TypeError):
        return jsonutil.dumpb(_fallback(body))


def _fallback(value: Any) -> Any:
    if isinstance(value, str):
        return _renderable(value)
    if isinstance(value, dict):
        return {k: _fallback(v) for k, v in value.items() if k != "details"}
    if isinstance(value, (bool, int)):
        return value
    return None


def anthropic_body(err: GatewayError, request_id: str | None = None) -> bytes:
    body: dict[str, Any] = {
        "type": "error",
        "error": {"type": err.error_type, "message": err.message},
    }
    if err.details is not None:
        body["error"]["details"] = err.details
    if request_id:
        body["request_id"] = request_id
    return _encode(body)


_OPENAI_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_exceeded",
}


def openai_status(err: GatewayError) -> int:
    """OpenAI clients know 503 for overload, not Anthropic's 529."""
    return 503 if err.status == 529 else err.status


def _openai_error(err: GatewayError) -> dict[str, Any]:
    status = openai_status(err)
    etype = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"message": err.message, "type": etype, "param": None, "code": status}


def openai_body(err: GatewayError) -> bytes:
    return _encode({"error": _openai_error(err)})


def sse_error_event(err: GatewayError) -> bytes:
    return b"event: error\ndata: " + anthropic_body(err) + b"\n\n"


def openai_sse_error(err: GatewayError) -> bytes:
    """The in-band error of a chat or completions stream: one ``data:`` event holding the
    error body (the OpenAI SDKs raise on an event with an ``error`` member)."""
    return b"data: " + openai_body(err) + b"\n\n"


def responses_sse_error(err: GatewayError, sequence_number: int | None = None) -> bytes:
    """The in-band error of a Responses stream: an ``error`` event (``type``, ``code``,
    ``message``, ``param``, and the upstream event's ``sequence_number`` when it replaces
    one), with the ``error`` member the OpenAI SDKs raise on."""
    error = _openai_error(err)
    body: dict[str, Any] = {"type": "error", "code": error["type"], "message": err.message,
                            "param": None, "error": error}
    if sequence_number is not None:
        body["sequence_number"] = sequence_number
    return b"event: error\ndata: " + _encode(body) + b"\n\n"


def responses_failure(err: GatewayError) -> dict[str, Any]:
    """The ``error`` of a failed Response object (``code``, ``message``)."""
    return {"code": _openai_error(err)["type"], "message": err.message}
