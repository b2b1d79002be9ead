"""The sign-in's OAuth endpoints, as Claude Code's ``/login`` calls them (RFC 8414, 8628, 7009).

``GET {prefix}/.well-known/oauth-authorization-server``: the metadata; every endpoint on the
origin the request came to (Claude Code uses an endpoint only when it is on the origin it
was given, else falls back to ``{base}/oauth/...``, the same paths).

``POST {prefix}/oauth/device_authorization``: Claude Code posts ``surface=claude_code`` and
nothing else (no ``client_id``, no ``scope``): none is required, unknown fields ignored.
Answer: ``device_code``, ``user_code`` (``XXXX-XXXX``), ``verification_uri`` (the page),
``verification_uri_complete`` (the page with the code filled in), ``expires_in``,
``interval``. Past ``auth.max_pending_codes`` waiting codes, or past
``auth.page_tries_per_minute`` new codes a minute from one address: 429 ``slow_down`` with
``Retry-After`` (Claude Code says the gateway is limiting sign-in attempts).

``POST {prefix}/oauth/token``:

* ``grant_type=urn:ietf:params:oauth:grant-type:device_code``, ``device_code``: 400 with
  ``authorization_pending`` (keep polling), ``slow_down`` (polled sooner than the
  interval; the interval grows by 5 s, as the client's does), ``expired_token``,
  ``invalid_grant`` (no such code, or exchanged already); 200 with ``access_token``,
  ``token_type`` Bearer, ``expires_in``, ``refresh_token`` once approved, and ``email``
  (the protocol's extension: the account that approved the code) when the client has one
  configured (``[[clients]] email``): Claude Code shows it, asks the developer to confirm
  it before storing the credential, and shows it in ``/status``.
* ``grant_type=refresh_token``, ``refresh_token``: 200 with a new pair (the old refresh token
  is spent); 401 ``invalid_grant`` for one expired, unknown, revoked or spent (a spent one
  presented again revokes its whole sign-in: it was copied). Claude Code then forgets the
  refresh token and asks for ``/login`` when the access token expires.

``POST {prefix}/oauth/revoke``: ``token`` (access or refresh): revokes the sign-in it belongs
to (both tokens), 200 whatever the token (RFC 7009 §2.2).

Errors are ``{"error": ..., "error_description": ...}`` (RFC 6749 §5.2), never the
Anthropic envelope. Answers carry ``Cache-Control: no-store``.
"""

from __future__ import annotations

import time

import structlog
from aiohttp import web

from gateway.auth import codes
from gateway.auth.form import origin, read_form
from gateway.auth.service import SIGNIN, SignIn
from gateway.auth.signin_store import Issued
from gateway.batches.schema import StoreError

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
PAGE_PATH = "/oauth/device"
_NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}
_log = structlog.get_logger("gateway.signin")
_USER_CODE_TRIES = 5  # a drawn user code in use: draw again, this many times
_DESCRIPTIONS = {
    "authorization_pending": "The code has not been approved yet",
    "slow_down": "Too many requests: wait longer between them",
    "expired_token": "The device code has expired; start the sign-in again",
    "invalid_grant": "The code or token is not valid",
    "invalid_request": "A required parameter is missing or the body is malformed",
    "unsupported_grant_type": "Only the device code and refresh token grants are supported",
    "temporarily_unavailable": "The sign-in store is unavailable; try again",
}


def oauth_error(code: str, status: int = 400, retry_after: int | None = None) -> web.Response:
    headers = dict(_NO_STORE)
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return web.json_response(
        {"error": code, "error_description": _DESCRIPTIONS.get(code, code)},
        status=status,
        headers=headers,
    )


async def metadata(request: web.Request) -> web.Response:
    signin = request.app[SIGNIN]
    base = origin(request, signin.base_url) + signin.prefix
    return web.json_response(
        {
            "issuer": base,
            "device_authorization_endpoint": f"{base}/oauth/device_authorization",
            "token_endpoint": f"{base}/oauth/token",
            "revocation_endpoint": f"{base}/oauth/revoke",
            "grant_types_supported": [DEVICE_GRANT, "refresh_token"],
            "response_types_supported": [],
            "token_endpoint_auth_methods_supported": ["none"],
            "revocation_endpoint_auth_methods_supported": ["none"],
        },
        headers={"Cache-Control": "no-store"},
    )


