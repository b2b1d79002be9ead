"""The verification page's "Sign in with <provider>": an OpenID Connect login (authorization
code flow with PKCE, ``state`` and ``nonce``) that approves the device code for the client
the ID token names, instead of the developer's key.

``POST {prefix}/oauth/device/oidc`` (the page's second button): the ``user_code`` of the
form and ``csrf``, which must equal the page's ``SameSite=Strict`` cookie (a post from
another site carries no such cookie: a foreign page cannot start a login, with the code it
chose, in a browser already signed in at the provider). Answer: a page that moves on to the
provider's authorization endpoint (a ``<meta>`` refresh and a link: the page allows no
script and sends forms only to itself), with the browser's ``SameSite=Lax`` cookie that
binds the login to this browser (gateway/auth/oidc_state.py).

``GET {prefix}/oauth/device/oidc/callback`` (the ``redirect_uri`` registered at the
provider): ``state`` opened and matched to the browser's cookie, the ``code`` exchanged over
the back channel, the ID token checked, its claim mapped to a ``[[clients]]`` entry
(``auth.oidc_claim``, ``clients[].oidc_values``), the device code approved for it.

Each refusal is a page saying why, with a 4xx (or 502 when the provider failed); the
provider's own words never reach the page, except an OAuth error code from the fixed list.
Both routes count against the page's tries per address.
"""

from __future__ import annotations

import html
import secrets
import time

import structlog
from aiohttp import web

from gateway.auth import codes
from gateway.auth.form import origin, read_form
from gateway.auth.oidc_client import OidcFailed
from gateway.auth.oidc_state import browser_matches, challenge, client_for_claims
from gateway.auth.page import (
    CSRF_COOKIE,
    OIDC_START_PATH,
    form_page,
    guard,
    refusal,
    render,
    set_cookie,
    signed_in,
)
from gateway.auth.service import SIGNIN, SignIn
from gateway.batches.schema import StoreError

__all__ = ["CALLBACK_PATH", "START_PATH", "callback", "start"]

START_PATH = OIDC_START_PATH
CALLBACK_PATH = OIDC_START_PATH + "/callback"
LOGIN_COOKIE = "gw_signin_oidc"
# OAuth 2.0 §4.1.2.1's error codes: shown as they are; anything else is not echoed
_PROVIDER_ERRORS = frozenset(
    {
        "access_denied",
        "consent_required",
        "interaction_required",
        "invalid_request",
        "invalid_scope",
        "login_required",
        "server_error",
        "temporarily_unavailable",
        "unauthorized_client",
        "unsupported_response_type",
    }
)
_log = structlog.get_logger("gateway.signin")


def redirect_uri(request: web.Request, signin: SignIn) -> str:
    return origin(request, signin.base_url) + signin.prefix + CALLBACK_PATH


async def start(request: web.Request) -> web.Response:
    signin = request.app[SIGNIN]
    oidc = signin.oidc
    assert oidc is not None, "routed only with auth.oidc_issuer"
    refused = guard(request, signin)
    if refused is not None:
        return refused
    fields = await read_form(request)
    if fields is None:
        return form_page(request, signin, "", "The form could not be read.", status=400)
    cookie = request.cookies.get(CSRF_COOKIE, "")
    sent = fields.get("csrf", "")
    if not cookie or not secrets.compare_digest(cookie.encode(), sent.encode()):
        return refusal(
            "This sign-in was not started from the gateway's own page in this browser. "
            "Open the sign-in link from your terminal again."
        )
    code = codes.normalise_user_code(fields.get("user_code", ""))
    if code is None:
        return form_page(
            request, signin, "", "Enter the code your terminal shows, then sign in.", status=400
        )
    browser = secrets.token_urlsafe(24)
    lifetime = signin.cfg.code_seconds
    state = signin.oidc_key.seal(code, time.time() + lifetime, browser)
    verifier = signin.oidc_key.verifier(state)
    try:
        url = await oidc.authorization_url(
            state, signin.oidc_key.nonce(state), challenge(verifier), redirect_uri(request, signin)
        )
    except OidcFailed as e:
        return refusal(str(e), status=502, title="Sign-in unavailable")
    link = html.escape(url)
    resp = render(
        f"Continuing to {oidc.name}",
        f"<p>Taking you to {html.escape(oidc.name)} to sign in. If nothing happens, "
        f'<a id="continue" href="{link}">continue</a>.</p>',
        head=f'<meta http-equiv="refresh" content="0;url={link}">',
    )
    set_cookie(request, signin, resp, LOGIN_COOKIE, browser, "Lax", lifetime)
    return resp


async def callback(request: web.Request) -> web.Response:
    signin = request.app[SIGNIN]
    oidc = signin.oidc
    assert oidc is not None, "routed only with auth.oidc_issuer"
    refused = guard(request, signin, post=False)
    if refused is not None:
        return refused
    q = request.query
    login = signin.oidc_key.open(q.get("state", ""), time.time())
    if login is None:
        return refusal(
            "This sign-in link is not valid or has expired. Start again from the link your "
            "terminal shows.",
            status=400,
        )
    if not browser_matches(login, request.cookies.get(LOGIN_COOKIE, "")):
        return refusal(
            "This sign-in was started in another browser. Finish it in the browser where "
            "you pressed the button."
        )
    error = q.get("error")
    if error is not None:
        said = f" ({error})" if error in _PROVIDER_ERRORS else ""
        return refusal(f"{oidc.name} did not sign you in{said}.")
    code = q.get("code", "")
    if not code or len(code) > 4096:
        return refusal("The identity provider sent no authorization code.", status=400)
    state = q["state"]
    try:
        claims = await oidc.redeem(
            code,
            signin.oidc_key.verifier(state),
            redirect_uri(request, signin),
            signin.oidc_key.nonce(state),
        )
    except OidcFailed as e:
        return refusal(str(e), status=502, title="Sign-in failed")
    claim = signin.cfg.oidc_claim
    tenants = signin.tenants()
    client = client_for_claims(claims, claim, tenants.oidc_values)
    if client is None or client not in tenants.clients:
        _log.info("signin_oidc_unmapped", claim=claim, remote=request.remote)
        shown = claims.get(claim)
        who = f" as {shown}" if isinstance(shown, str) and len(shown) <= 256 else ""
        return refusal(
            f"You signed in{who}, but this gateway has no client for that account "
            f"(its {claim!r} claim). Ask the gateway's operator to add it."
        )
    try:
        approved = await signin.store.approve(login.user_code, client, time.time())
    except StoreError:
        return refusal(
            "The gateway could not record the approval. Try again.", status=503, title="Try again"
        )
    if not approved:
        signin.count(codes="denied")
        return refusal(
            "The code is no longer waiting: it expired or was used. Start the sign-in again "
            "in your terminal.",
            status=400,
        )
    signin.count(codes="approved")
    _log.info("signin_approved", client=client, via="oidc", remote=request.remote)
    resp = signed_in(login.user_code, client)
    resp.del_cookie(LOGIN_COOKIE, path=signin.prefix + "/oauth/device")
    return resp
