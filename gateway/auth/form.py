"""A sign-in request's form body (``application/x-www-form-urlencoded``), read bounded.

OAuth servers ignore parameters they do not know (RFC 6749 §3.1, RFC 8628 §3.1): every
field is read, only the first of each name kept. The body is at most ``MAX_FORM_BYTES``
and ``MAX_FIELDS`` fields (a device code, a token and a key are far shorter); past either
it is not parsed.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from aiohttp import web

MAX_FORM_BYTES = 8192
MAX_FIELDS = 32


async def read_form(request: web.Request) -> dict[str, str] | None:
    """The form's fields, or None: too large, too many fields."""
    length = request.content_length
    if length is not None and length > MAX_FORM_BYTES:
        return None
    buf = bytearray()
    while True:
        chunk = await request.content.read(MAX_FORM_BYTES + 1 - len(buf))
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_FORM_BYTES:
            return None
    try:
        pairs = parse_qsl(
            buf.decode("utf-8", "replace"),
            keep_blank_values=True,
            max_num_fields=MAX_FIELDS,
        )
    except ValueError:
        return None
    out: dict[str, str] = {}
    for name, value in pairs:
        out.setdefault(name, value)
    return out


def origin(request: web.Request, public_base_url: str) -> str:
    """The gateway's origin as its clients reach it: the configured public one behind a
    reverse proxy, else the request's own scheme and host."""
    return public_base_url or f"{request.scheme}://{request.host}"
