"""An OpenID Connect ID token checked (pure): its JWS signature against the provider's JSON
Web Key Set, then its claims (OpenID Connect Core 1.0 §3.1.3.7).

The token is a JWS in compact form, ``BASE64URL(header).BASE64URL(payload).BASE64URL(sig)``
(RFC 7515 §7.1). Accepted algorithms (RFC 7518 §3): ``RS256/384/512`` (RSASSA-PKCS1-v1_5),
``PS256/384/512`` (RSASSA-PSS, salt as long as the hash) and ``ES256/384/512`` (ECDSA, the
signature the raw ``R || S`` of the curve's size, not DER). ``none`` and the HMAC family are
refused: a key shared with the client is no proof of the provider. The key is the JWK whose
``kid`` the header names (RFC 7517 §4.5); a header without ``kid`` tries every key of the
algorithm's type. A key marked ``use`` other than ``sig``, or ``alg`` other than the header's,
is not used.

Claims: ``iss`` equal to the configured issuer; ``aud`` the client id, or a list holding it,
then ``azp`` the client id when others are listed; ``exp`` in the future and ``iat`` present
(a minute of clock skew allowed); ``nonce`` equal to the one the login sent. Each refusal is an
:class:`IdTokenError` whose text is safe to show (it names the check, never the token).

Cost: one signature check (RSA: microseconds; ECDSA: about 0.1 ms) per sign-in.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

__all__ = ["IdTokenError", "check_id_token", "verify_jws"]

LEEWAY = 60.0  # seconds of clock skew between the gateway and the provider
MAX_TOKEN_CHARS = 64 * 1024
_HASHES: dict[str, type[hashes.HashAlgorithm]] = {
    "256": hashes.SHA256,
    "384": hashes.SHA384,
    "512": hashes.SHA512,
}
_CURVES: dict[str, tuple[str, type[ec.EllipticCurve], int]] = {
    "ES256": ("P-256", ec.SECP256R1, 32),
    "ES384": ("P-384", ec.SECP384R1, 48),
    "ES512": ("P-521", ec.SECP521R1, 66),
}
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", *_CURVES)


class IdTokenError(Exception):
    """The ID token is not accepted; the text says which check failed."""


def _b64(part: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        raise IdTokenError("the ID token is not well formed") from None


def _json(part: str) -> dict[str, Any]:
    try:
        value = json.loads(_b64(part))
    except (UnicodeDecodeError, ValueError):
        raise IdTokenError("the ID token is not well formed") from None
    if not isinstance(value, dict):
        raise IdTokenError("the ID token is not well formed")
    return value


def _int(jwk: Mapping[str, Any], name: str) -> int:
    value = jwk.get(name)
    if not isinstance(value, str) or not value:
        raise ValueError(name)
    return int.from_bytes(_b64(value), "big")


def _verify_one(alg: str, jwk: Mapping[str, Any], signed: bytes, sig: bytes) -> bool:
    """The signature checks with this key (False: it does not, or the key is unusable)."""
    digest = _HASHES[alg[2:]]()
    try:
        if alg[:2] in ("RS", "PS"):
            if jwk.get("kty") != "RSA":
                return False
            rsa_key = rsa.RSAPublicNumbers(_int(jwk, "e"), _int(jwk, "n")).public_key()
            if rsa_key.key_size < 2048:
                return False
            pad: padding.AsymmetricPadding = (
                padding.PKCS1v15()
                if alg[:2] == "RS"
                else padding.PSS(mgf=padding.MGF1(digest), salt_length=digest.digest_size)
            )
            rsa_key.verify(sig, signed, pad, digest)
            return True
        crv, curve, size = _CURVES[alg]
        if jwk.get("kty") != "EC" or jwk.get("crv") != crv or len(sig) != 2 * size:
            return False
        ec_key = ec.EllipticCurvePublicNumbers(_int(jwk, "x"), _int(jwk, "y"), curve()).public_key()
        r = int.from_bytes(sig[:size], "big")
        s = int.from_bytes(sig[size:], "big")
        ec_key.verify(encode_dss_signature(r, s), signed, ec.ECDSA(digest))
        return True
    except (InvalidSignature, ValueError, TypeError, IdTokenError):
        return False


def verify_jws(token: str, keys: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], bool]:
    """(payload, known_kid): the payload of a compact JWS whose signature one of ``keys``
    checks. ``known_kid`` False means the header named a key the set does not hold (the
    provider may have rotated: fetch its keys again)."""
    if len(token) > MAX_TOKEN_CHARS or token.count(".") != 2:
        raise IdTokenError("the ID token is not well formed")
    head, body, sig = token.split(".")
    header = _json(head)
    alg = header.get("alg")
    if alg not in ALGORITHMS:
        raise IdTokenError("the ID token is signed with an algorithm the gateway does not accept")
    kid = header.get("kid")
    usable = [
        k
        for k in keys
        if isinstance(k, Mapping)
        and k.get("use", "sig") == "sig"
        and k.get("alg", alg) == alg
        and (kid is None or k.get("kid") == kid)
    ]
    if not usable:
        return {}, False
    signed = f"{head}.{body}".encode("ascii", "replace")
    raw = _b64(sig)
    if not any(_verify_one(alg, k, signed, raw) for k in usable):
        raise IdTokenError("the ID token's signature does not check with the provider's keys")
    return _json(body), True


def check_id_token(
    claims: Mapping[str, Any], *, issuer: str, client_id: str, nonce: str, now: float
) -> None:
    """The claims of a verified ID token, checked (OpenID Connect Core §3.1.3.7)."""
    if claims.get("iss") != issuer:
        raise IdTokenError("the ID token was issued by another issuer")
    aud = claims.get("aud")
    auds = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if client_id not in auds:
        raise IdTokenError("the ID token is meant for another client")
    if len(auds) > 1 and claims.get("azp") != client_id:
        raise IdTokenError("the ID token is meant for another client")
    exp = claims.get("exp")
    if not isinstance(exp, int | float) or isinstance(exp, bool) or exp + LEEWAY <= now:
        raise IdTokenError("the ID token has expired")
    iat = claims.get("iat")
    if not isinstance(iat, int | float) or isinstance(iat, bool) or iat - LEEWAY > now:
        raise IdTokenError("the ID token's issue time is missing or in the future")
    sent = claims.get("nonce")
    if not isinstance(sent, str) or not hmac.compare_digest(sent.encode(), nonce.encode()):
        raise IdTokenError("the ID token does not answer this sign-in (its nonce differs)")
