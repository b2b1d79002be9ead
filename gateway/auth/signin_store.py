"""The sign-in's tables, in the batches' database (SQLite, or PostgreSQL shared by replicas).

``llm_gateway_auth_grants``: one row per device code not yet exchanged (its SHA-256, the
user code, when it expires, the poll interval and the last poll, ``pending`` or
``approved`` and by which client). ``llm_gateway_auth_tokens``: one row per access or
refresh token (its SHA-256, the client it stands for, its sign-in session, expiry, revoked).
No secret is stored: a database dump signs nobody in.

Every call is one transaction on a worker thread of the store's own (the event loop never
waits on the database); on PostgreSQL the grant and the refresh token being exchanged are
locked (``SELECT ... FOR UPDATE``), on SQLite every write transaction is ``BEGIN
IMMEDIATE``, so a device code or a refresh token is exchanged once whatever the replicas.
Failures are a ``StoreError`` without the password.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gateway.batches.engines import open_engine
from gateway.batches.one_thread import OneThreadStore

__all__ = ["GRANTS", "TOKENS", "AuthStore", "Issued", "TokenRow"]

T = TypeVar("T")

_METADATA = sa.MetaData()
GRANTS = sa.Table(
    "llm_gateway_auth_grants",
    _METADATA,
    sa.Column("device_digest", sa.LargeBinary(32), primary_key=True),
    sa.Column("user_code", sa.Text, nullable=False, unique=True),
    sa.Column("expires_at", sa.Float, nullable=False, index=True),  # epoch seconds
    sa.Column("interval", sa.Integer, nullable=False),
    sa.Column("last_poll", sa.Float, nullable=False, server_default="0"),
    sa.Column("status", sa.Text, nullable=False),  # pending | approved
    sa.Column("client", sa.Text),  # who approved it
    sa.Column("surface", sa.Text, nullable=False, server_default=""),
)
TOKENS = sa.Table(
    "llm_gateway_auth_tokens",
    _METADATA,
    sa.Column("digest", sa.LargeBinary(32), primary_key=True),
    sa.Column("kind", sa.Text, nullable=False),  # access | refresh
    sa.Column("session", sa.Text, nullable=False, index=True),
    sa.Column("client", sa.Text, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False, index=True),
    sa.Column("revoked", sa.Boolean, nullable=False, server_default=sa.false()),
)
_g = GRANTS.c
_t = TOKENS.c
_SCHEMA_LOCK = 0x6C6C6D61  # PostgreSQL advisory lock taken while creating the tables
# an expired grant is kept this long, so a late poll hears expired_token, not invalid_grant
GRANT_GRACE = 600.0
# a slow_down adds this to the grant's interval (RFC 8628 §3.5), as the client does
SLOW_DOWN_STEP = 5
# a poll this much sooner than the interval still counts as on time (network jitter)
POLL_SLACK = 1.0


@dataclass(frozen=True, slots=True)
class TokenRow:
    client: str
    session: str
    expires_at: float
    revoked: bool
    kind: str


@dataclass(frozen=True, slots=True)
class Issued:
    """A new access and refresh token's digests and expiries, inserted by an exchange."""

    access: bytes
    access_expires: float
    refresh: bytes
    refresh_expires: float
    session: str


