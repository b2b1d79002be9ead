"""How a config key is declared: :func:`_knob` on a dataclass field, read back as a :class:`Knob`.

A table of the config file is a frozen dataclass (gateway/ops/config_schema.py); each field
declared with :func:`_knob` is a TOML key and carries, in its metadata, everything about the
key that does not depend on another key:

- its TOML types (from the annotation, a float takes an integer too; ``types`` overrides),
  whether it is required (no default) and its default;
- ``choices`` (its value set) and ``aliases`` (other spellings of a choice, e.g. TOML true);
- its bounds: ``gt``/``ge`` (exclusive/inclusive minimum), ``le`` (inclusive maximum);
- ``fmt``: a named value format of :data:`FORMATS` (an http(s) URL, a request path, ...);
- ``doc``: one line for the reference page (docs/configuration.md, gateway/ops/config_doc.py),
  ``shown``: the default as documentation writes it when it is not the value itself,
  ``advanced``: an internal exposed as a knob (listed apart).

:func:`knobs` reads a table's keys back; gateway/ops/config_check.py checks values against them.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, get_type_hints
from urllib.parse import urlsplit

# the longest model name a client may send or the config may hold; longer names route nowhere
MAX_MODEL_NAME_CHARS = 256

# ---------------------------------------------------------------- value formats


@dataclass(frozen=True)
class Format:
    """A named shape a string key's value must have. ``check`` returns the value as loaded
    (e.g. a URL without its trailing ``/``) or raises ValueError with what it must be;
    ``echo`` False keeps the value out of the message (it may hold a password)."""

    text: str  # for the reference page
    check: Callable[[str], str]
    echo: bool = True


def _http_url(value: str, *, path_only: bool = False, empty: bool = False) -> str:
    url = value.rstrip("/")
    if empty and not url:
        return url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or (path_only and parts.query):
        raise ValueError(
            "must be an http(s) URL (scheme://host[:port][/path])"
            if path_only
            else "must be an http(s) URL"
        )
    return url


def _prefix(value: str) -> str:
    if value and (not value.startswith("/") or value.endswith("/")):
        raise ValueError("must start with '/' and not end with '/' (or be empty)")
    return value


_PATH_CHARS = re.compile(r"/[\x21-\x7e]*")  # what goes into a request line


def _request_path(value: str) -> str:
    if value and not _PATH_CHARS.fullmatch(value):
        raise ValueError("must start with '/' and hold printable ASCII without spaces")
    return value


def _database(value: str) -> str:
    if value and not value.startswith(("sqlite:///", "postgresql://", "postgres://", "/")):
        raise ValueError("must be sqlite:///PATH, an absolute path or postgresql://...")
    return value


def _model_name(value: str) -> str:
    if not value:
        raise ValueError("must not be empty")
    if len(value) > MAX_MODEL_NAME_CHARS:
        raise ValueError(f"must be at most {MAX_MODEL_NAME_CHARS} characters")
    return value


_CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")


def _client_name(value: str) -> str:
    if not _CLIENT_NAME.fullmatch(value):
        raise ValueError(
            "must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


def _sha256_hex(value: str) -> str:
    if value and not _SHA256_HEX.fullmatch(value):
        raise ValueError("must be 64 hex digits (the key's SHA-256)")
    return value.lower()


def _cidr(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value.strip(), strict=False))
    except ValueError:
        raise ValueError("must be an IP network in CIDR form (127.0.0.0/8, fd00::/8)") from None


FORMATS: dict[str, Format] = {
    "http_url": Format("an http(s) URL", _http_url),
    "http_base": Format(
        "an http(s) URL, `scheme://host[:port][/path]`, no query",
        functools.partial(_http_url, path_only=True),
    ),
    "http_base_or_empty": Format(
        "empty, or an http(s) URL `scheme://host[:port][/path]`",
        functools.partial(_http_url, path_only=True, empty=True),
    ),
    "prefix": Format("empty, or starts with `/` and does not end with `/`", _prefix),
    "request_path": Format("empty, or `/` then printable ASCII without spaces", _request_path),
    "database": Format(
        "empty, `sqlite:///PATH`, an absolute path or `postgresql://...`", _database, echo=False
    ),
    "model_name": Format(
        f"1 to {MAX_MODEL_NAME_CHARS} characters; `*` makes it a pattern", _model_name
    ),
    "client_name": Format("1 to 64 letters, digits, `.`, `_`, `-` (a metric label)", _client_name),
    "sha256_hex": Format("64 hex digits", _sha256_hex, echo=False),
    "cidr": Format("an IP network in CIDR form (`10.0.0.0/8`, `fd00::/8`)", _cidr),
}

# ---------------------------------------------------------------- declaring a key


def _not_toml(default: Any, *, secret: bool = False) -> Any:
    """A field that is no TOML key: set by parse() from the table's name, env or other keys."""
    return field(default=default, repr=not secret, metadata={"toml": False})


