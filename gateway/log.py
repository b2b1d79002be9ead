"""structlog pipeline, configured once: JSON lines on stderr.

Per-request context (request id, route, model) is bound with contextvars by the
middleware, so every line of a request carries it. Event names are fixed
strings with key/value pairs; prompt text, completions and keys are never
logged.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

from gateway import jsonutil

_PID = 0
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


def _dumpb(obj: object, **_: object) -> bytes:
    return jsonutil.dumpb(obj)


def _add_pid(_logger: object, _name: str, event: dict[str, object]) -> dict[str, object]:
    event["pid"] = _PID  # tells --workers processes apart
    return event


def configure(level: str = "info") -> None:
    global _PID
    _PID = os.getpid()
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
        logger_factory=structlog.BytesLoggerFactory(file=sys.stderr.buffer),
        cache_logger_on_first_use=True,
    )
    # aiohttp's own access log is replaced by ours; its error logger still reports bugs.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(message)s")
    logging.getLogger("aiohttp.access").disabled = True


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]