async def device_authorization(request: web.Request) -> web.Response:
    signin = request.app[SIGNIN]
    cfg = signin.cfg
    wait = signin.device_throttle.allow(request.remote or "", time.monotonic())
    if wait:
        return oauth_error("slow_down", 429, retry_after=int(wait + 0.999))
    form = await read_form(request)
    if form is None:
        return oauth_error("invalid_request")
    device_code = codes.new_device_code()
    now = time.time()
    try:
        for _ in range(_USER_CODE_TRIES):
            user_code = codes.new_user_code()
            outcome = await signin.store.new_grant(
                codes.digest(device_code),
                user_code,
                now,
                now + cfg.code_seconds,
                cfg.poll_seconds,
                form.get("surface", ""),
                cfg.max_pending_codes,
            )
            if outcome != "taken":
                break
    except StoreError:
        return oauth_error("temporarily_unavailable", 503)
    if outcome == "full":
        return oauth_error("slow_down", 429, retry_after=cfg.poll_seconds * 12)
    if outcome != "ok":
        return oauth_error("temporarily_unavailable", 503)
    signin.count(codes="issued")
    page = origin(request, signin.base_url) + signin.prefix + PAGE_PATH
    shown = codes.shown(user_code)
    return web.json_response(
        {
            "device_code": device_code,
            "user_code": shown,
            "verification_uri": page,
            "verification_uri_complete": f"{page}?user_code={shown}",
            "expires_in": cfg.code_seconds,
            "interval": cfg.poll_seconds,
        },
        headers=_NO_STORE,
    )


def _issue(signin: SignIn, now: float) -> tuple[Issued, str, str]:
    access, refresh = codes.new_access_token(), codes.new_refresh_token()
    issued = Issued(
        access=codes.digest(access),
        access_expires=now + signin.cfg.access_token_seconds,
        refresh=codes.digest(refresh),
        refresh_expires=now + signin.cfg.refresh_token_seconds,
        session=codes.new_session_id(),
    )
    return issued, access, refresh


def _tokens(signin: SignIn, access: str, refresh: str, email: str = "") -> web.Response:
    body: dict[str, object] = {
        "access_token": access,
        "token_type": "Bearer",
        "expires_in": signin.cfg.access_token_seconds,
        "refresh_token": refresh,
    }
    if email:  # the protocol's extension: Claude Code asks to confirm it, shows it in /status
        body["email"] = email
    return web.json_response(body, headers=_NO_STORE)


async def token(request: web.Request) -> web.Response:
    signin = request.app[SIGNIN]
    form = await read_form(request)
    if form is None:
        return oauth_error("invalid_request")
    grant = form.get("grant_type", "")
    now = time.time()
    issued, access, refresh = _issue(signin, now)
    try:
        if grant == DEVICE_GRANT:
            device_code = form.get("device_code", "")
            if not device_code:
                return oauth_error("invalid_request")
            outcome, client = await signin.store.exchange_device_code(
                codes.digest(device_code), now, issued
            )
            if outcome != "ok":
                if outcome == "expired_token":
                    signin.count(codes="expired")
                return oauth_error(outcome)
            _log.info("signin_tokens_issued", client=client)
            signin.count(tokens="issued")
            named = signin.tenants().clients.get(client or "")
            return _tokens(signin, access, refresh, named.email if named is not None else "")
        if grant == "refresh_token":
            presented = form.get("refresh_token", "")
            if not presented:
                return oauth_error("invalid_request")
            tenants = signin.tenants()
            client, revoked = await signin.store.exchange_refresh_token(
                codes.digest(presented), now, issued, lambda name: name in tenants.clients
            )
            if revoked is not None:  # a spent refresh token again, or its client removed
                signin.cache.forget_session(revoked)
                signin.count(tokens="revoked")
                _log.warning("signin_session_revoked", reason="refresh token reused or client gone")
            if client is None:
                # the protocol's deprovisioning answer: the client forgets the refresh token
                return oauth_error("invalid_grant", 401)
            signin.count(tokens="refreshed")
            return _tokens(signin, access, refresh)
    except StoreError:
        return oauth_error("temporarily_unavailable", 503)
    return oauth_error("unsupported_grant_type" if grant else "invalid_request")


async def revoke(request: web.Request) -> web.Response:
    signin = request.app[SIGNIN]
    form = await read_form(request)
    if form is None or not form.get("token"):
        return oauth_error("invalid_request")
    try:
        session = await signin.store.revoke(codes.digest(form["token"]))
    except StoreError:
        return oauth_error("temporarily_unavailable", 503)
    if session is not None:
        signin.cache.forget_session(session)
        signin.count(tokens="revoked")
        _log.info("signin_revoked")
    return web.Response(status=200, headers=_NO_STORE)