_POS, _NONNEG = "> 0", ">= 0"  # the old spelling of gt=0 and ge=0 (``bound=``), still taken


def _knob(
    default: Any = MISSING,
    *,
    doc: str = "",
    choices: tuple[Any, ...] | None = None,
    aliases: Mapping[Any, Any] | None = None,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    fmt: str | None = None,
    types: tuple[type, ...] | None = None,
    shown: str | None = None,
    advanced: bool = False,
    bound: str | None = None,
) -> Any:
    """One TOML key: its default (none: required) and what the module docstring lists."""
    if bound is not None:
        gt, ge = (0, ge) if bound == _POS else (gt, 0)
    assert fmt is None or fmt in FORMATS, fmt
    meta: dict[str, Any] = {"doc": doc, "advanced": advanced}
    for name, value in (
        ("choices", choices),
        ("aliases", aliases),
        ("gt", gt),
        ("ge", ge),
        ("le", le),
        ("fmt", fmt),
        ("types", types),
        ("shown", shown),
    ):
        if value is not None:
            meta[name] = value
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Knob:
    """One TOML key of the schema, derived from its dataclass field (see :func:`_knob`)."""

    name: str
    types: tuple[type, ...]
    required: bool
    default: Any  # None when required or unset
    shown: str | None = None  # the default as documentation writes it, when not the value
    doc: str = ""
    choices: tuple[Any, ...] | None = None
    aliases: tuple[tuple[Any, Any], ...] = ()  # (other spelling, the choice it means)
    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    fmt: str | None = None  # a key of FORMATS
    advanced: bool = False

    def allowed(self) -> str:
        """The value set, bounds or format as the reference page writes them ("" for none)."""
        if self.choices is not None:
            text = ", ".join(f"`{c}`" for c in self.choices)
            return text + "".join(f"; `{_toml(a)}` = `{c}`" for a, c in self.aliases)
        if self.fmt is not None:
            return ("each " if list in self.types else "") + FORMATS[self.fmt].text
        if self.ge is not None and self.le is not None:
            return f"{self.ge}..{self.le}"
        low = (
            f"> {self.gt}"
            if self.gt is not None
            else (f">= {self.ge}" if self.ge is not None else "")
        )
        high = f"<= {self.le}" if self.le is not None else ""
        return ", ".join(t for t in (low, high) if t)


def _toml(value: Any) -> str:
    """A scalar as TOML writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else repr(value)


_TOML_TYPES: dict[Any, tuple[type, ...]] = {
    str: (str,),
    int: (int,),
    float: (int, float),
    bool: (bool,),
    str | None: (str,),
}


@functools.cache
def knobs(cls: type) -> dict[str, Knob]:
    """The TOML keys of one table (ServerConfig, UpstreamConfig, ...), in order."""
    hints = get_type_hints(cls)
    out: dict[str, Knob] = {}
    for f in fields(cls):
        meta = f.metadata
        if not meta.get("toml", True):
            continue
        required = f.default is MISSING and f.default_factory is MISSING
        out[f.name] = Knob(
            f.name,
            meta.get("types") or _TOML_TYPES[hints[f.name]],
            required,
            None if required else f.default,
            shown=meta.get("shown"),
            doc=meta.get("doc", ""),
            choices=meta.get("choices"),
            aliases=tuple((meta.get("aliases") or {}).items()),
            gt=meta.get("gt"),
            ge=meta.get("ge"),
            le=meta.get("le"),
            fmt=meta.get("fmt"),
            advanced=meta.get("advanced", False),
        )
    return out
