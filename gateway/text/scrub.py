"""The rules that make upstream text safe to show a client (used by :func:`errors.scrub`).

Upstream error text can quote what no client may see: the upstream's own key, its host
names and addresses, file paths, URLs, a traceback. :func:`clean` removes them, in this
order: every configured secret first (from the raw text, so no later rule can cut one in
two), traceback lines, URLs, IPv6 and IPv4 literals, ``host:port`` tokens, the configured
host names, file paths; runs of ``[redacted]`` fold into one. Each pattern is possessive
or anchored to one candidate start per token, so the work is linear in any text.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from gateway.text.redact import NO_SECRETS, REDACTED, Secrets, redactor

__all__ = ["clean"]

_TRACEBACK_START = re.compile(r"Traceback \(most recent call last\)")
_TRACE_LINE = re.compile(r"Traceback|^\s*File \"|^\s+at \S+ \(|^\s+at \S+:\d+")
# one candidate start per token (the lookbehind), so a long dotted token stays linear
_URL = re.compile(r"(?<![a-zA-Z0-9+.-])[a-zA-Z][a-zA-Z0-9+.-]*+://[^\s\"'<>]+")
_PATH = re.compile(r"(?<![\w.])/(?:[\w.@+-]+/)+[\w.@+-]+|\b[A-Za-z]:\\[^\s\"'<>]+")
_IPV4 = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b")
# IPv6 candidates, each checked by ipaddress (see _ipv6): bracketed (``[fd00::17]:8000``),
# or bare (``fd00::17``, ``::1``, ``fe80::1%eth0``, ``::ffff:10.0.0.1``): no word character,
# ``:`` or ``.`` before it, no word character after it. Possessive: linear in any text.
_IPV6 = re.compile(
    r"\[(?P<bracketed>[0-9A-Fa-f.]*+:[0-9A-Fa-f:.]*+(?:%[\w.-]++)?)\](?::\d{1,5}\b)?"
    r"|(?<![\w:.])(?P<bare>[0-9A-Fa-f.]*+:[0-9A-Fa-f:.]*+(?:%[\w.-]++)?)(?!\w)"
)
# ``host:port`` candidates, each checked by _host_port: a token of host-name characters, a
# colon, one to five digits, and no word character, ``:`` or ``.<word>`` after them (a time's
# ``12:30:45``, a version's ``1.2:3.4``).
_HOST_PORT = re.compile(r"(?<![\w.:-])(?P<host>[\w-]++(?:\.[\w-]++)*+):\d{1,5}(?![\w:]|\.\w)")
_LABEL = re.compile(r"[A-Za-z0-9](?:[\w-]*[A-Za-z0-9])?")
_RUNS = re.compile(f"(?:{re.escape(REDACTED)}){{2,}}")  # a host:port and its path: one


def _ipv6(match: re.Match[str]) -> str:
    """An IPv6 literal goes; code-ish text does not (``a::b``, ``dead::beef``: a bare
    candidate must hold a decimal digit). A sentence's ``.`` or ``:`` after it stays."""
    bracketed = match["bracketed"]
    if bracketed is not None:
        text, rest = bracketed, ""
    else:
        text = match["bare"].rstrip(".:")
        rest = match["bare"][len(text) :]
        if not any(c.isdigit() for c in text):
            return match[0]
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return match[0]
    return REDACTED + rest


def _host_port(match: re.Match[str]) -> str:
    """A host name before ``:port`` goes: dotted labels, the last holding a letter (not an
    IPv4 address or a version), one label holding a hyphen and a letter (``gpu-node-7``,
    as cluster names go), or ``localhost``. A plain word before digits (``error:400``,
    ``tokens:4096``) is text, and so is a bare ``vllm:8000`` unless it is configured."""
    host = match["host"]
    labels = host.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return match[0]
    if len(labels) > 1:
        named = any(c.isalpha() for c in labels[-1])
    else:
        named = host.lower() == "localhost" or ("-" in host and any(c.isalpha() for c in host))
    return REDACTED if named else match[0]


def _drop_traceback(message: str) -> list[str]:
    """Lines of ``message`` without any traceback.

    A Python traceback is its header line, then indented frame and source lines;
    the exception line that ends it (not indented) is kept: it is the message.
    """
    kept: list[str] = []
    in_trace = False
    for line in message.splitlines():
        if _TRACEBACK_START.search(line):
            in_trace = True
            continue
        if in_trace and (not line.strip() or line[:1].isspace()):
            continue
        in_trace = False
        if not _TRACE_LINE.search(line):
            kept.append(line)
    return kept


def clean(message: str, hosts: Iterable[str] = (), secrets: Secrets = NO_SECRETS) -> str:
    """``message`` without secrets, tracebacks, URLs, addresses, host names and paths.

    ``secrets`` is a :class:`gateway.text.redact.Redactor` (with the host names of every
    configured upstream, besides ``hosts``: the answering one's, DNS joins included), or the
    strings themselves.
    """
    known = redactor(secrets)
    text = "\n".join(_drop_traceback(known(message))).strip()
    text = _URL.sub(REDACTED, text)
    text = _IPV6.sub(_ipv6, text)
    text = _IPV4.sub(REDACTED, text)
    text = _HOST_PORT.sub(_host_port, text)
    for host in hosts:
        if host:
            text = re.sub(re.escape(host), REDACTED, text, flags=re.IGNORECASE)
    if known.hosts_pattern is not None:  # every configured upstream's, not only this one's
        text = known.hosts_pattern.sub(REDACTED, text)
    text = _PATH.sub(REDACTED, text)
    return _RUNS.sub(REDACTED, text)
