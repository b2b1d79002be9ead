"""A Redis URL read into where and how to connect (``[limits] redis_url_env``).

Read when the config loads, so a URL the client cannot use is a config error at start (and
``--check-config``); every error names no part of the URL, which may hold a password.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass(frozen=True, slots=True)
class Target:
    """Where and how to connect, parsed from a ``redis://``, ``rediss://`` or ``unix://`` URL."""

    host: str = "127.0.0.1"
    port: int = 6379
    path: str = ""  # a unix socket
    tls: bool = False
    username: str = ""
    password: str = ""
    db: int = 0

    def __repr__(self) -> str:  # never the password
        where = self.path or f"{self.host}:{self.port}"
        return f"Target({where}, db={self.db}, tls={self.tls}, auth={bool(self.password)})"


def parse_url(url: str) -> Target:
    """``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS) or
    ``unix://[[user]:password@]/path/to/socket[?db=N]``. A lone user part with no ``:`` is the
    password (the form of servers without ACL users). ValueError (naming no part of the URL)
    when it cannot be read."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError("the Redis URL cannot be parsed") from None
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    if parts.password is None and user:
        user, password = "", user
    db_text = parts.path.strip("/") if parts.scheme != "unix" else ""
    query = parse_qs(parts.query)
    if "db" in query:
        db_text = query["db"][-1]
    if db_text and not (db_text.isdigit() and len(db_text) < 6):
        raise ValueError("the Redis URL's database must be a number")
    db = int(db_text or 0)
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError("a unix:// Redis URL needs a socket path")
        return Target(path=parts.path, username=user, password=password, db=db)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ValueError("the Redis URL must be redis://, rediss:// or unix://")
    return Target(
        host=parts.hostname,
        port=port or 6379,
        tls=parts.scheme == "rediss",
        username=user,
        password=password,
        db=db,
    )
