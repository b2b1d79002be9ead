"""The ID token's signature and claims (gateway/auth/id_token.py), and the login's sealed
state and claim mapping (gateway/auth/oidc_state.py). Tokens are signed here with
``cryptography`` as a provider signs them (JWS compact form, RFC 7515; ECDSA as raw R||S,
RFC 7518 §3.4)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from gateway.auth.id_token import IdTokenError, check_id_token, verify_jws
from gateway.auth.oidc_state import StateKey, browser_matches, challenge, client_for_claims

RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
NOW = 1_800_000_000.0


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _n(value: int, size: int | None = None) -> str:
    return _b64(value.to_bytes(size or (value.bit_length() + 7) // 8, "big"))


def _jwks() -> list[dict[str, Any]]:
    pub = RSA_KEY.public_key().public_numbers()
    ecp = EC_KEY.public_key().public_numbers()
    return [
        {"kty": "RSA", "kid": "r1", "use": "sig", "n": _n(pub.n), "e": _n(pub.e)},
        {"kty": "EC", "kid": "e1", "crv": "P-256", "x": _n(ecp.x, 32), "y": _n(ecp.y, 32)},
    ]


def _sign(alg: str, payload: dict[str, Any], kid: str | None = None) -> str:
    header: dict[str, Any] = {"alg": alg, "typ": "JWT"}
    if kid is not None:
        header["kid"] = kid
    signed = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(payload).encode())}"
    data = signed.encode()
    if alg == "RS256":
        sig = RSA_KEY.sign(data, padding.PKCS1v15(), hashes.SHA256())
    elif alg == "PS256":
        pss = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=32)
        sig = RSA_KEY.sign(data, pss, hashes.SHA256())
    elif alg == "ES256":
        r, s = decode_dss_signature(EC_KEY.sign(data, ec.ECDSA(hashes.SHA256())))
        sig = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    else:
        sig = b"\0" * 32
    return f"{signed}.{_b64(sig)}"


CLAIMS = {"iss": "https://idp", "aud": "gw", "exp": NOW + 300, "iat": NOW, "nonce": "n1"}


@pytest.mark.parametrize(
    ("alg", "kid"), [("RS256", "r1"), ("PS256", "r1"), ("ES256", "e1"), ("ES256", None)]
)
def test_a_token_signed_by_a_listed_key_verifies(alg: str, kid: str | None) -> None:
    claims, known = verify_jws(_sign(alg, CLAIMS, kid), _jwks())
    assert known and claims == CLAIMS
    check_id_token(claims, issuer="https://idp", client_id="gw", nonce="n1", now=NOW)


def _tampered() -> str:
    head, _, sig = _sign("RS256", CLAIMS, "r1").split(".")
    other = _b64(json.dumps({**CLAIMS, "aud": "other"}).encode())
    return f"{head}.{other}.{sig}"


@pytest.mark.parametrize(
    ("token", "said"),
    [
        (_tampered(), "signature does not check"),
        (_sign("none", CLAIMS, "r1"), "algorithm the gateway does not accept"),
        (_sign("HS256", CLAIMS, "r1"), "algorithm the gateway does not accept"),
        ("a.b", "not well formed"),
        ("!!!.e30.x", "not well formed"),
    ],
)
def test_a_token_not_signed_by_the_provider_is_refused(token: str, said: str) -> None:
    with pytest.raises(IdTokenError, match=said):
        verify_jws(token, _jwks())


def test_a_kid_the_set_lacks_says_so_so_the_keys_are_fetched_again() -> None:
    assert verify_jws(_sign("RS256", CLAIMS, "rotated"), _jwks()) == ({}, False)
    # a key of another type under the named kid does not verify either
    with pytest.raises(IdTokenError, match="signature"):
        verify_jws(_sign("ES256", CLAIMS, "r1"), _jwks())


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"iss": "https://evil"}, "another issuer"),
        ({"aud": "other"}, "another client"),
        ({"aud": ["gw", "other"]}, "another client"),  # no azp naming the gateway
        ({"exp": NOW - 61}, "expired"),
        ({"iat": NOW + 3600}, "issue time"),
        ({"nonce": "n2"}, "nonce differs"),
        ({"nonce": None}, "nonce differs"),
    ],
)
def test_each_claim_check(change: dict[str, Any], said: str) -> None:
    claims = {k: v for k, v in {**CLAIMS, **change}.items() if v is not None}
    with pytest.raises(IdTokenError, match=said):
        check_id_token(claims, issuer="https://idp", client_id="gw", nonce="n1", now=NOW)


def test_several_audiences_pass_with_azp_naming_the_gateway() -> None:
    claims = {**CLAIMS, "aud": ["gw", "other"], "azp": "gw"}
    check_id_token(claims, issuer="https://idp", client_id="gw", nonce="n1", now=NOW)


def test_the_state_is_sealed_bound_to_a_browser_and_expires() -> None:
    key = StateKey(b"k" * 32)
    state = key.seal("BCDFGHJK", NOW + 600, "browser-secret")
    login = key.open(state, NOW)
    assert login is not None and login.user_code == "BCDFGHJK"
    assert browser_matches(login, "browser-secret") and not browser_matches(login, "other")
    assert key.open(state, NOW + 601) is None  # expired
    assert StateKey(b"j" * 32).open(state, NOW) is None  # another gateway's key
    body, mac = state.split(".")
    assert key.open(f"{body}x.{mac}", NOW) is None and key.open("junk", NOW) is None
    # verifier and nonce: derived, per login, RFC 7636's 43 characters
    other = key.seal("BCDFGHJK", NOW + 600, "browser-secret")
    assert len(key.verifier(state)) == 43 and key.verifier(state) != key.verifier(other)
    assert key.nonce(state) != key.nonce(other) and key.nonce(state) != key.verifier(state)


def test_pkce_s256_matches_rfc_7636_appendix_b() -> None:
    verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
    assert challenge(verifier) == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


CLIENTS = (("alice", ("alice@x", "a-sub")), ("team", ("devs",)), ("ops", ("devs", "ops")))


@pytest.mark.parametrize(
    ("claims", "claim", "client"),
    [
        ({"email": "alice@x", "email_verified": True}, "email", "alice"),
        ({"email": "alice@x", "email_verified": False}, "email", None),  # unchecked address
        ({"email": "alice@x"}, "email", None),
        ({"sub": "a-sub"}, "sub", "alice"),
        ({"groups": ["ops", "devs"]}, "groups", "team"),  # the first client in config order
        ({"groups": ["ops"]}, "groups", "ops"),
        ({"groups": "ops"}, "groups", "ops"),
        ({"groups": [1, None]}, "groups", None),
        ({"sub": "nobody"}, "sub", None),
        ({}, "sub", None),
    ],
)
def test_the_claim_names_a_client(claims: dict[str, Any], claim: str, client: str | None) -> None:
    assert client_for_claims(claims, claim, CLIENTS) == client
