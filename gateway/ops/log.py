"""structlog pipeline, configured once: JSON lines on stderr.

Per-request context (request id, route, model) is bound with contextvars by the
middleware, so every line of a request carries it. Event names are fixed
strings with key/value pairs; prompt text, completions and keys are never
logged.

Lines are written to a buffer that is flushed when it fills, every
``FLUSH_INTERVAL`` seconds (a timer the app runs), at shutdown, and at once for
warnings and errors: one write system call per line cost more than the rest
of an access line.

Other libraries' log records (aiohttp's loggers, asyncio's, anything on the
standard ``logging`` tree) and the event loop's exception handler go through the
same pipeline as one JSON line each, scrubbed by :func:`scrub`: their text may
quote what a client sent (aiohttp's parser errors quote the offending header,
a credential included, as a Python bytes literal). Quoted literals, query values
and overlong tokens are removed; an exception is logged as its type and its
frames (file, line, function, innermost first), never its message.

Under systemd, stderr is a journal stream: systemd passes ``JOURNAL_STREAM``
(``device:inode`` of that stream) and journald reads a ``<N>`` syslog priority
prefix off each line (``SyslogLevelPrefix=yes``, its default). When stderr is
that stream, each line starts with ``<7>``, ``<6>``, ``<4>`` or ``<3>`` (debug,
info, warning, error), so ``journalctl -p err`` finds the errors; anywhere else
(a terminal, a file, a container's log driver) lines are plain JSON.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import re
import time
import traceback
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from gateway.text import jsonutil

_PID = 0
_LEVEL = logging.INFO
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def _dumpb(obj: object, **_: object) -> bytes:
    return jsonutil.dumpb(obj)


def _add_pid(
    _logger: object, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    event["pid"] = _PID  # tells --workers processes apart
    return event


FLUSH_INTERVAL = 0.5


# syslog priority prefixes (sd-daemon(3)): empty unless stderr is the journal's stream
_DEBUG = _INFO = _WARNING = _ERROR = b""


class _LineWriter:
    """structlog logger: rendered lines into a buffered stderr; flush() on a timer."""

    __slots__ = ("_write",)

    def __init__(self) -> None:
        self._write = _OUT.write

    def debug(self, message: bytes) -> None:
        self._write(_DEBUG + message + b"\n")

    def msg(self, message: bytes) -> None:
        self._write(_INFO + message + b"\n")

    info = msg

    def warning(self, message: bytes) -> None:
        self._write(_WARNING + message + b"\n")
        _OUT.flush()

    warn = warning

    def error(self, message: bytes) -> None:
        self._write(_ERROR + message + b"\n")
        _OUT.flush()

    exception = critical = error


_OUT = open(2, "wb", buffering=64 * 1024, closefd=False)


def flush() -> None:
    try:
        _OUT.flush()
    except (OSError, ValueError):
        pass


def _is_stderr(journal_stream: str | None) -> bool:
    """Whether ``$JOURNAL_STREAM`` (``device:inode``) names the stream stderr is."""
    if not journal_stream:
        return False
    try:
        st = os.fstat(2)
    except OSError:
        return False
    return journal_stream.strip() == f"{st.st_dev}:{st.st_ino}"


def configure(level: str = "info", journal_stream: str | None = None) -> None:
    """``journal_stream``: ``$JOURNAL_STREAM``; priority prefixes when it names stderr."""
    global _PID, _LEVEL, _DEBUG, _INFO, _WARNING, _ERROR
    _PID = os.getpid()
    _LEVEL = _LEVELS[level]
    journal = _is_stderr(journal_stream)
    _DEBUG, _INFO, _WARNING, _ERROR = (
        (b"<7>", b"<6>", b"<4>", b"<3>") if journal else (b"", b"", b"", b"")
    )
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
    # Every other logger (aiohttp.server, aiohttp.web, aiohttp.internal, asyncio, ...) goes
    # through the pipeline, scrubbed; aiohttp's own access log is replaced by ours.
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _Bridge):
            root.removeHandler(handler)
    root.addHandler(_Bridge())
    root.setLevel(logging.WARNING)
    logging.captureWarnings(True)  # warnings.warn() too: a plain line on stderr otherwise
    logging.getLogger("aiohttp.access").disabled = True
    # pypdf logs what it finds wrong in a client's PDF (plain lines, client-controlled);
    # the client gets the 400 and the log stays JSON.
    logging.getLogger("pypdf").setLevel(logging.CRITICAL + 1)  # and its module loggers


@dataclass(slots=True)
class Access:
    """One access line's fields, the same keys on every route (``extra``: a route's own,
    e.g. a batch request's ``batch_id``, ``custom_id`` and ``attempt``, an HTTP error's
    ``kind``). ``error`` is client-safe text (scrubbed, and redacted by the caller)."""

    request_id: str
    route: str
    status: int
    method: str | None = None
    model: str | None = None
    upstream: str | None = None
    duration_ms: float = 0.0
    stream: bool = False
    query: str | None = None
    error_type: str | None = None
    error: str | None = None
    extra: Mapping[str, Any] | None = None


_second = -1  # the whole second _second_text spells (UTC)
_second_text = ""


def _timestamp() -> str:
    """Now in UTC as ``datetime.isoformat`` spells it, ``Z`` for the zone: the date and time
    made once per second (formatting a datetime cost more than the rest of the line's fields)."""
    global _second, _second_text
    now = time.time_ns() // 1000  # microseconds, as datetime.now() has them
    second, micro = divmod(now, 1_000_000)
    if second != _second:
        _second_text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second = second
    return f"{_second_text}.{micro:06d}Z" if micro else _second_text + "Z"


def access(rec: Access) -> None:
    """Write one access line: one per request, so it skips structlog's pipeline.

    The line is shaped like every other (``event``, ``pid``, ``level``, ``timestamp``
    beside the fields); the request id is in the record instead of merged from
    contextvars. A structlog call here cost three times the JSON encoding itself. A line
    with ``extra`` is :func:`access_fields`'s JSON; the usual one is :func:`access_line`'s.
    """
    if _LEVEL > logging.INFO:
        return
    if rec.extra:
        _OUT.write(_INFO + jsonutil.dumpb(access_fields(rec)) + b"\n")
        return
    access_line(
        rec.request_id,
        rec.route,
        rec.status,
        rec.method,
        rec.model,
        rec.upstream,
        rec.duration_ms,
        rec.stream,
        rec.query,
        rec.error_type,
        rec.error,
    )


def access_line(
    request_id: str,
    route: str,
    status: int,
    method: str | None,
    model: str | None,
    upstream: str | None,
    duration_ms: float,
    stream: bool,
    query: str | None,
    error_type: str | None,
    error: str | None,
) -> None:
    """:func:`access` for a line with no ``extra``, its fields as arguments (the request
    path's: no record is built). The values are spliced into a template, each encoded as
    the JSON encoder would (:func:`access_fields` is the line it equals, byte for byte);
    the values of a small set (method, route, model, upstream, error type) are encoded
    once. Nothing is written below the info level."""
    if _LEVEL > logging.INFO:
        return
    if (
        type(status) is not int
        or type(stream) is not bool
        or type(duration_ms) is not float
        or not 0.001 <= duration_ms < 1e15
    ):
        rec = Access(
            request_id,
            route,
            status,
            method,
            model,
            upstream,
            round(duration_ms, 3) if type(duration_ms) is float else duration_ms,
            stream,
            query,
            error_type,
            error,
        )
        _OUT.write(_INFO + jsonutil.dumpb(access_fields(rec)) + b"\n")
        return
    known = _KNOWN.get  # a value seen before: its JSON without a call of ours
    _OUT.write(
        _INFO
        + _ACCESS_LINE
        % (
            jsonutil.dumpb(request_id),
            known(method) or _known(method),  # type: ignore[arg-type]
            known(route) or _known(route),
            known(model) or _known(model),  # type: ignore[arg-type]
            known(upstream) or _known(upstream),  # type: ignore[arg-type]
            status,
            _millis(duration_ms),
            b"true" if stream else b"false",
            b"null" if query is None else jsonutil.dumpb(query),
            known(error_type) or _known(error_type),  # type: ignore[arg-type]
            b"null" if error is None else jsonutil.dumpb(error),
            _PID,
            _timestamp().encode(),
        )
    )


def _millis(duration_ms: float) -> bytes:
    """``duration_ms`` to the microsecond, as the JSON encoder writes the rounded float (the
    fewest digits, at least one after the point), made with integer formatting only: a
    float's ``round(x, 3)`` and ``repr`` cost 3-4 µs a line where requests come one at a time
    and their code is cold."""
    ms, frac = divmod(round(duration_ms * 1000), 1000)
    if not frac:
        return b"%d.0" % ms
    if frac % 10:
        return b"%d.%03d" % (ms, frac)
    if frac % 100:
        return b"%d.%02d" % (ms, frac // 10)
    return b"%d.%d" % (ms, frac // 100)


def logs_access() -> bool:
    """Access lines are written (the level is info or below): a caller may skip making
    their fields otherwise."""
    return _LEVEL <= logging.INFO


_ACCESS_LINE = (
    b'{"request_id":%b,"method":%b,"route":%b,"model":%b,"upstream":%b,"status":%d,'
    b'"duration_ms":%b,"stream":%b,"query":%b,"error_type":%b,"error":%b,'
    b'"event":"access","pid":%d,"level":"info","timestamp":"%b"}\n'
)
_KNOWN: dict[str, bytes] = {}  # a value of a small set -> its JSON
_KNOWN_MAX = 1024  # values kept (a client's unknown model name may be anything: ...
_KNOWN_LEN = 128  # ... only short values are kept, and only so many)


def _known(value: str | None) -> bytes:
    """``value``'s JSON, kept for the next line when it is short."""
    if value is None:
        return b"null"
    out = _KNOWN.get(value)
    if out is None:
        out = jsonutil.dumpb(value)
        if len(value) <= _KNOWN_LEN and len(_KNOWN) < _KNOWN_MAX:
            _KNOWN[value] = out
    return out


def access_fields(rec: Access) -> dict[str, Any]:
    """An access line's fields, in order (the line is their JSON)."""
    fields: dict[str, Any] = {
        "request_id": rec.request_id,
        "method": rec.method,
        "route": rec.route,
        "model": rec.model,
        "upstream": rec.upstream,
        "status": rec.status,
        "duration_ms": rec.duration_ms,
        "stream": rec.stream,
        "query": rec.query,
        "error_type": rec.error_type,
        "error": rec.error,
    }
    if rec.extra:
        fields.update(rec.extra)
    fields["event"] = "access"
    fields["pid"] = _PID
    fields["level"] = "info"
    fields["timestamp"] = _timestamp()
    return fields


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]


# --- other libraries' records, scrubbed -------------------------------------------------

# From a quote to the end of its line: a Python str or bytes literal (a repr, which is how
# aiohttp and asyncio quote client bytes), or an apostrophe, whose line is lost with it
# (pairing quotes up would let a stray one expose what follows)
_QUOTED = re.compile(r"""(?:\bbytearray\(|\bb)?['"][^\n]*+""")
_QUERY_VALUE = re.compile(r"([?&;][^=&;#\s?]*+)=[^&;#\s]*+")
_LONG_TOKEN = re.compile(r"\S{129,}+")
_MAX_TEXT = 1000


def scrub(text: str) -> str:
    """Text a library logged, without what a client may have sent: from any quote to the end
    of its line becomes ``'…``, every query value goes (names kept), a token past 128
    characters becomes ``<N chars>``; at most 1,000 characters."""
    text = _QUOTED.sub("'…", text)
    text = _QUERY_VALUE.sub(r"\1", text)
    text = _LONG_TOKEN.sub(lambda m: f"<{len(m[0])} chars>", text)
    return text[:_MAX_TEXT]


def exception_fields(exc: BaseException | None) -> dict[str, Any]:
    if exc is None:
        return {}
    fields: dict[str, Any] = {"exc_type": type(exc).__name__}
    if isinstance(exc, OSError) and exc.errno is not None:
        fields["errno"] = exc.errno
    if exc.__traceback__ is not None:  # where, never what: file, line and function
        fields["traceback"] = " < ".join(
            f"{frame.filename}:{frame.lineno} {frame.name}"
            for frame in reversed(traceback.extract_tb(exc.__traceback__, limit=-20))
        )
    return fields


class _Bridge(logging.Handler):
    """A standard-library record -> one scrubbed JSON line."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a bad format string in someone else's call
            text = str(record.msg)
        exc = record.exc_info[1] if record.exc_info else None
        fields = {"logger": record.name, "detail": scrub(text), **exception_fields(exc)}
        logger = get(record.name)
        if record.levelno >= logging.ERROR:
            logger.error("library_log", **fields)
        elif record.levelno >= logging.WARNING:
            logger.warning("library_log", **fields)
        else:
            logger.info("library_log", **fields)


def loop_exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's exception handler: asyncio's message, scrubbed, and the exception's
    type and frames (the default handler prints reprs of futures and transports, which may
    hold what a client sent)."""
    exc = context.get("exception")
    get("asyncio").error(
        "event_loop_error",
        detail=scrub(str(context.get("message", ""))),
        **exception_fields(exc if isinstance(exc, BaseException) else None),
    )
