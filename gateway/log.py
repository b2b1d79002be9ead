"""structlog pipeline, configured once: JSON lines on stderr.

Per-request context (request id, route, model) is bound with contextvars by the
middleware, so every line of a request carries it. Event names are fixed
strings with key/value pairs; prompt text, completions and keys are never
logged.

Lines are written to a buffer that is flushed when it fills, every
``FLUSH_INTERVAL`` seconds (a timer the app runs), at shutdown, and at once for
warnings and errors: one write system call per line cost more than the rest
of an access line.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import Any

import structlog

from gateway import jsonutil

_PID = 0
_LEVEL = logging.INFO
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


def _dumpb(obj: object, **_: object) -> bytes:
    return jsonutil.dumpb(obj)


def _add_pid(_logger: object, _name: str, event: MutableMapping[str, Any]
             ) -> MutableMapping[str, Any]:
    event["pid"] = _PID  # tells --workers processes apart
    return event


FLUSH_INTERVAL = 0.5


class _LineWriter:
    """structlog logger: rendered lines into a buffered stderr; flush() on a timer."""

    __slots__ = ("_write",)

    def __init__(self) -> None:
        self._write = _OUT.write

    def msg(self, message: bytes) -> None:
        self._write(message + b"\n")

    info = debug = msg

    def warning(self, message: bytes) -> None:
        self._write(message + b"\n")
        _OUT.flush()

    error = exception = critical = warn = warning


_OUT = open(2, "wb", buffering=64 * 1024, closefd=False)


def flush() -> None:
    try:
        _OUT.flush()
    except (OSError, ValueError):
        pass


def configure(level: str = "info") -> None:
    global _PID, _LEVEL
    _PID = os.getpid()
    _LEVEL = _LEVELS[level]
    atexit.register(flush)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _add_pid,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=_dumpb),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=lambda *_: _LineWriter(),
        cache_logger_on_first_use=True,
    )
    # aiohttp's own access log is replaced by ours; its error logger still reports bugs.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(message)s")
    logging.getLogger("aiohttp.access").disabled = True
    # pypdf logs what it finds wrong in a client's PDF (plain lines, client-controlled);
    # the client gets the 400 and the log stays JSON.
    logging.getLogger("pypdf").setLevel(logging.CRITICAL + 1)  # and its module loggers


def access(fields: dict[str, Any]) -> None:
    """Write one access line: one per request, so it skips structlog's pipeline.

    The line is shaped like every other (``event``, ``pid``, ``level``, ``timestamp``
    beside the fields); the request id is in ``fields`` instead of merged from
    contextvars. A structlog call here cost three times the JSON encoding itself.
    """
    if _LEVEL > logging.INFO:
        return
    fields["event"] = "access"
    fields["pid"] = _PID
    fields["level"] = "info"
    fields["timestamp"] = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    _OUT.write(jsonutil.dumpb(fields) + b"\n")


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]
