"""Every touch of aiohttp's internals, in one place.

Checked against aiohttp 3.14.0 (the declared floor, run by ``.ci/min-versions``) through
3.14.5 (the newest release when written). CI installs the newest release on every run
(``pip install '.[test,...]'`` has no upper bound), so the unit and end-to-end suites run
against both ends; the ``test_aiohttp_*`` unit tests of the connection protocol fail by
name when a release moves one of these. We chose that over an upper bound on ``aiohttp``:
a bound would hold users back from a security release until we publish, where the tests
tell us the day a release breaks us.

What is private, and what depends on it:

* ``RequestHandler._messages`` and ``web_protocol._ErrInfo``: llhttp's parse error after a
  head (a broken chunk size in a later read) is queued as the next "request"; the
  connection protocol reads the queue's last entry to fail the waiting body at once
  (without it, the body deadline still answers, with a 408).
* ``Server.request_factory`` (an attribute, not a documented hook): called once per request
  when its head is parsed; wrapped to start the body deadline.
* ``BaseRequest._version`` and ``_cache`` (``version`` is a ``reify``): aiohttp's
  placeholder request for a parser refusal is HTTP/1.0 (``web_protocol.ERROR``), and the
  answer's status line takes the request's version; the refusal is answered ``HTTP/1.1``
  instead (:func:`answer_as_http11`).
* The write path's extra bytes (:data:`WRITE_FRAMING`): aiohttp adds chunk framing to each
  write and sends the held-back response head with the first one; the writer's
  backpressure check allows for them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import HttpVersion11, web, web_protocol

__all__ = ["WRITE_FRAMING", "answer_as_http11", "parser_refused", "wrap_request_factory"]

# Bytes aiohttp adds to a write beyond the caller's: the chunk framing, and on the first
# write the response head it held back (a few hundred bytes for the SSE headers).
WRITE_FRAMING = 4096

_ERR_INFO: type | None = getattr(web_protocol, "_ErrInfo", None)


def answer_as_http11(request: web.BaseRequest) -> None:
    """Make the answer to ``request`` start ``HTTP/1.1`` whatever version it was read as."""
    if request.version != HttpVersion11:
        request._version = HttpVersion11  # type: ignore[attr-defined]
        request._cache["version"] = HttpVersion11  # type: ignore[attr-defined]


def parser_refused(protocol: web.RequestHandler) -> bool:
    """Did the last read end in a parser error (queued as the next "request")?"""
    queued = getattr(protocol, "_messages", None)
    return (
        _ERR_INFO is not None
        and queued is not None
        and len(queued) > 0
        and isinstance(queued[-1][0], _ERR_INFO)
    )


def wrap_request_factory(server: web.Server, before: Callable[..., None]) -> None:
    """Call ``before(protocol, payload)`` as each request's head is parsed, then make the
    request as aiohttp would."""
    make = server.request_factory

    def started(
        message: Any, payload: Any, protocol: web.RequestHandler, writer: Any, task: Any
    ) -> web.BaseRequest:
        before(protocol, payload)
        return make(message, payload, protocol, writer, task)

    server.request_factory = started
