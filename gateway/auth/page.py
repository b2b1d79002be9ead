"""The verification page a developer opens to approve a sign-in: ``GET``/``POST
{prefix}/oauth/device``, server-rendered HTML, no script.

``GET`` shows a form of two fields, the user code (filled in from ``?user_code=`` when the
client's link carried it) and the developer's gateway key (a ``[[clients]]`` key or a
``server.api_keys_env`` key). Nothing is ever submitted without the developer pressing the
button (RFC 8628 §5.4: a link carrying someone else's code must not approve it unseen), and
the page says to go on only with the code their own terminal shows.

``POST`` approves the code for the key's client. A wrong key and an unknown, expired or
already-used code get one and the same answer (400), so the page tells a guesser nothing of
which half was wrong. Each address may submit ``auth.page_tries_per_minute`` times a minute
(RFC 8628 §5.1); past that 429 with ``Retry-After``.

With ``auth.oidc_issuer`` the form has a second button, "Sign in with <provider>"
(gateway/auth/oidc_page.py), and the page then sets one cookie (``SameSite=Strict``,
``HttpOnly``) that the button posts back, since that path carries no secret of its own.

Cross-site requests: the key form carries its own secret, the key. It sets no cookie and
honours none, so a page elsewhere that posts to it cannot approve anything without the
developer's key, which it does not have; and approving someone else's code with one's own
key needs the code only the other person's terminal shows. A ``POST`` whose ``Origin`` names
another host is refused anyway, and the pages forbid framing (``frame-ancestors 'none'``,
``X-Frame-Options``) and sending the form elsewhere (``form-action 'self'``). Everything
echoed is HTML-escaped.
"""

from __future__ import annotations

import html
import re
import secrets
import time
from urllib.parse import urlsplit

import structlog
from aiohttp import web

from gateway.auth import codes
from gateway.auth.form import read_form
from gateway.auth.service import SIGNIN, SignIn
from gateway.batches.schema import StoreError

_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_log = structlog.get_logger("gateway.signin")
_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:32rem;margin:3rem auto;padding:0 1rem}"
    "label{display:block;margin-top:1rem}input{font-size:1.1rem;width:100%;padding:.4rem}"
    "button{margin-top:1.2rem;font-size:1.1rem;padding:.5rem 1.2rem}"
    ".code{font-family:monospace;letter-spacing:.1em}.err{color:#a00}.ok{color:#060}"
)
CSRF_COOKIE = "gw_signin_csrf"
OIDC_START_PATH = "/oauth/device/oidc"  # gateway/auth/oidc_page.py
_CSRF_SHAPE = re.compile(r"[A-Za-z0-9_-]{32}")
REJECTED = "That code and key were not accepted. Check both and try again."


def render(
    title: str, body: str, status: int = 200, retry_after: int | None = None, head: str = ""
) -> web.Response:
    """One page of the sign-in: ``body`` (HTML, escaped by the caller) under ``title``."""
    headers = dict(_HEADERS)
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    text = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"{head}<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{body}</body></html>"
    )
    return web.Response(
        text=text, status=status, content_type="text/html", charset="utf-8", headers=headers
    )


def form(signin: SignIn, user_code: str, message: str = "", csrf: str = "") -> str:
    """The form: the code and the key, and with ``auth.oidc_issuer`` a second button that
    signs in with the provider instead (posting the code and ``csrf``, the value of the
    page's cookie, to gateway/auth/oidc_page.py)."""
    note = f'<p class="err">{html.escape(message)}</p>' if message else ""
    action = html.escape(signin.prefix + "/oauth/device")
    oidc = ""
    if signin.oidc is not None:
        oidc = (
            f'<input type="hidden" name="csrf" value="{html.escape(csrf)}">'
            '<p class="or">or, instead of a key:</p>'
            f'<button type="submit" id="oidc" name="via" value="oidc" formnovalidate '
            f'formaction="{html.escape(signin.prefix + OIDC_START_PATH)}">'
            f"Sign in with {html.escape(signin.oidc.name)}</button>"
        )
    return (
        f"{note}<p>Claude Code is asking to sign in to this gateway. Continue only if you "
        "started the sign-in yourself and the code below is the one your own terminal "
        "shows.</p>"
        f'<form method="post" action="{action}">'
        '<label for="user_code">Code</label>'
        f'<input id="user_code" name="user_code" class="code" value="{html.escape(user_code)}" '
        'autocomplete="off" autocapitalize="characters" spellcheck="false" required>'
        '<label for="key">Your gateway key</label>'
        '<input id="key" name="key" type="password" autocomplete="off" required>'
        '<button type="submit" id="approve">Approve sign-in</button>'
        f"{oidc}</form>"
    )


