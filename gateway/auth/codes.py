"""The secrets of the sign-in: device codes, user codes and tokens, and their digests.

* ``device_code``: 32 random bytes, base64url (256 bits, RFC 8628 §3.2 asks for opaque and
  single-use); kept only as its SHA-256.
* ``user_code``: 8 letters from a base-20 alphabet without vowels (RFC 8628 §6.1: no words,
  nothing to mistake for a digit), shown ``XXXX-XXXX``; what a person types back is
  normalised (case, dashes and spaces ignored). 20**8 is 2.6e10 codes; with 10 tries a
  minute per address and a code living 10 minutes, a guess succeeds with odds of 1e-8.
* tokens: a prefix saying what they are (``gwat_`` access, ``gwrt_`` refresh) and 32
  random bytes; kept only as their SHA-256. The prefix lets the middleware tell a gateway
  token from a key without a database look-up: an unknown bearer without it is a wrong key
  (401 as ever), one with it is a token the gateway no longer honours (401 with
  ``x-should-retry: false``, so Claude Code asks the developer to sign in at once).
"""

from __future__ import annotations

import hashlib
import secrets

USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"
USER_CODE_LETTERS = 8
ACCESS_PREFIX = "gwat_"
REFRESH_PREFIX = "gwrt_"
_ACCESS_BYTES = ACCESS_PREFIX.encode()
MAX_USER_CODE_INPUT = 64  # characters of a typed code looked at


def digest(secret: str | bytes) -> bytes:
    """The SHA-256 a secret is kept as."""
    raw = secret.encode("utf-8", "surrogateescape") if isinstance(secret, str) else secret
    return hashlib.sha256(raw).digest()


def new_device_code() -> str:
    return secrets.token_urlsafe(32)


def new_user_code() -> str:
    """8 letters, stored and compared without the dash."""
    return "".join(secrets.choice(USER_CODE_ALPHABET) for _ in range(USER_CODE_LETTERS))


def shown(user_code: str) -> str:
    """``BCDFGHJK`` -> ``BCDF-GHJK``."""
    half = len(user_code) // 2
    return f"{user_code[:half]}-{user_code[half:]}"


def normalise_user_code(typed: str) -> str | None:
    """What a person typed -> the stored form, or None when it cannot be a code."""
    letters = "".join(c for c in typed[:MAX_USER_CODE_INPUT].upper() if c not in "- \t")
    if len(letters) != USER_CODE_LETTERS or any(c not in USER_CODE_ALPHABET for c in letters):
        return None
    return letters


def new_access_token() -> str:
    return ACCESS_PREFIX + secrets.token_urlsafe(32)


def new_refresh_token() -> str:
    return REFRESH_PREFIX + secrets.token_urlsafe(32)


def new_session_id() -> str:
    """One sign-in: its access and refresh tokens, revoked together."""
    return secrets.token_hex(16)


def is_access_token(presented: bytes) -> bool:
    return presented.startswith(_ACCESS_BYTES)