class AuthStore(OneThreadStore):
    """The sign-in's tables of one database (see the module docstring)."""

    NAME = "auth store"

    @classmethod
    def open(cls, url: str) -> AuthStore:
        store = cls(*open_engine(url))
        store._start()
        return store

    def _setup(self, conn: Connection) -> None:
        if self._pg:
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SCHEMA_LOCK})
        _METADATA.create_all(conn, checkfirst=True)

    def _locked(self, q: Any) -> Any:
        return q.with_for_update() if self._pg else q

    async def new_grant(
        self,
        device_digest: bytes,
        user_code: str,
        now: float,
        expires_at: float,
        interval: int,
        surface: str,
        max_pending: int,
    ) -> str:
        """Insert a grant -> ``ok``; ``full`` (``max_pending`` unexpired grants already),
        ``taken`` (the user code is in use: draw another). Expired ones are purged first."""

        def tx(conn: Connection) -> str:
            conn.execute(GRANTS.delete().where(_g.expires_at < now - GRANT_GRACE))
            conn.execute(TOKENS.delete().where(_t.expires_at < now))
            pending = conn.execute(
                sa.select(sa.func.count()).select_from(GRANTS).where(_g.expires_at > now)
            ).scalar_one()
            if pending >= max_pending:
                return "full"
            if conn.execute(sa.select(_g.user_code).where(_g.user_code == user_code)).first():
                return "taken"
            conn.execute(
                GRANTS.insert().values(
                    device_digest=device_digest,
                    user_code=user_code,
                    expires_at=expires_at,
                    interval=interval,
                    last_poll=0.0,
                    status="pending",
                    client=None,
                    surface=surface[:64],
                )
            )
            return "ok"

        return await self._run("new_grant", tx)

    async def approve(self, user_code: str, client: str, now: float) -> bool:
        """Approve an unexpired pending grant for ``client``; False: no such grant."""

        def tx(conn: Connection) -> bool:
            done = conn.execute(
                GRANTS.update()
                .where(_g.user_code == user_code, _g.status == "pending", _g.expires_at > now)
                .values(status="approved", client=client)
            )
            return done.rowcount == 1

        return await self._run("approve", tx)

    async def exchange_device_code(
        self, device_digest: bytes, now: float, issued: Issued
    ) -> tuple[str, str | None]:
        """One poll of the token endpoint -> (``ok``, client) with ``issued`` inserted and the
        grant gone, or (an RFC 8628 error code, None)."""

        def tx(conn: Connection) -> tuple[str, str | None]:
            q = sa.select(_g.expires_at, _g.interval, _g.last_poll, _g.status, _g.client).where(
                _g.device_digest == device_digest
            )
            row = conn.execute(self._locked(q)).first()
            if row is None:
                return "invalid_grant", None
            if row.expires_at <= now:
                return "expired_token", None
            this = GRANTS.update().where(_g.device_digest == device_digest)
            if row.status == "approved" and row.client is not None:
                conn.execute(GRANTS.delete().where(_g.device_digest == device_digest))
                _insert_tokens(conn, issued, row.client)
                return "ok", row.client
            if now - row.last_poll < row.interval - POLL_SLACK:
                conn.execute(this.values(interval=row.interval + SLOW_DOWN_STEP, last_poll=now))
                return "slow_down", None
            conn.execute(this.values(last_poll=now))
            return "authorization_pending", None

        return await self._run("token", tx)

    async def exchange_refresh_token(
        self, digest: bytes, now: float, issued: Issued, alive: Callable[[str], bool]
    ) -> tuple[str | None, str | None]:
        """Rotate a refresh token -> (client, None) with ``issued`` inserted in the same session
        and the old refresh token revoked; or (None, the revoked session, if any). A refresh
        token presented again after its rotation revokes its whole session (it was copied);
        one whose client is no longer configured (``alive``) too."""

        def tx(conn: Connection) -> tuple[str | None, str | None]:
            q = sa.select(_t.client, _t.session, _t.expires_at, _t.revoked).where(
                _t.digest == digest, _t.kind == "refresh"
            )
            row = conn.execute(self._locked(q)).first()
            if row is None or row.expires_at <= now:
                return None, None
            if row.revoked or not alive(row.client):
                _revoke_session(conn, row.session)
                return None, row.session
            conn.execute(TOKENS.update().where(_t.digest == digest).values(revoked=True))
            _insert_tokens(conn, dataclasses.replace(issued, session=row.session), row.client)
            return row.client, None

        return await self._run("refresh", tx)

    async def lookup(self, digest: bytes) -> TokenRow | None:
        def tx(conn: Connection) -> TokenRow | None:
            row = conn.execute(
                sa.select(_t.client, _t.session, _t.expires_at, _t.revoked, _t.kind).where(
                    _t.digest == digest
                )
            ).first()
            return None if row is None else TokenRow(*row)

        return await self._run("lookup", tx, write=False)

    async def revoke(self, digest: bytes) -> str | None:
        """Revoke the sign-in session of a token (its access and refresh tokens) -> the
        session, or None: no such token."""

        def tx(conn: Connection) -> str | None:
            session = conn.execute(sa.select(_t.session).where(_t.digest == digest)).scalar()
            if session is None:
                return None
            _revoke_session(conn, session)
            return str(session)

        return await self._run("revoke", tx)


def _insert_tokens(conn: Connection, issued: Issued, client: str) -> None:
    conn.execute(
        TOKENS.insert(),
        [
            {
                "digest": issued.access,
                "kind": "access",
                "session": issued.session,
                "client": client,
                "expires_at": issued.access_expires,
                "revoked": False,
            },
            {
                "digest": issued.refresh,
                "kind": "refresh",
                "session": issued.session,
                "client": client,
                "expires_at": issued.refresh_expires,
                "revoked": False,
            },
        ],
    )


def _revoke_session(conn: Connection, session: str) -> None:
    conn.execute(TOKENS.update().where(_t.session == session).values(revoked=True))