def _prefill(raw: str) -> str:
    """The code of ``?user_code=`` as it will be shown: normalised, or nothing."""
    code = codes.normalise_user_code(raw)
    return codes.shown(code) if code else ""


def form_page(
    request: web.Request, signin: SignIn, user_code: str, message: str = "", status: int = 200
) -> web.Response:
    """The page of the form, with the cookie its provider button needs (``auth.oidc_issuer``:
    ``SameSite=Strict``, so a post from another site does not carry it; without a provider
    the page sets no cookie at all)."""
    csrf = ""
    if signin.oidc is not None:
        csrf = request.cookies.get(CSRF_COOKIE, "")
        if not _CSRF_SHAPE.fullmatch(csrf):
            csrf = secrets.token_urlsafe(24)
    resp = render("Sign in to the gateway", form(signin, user_code, message, csrf), status=status)
    if csrf:
        set_cookie(request, signin, resp, CSRF_COOKIE, csrf, "Strict", None)
    return resp


def set_cookie(
    request: web.Request,
    signin: SignIn,
    resp: web.Response,
    name: str,
    value: str,
    samesite: str,
    max_age: int | None,
) -> None:
    secure = request.secure or signin.base_url.startswith("https:")
    resp.set_cookie(
        name,
        value,
        path=signin.prefix + "/oauth/device",
        httponly=True,
        secure=secure,
        samesite=samesite,
        max_age=max_age,
    )


async def show(request: web.Request) -> web.Response:
    signin = request.app[SIGNIN]
    return form_page(request, signin, _prefill(request.query.get("user_code", "")))


def cross_site(request: web.Request, signin: SignIn) -> bool:
    """An ``Origin`` naming another host (absent or ``null``: a browser's own form post
    under ``Referrer-Policy: no-referrer``, or no browser)."""
    sent = request.headers.get("Origin")
    if not sent or sent == "null":
        return False
    host = urlsplit(sent).netloc
    return host not in (request.host, urlsplit(signin.base_url).netloc)


async def approve(request: web.Request) -> web.Response:
    signin = request.app[SIGNIN]
    refused = guard(request, signin)
    if refused is not None:
        return refused
    fields = await read_form(request)
    if fields is None:
        return form_page(request, signin, "", REJECTED, status=400)
    typed = fields.get("user_code", "")
    code = codes.normalise_user_code(typed)
    key = fields.get("key", "").strip()
    client = signin.tenants().identify(key.encode("utf-8", "surrogateescape")) if key else None
    approved = False
    if code is not None and client is not None:
        try:
            approved = await signin.store.approve(code, client.name, time.time())
        except StoreError:
            return render(
                "Try again",
                '<p class="err">The gateway could not record the approval. Try again.</p>',
                status=503,
            )
    if not approved:
        signin.count(codes="denied")
        _log.info("signin_refused", remote=request.remote)
        return form_page(request, signin, _prefill(typed), REJECTED, status=400)
    signin.count(codes="approved")
    _log.info("signin_approved", client=client.name if client else None, remote=request.remote)
    return signed_in(code or "", client.name if client else "")


def signed_in(code: str, client: str) -> web.Response:
    return render(
        "Signed in",
        f'<p class="ok">The code <span class="code">{html.escape(codes.shown(code))}'
        f"</span> is approved for the client {html.escape(client)}. "
        "Return to your terminal: Claude Code finishes the sign-in by itself within a few "
        "seconds. You can close this page.</p>",
    )


def guard(request: web.Request, signin: SignIn, post: bool = True) -> web.Response | None:
    """The page's refusals before anything is read: too many tries from this address (each
    call counts one), a post from another site; None: go on."""
    wait = signin.throttle.allow(request.remote or "", time.monotonic())
    if wait:
        return render(
            "Too many tries",
            '<p class="err">Too many tries from this address. Wait a minute and try again.</p>',
            status=429,
            retry_after=int(wait + 0.999),
        )
    if post and cross_site(request, signin):
        return refusal(
            "This request came from another site. Open the sign-in link from your terminal "
            "directly."
        )
    return None


def refusal(why: str, status: int = 403, title: str = "Request refused") -> web.Response:
    """A page saying why the sign-in did not happen (``why`` is plain text)."""
    return render(title, f'<p class="err">{html.escape(why)}</p>', status=status)
