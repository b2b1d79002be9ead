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

Cross-site requests: the form carries its own secret, the key. The page sets no cookie and
honours none, so a page elsewhere that posts to it cannot approve anything without the
developer's key, which it does not have; and approving someone else's code with one's own
key needs the code only the other person's terminal shows. A ``POST`` whose ``Origin`` names
another host is refused anyway, and the pages forbid framing (``frame-ancestors 'none'``,
``X-Frame-Options``) and sending the form elsewhere (``form-action 'self'``). Everything
echoed is HTML-escaped.
"""

from __future__ import annotations

import html
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
REJECTED = "That code and key were not accepted. Check both and try again."


def _page(title: str, body: str, status: int = 200, retry_after: int | None = None) -> web.Response:
    headers = dict(_HEADERS)
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    text = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{body}</body></html>"
    )
    return web.Response(
        text=text, status=status, content_type="text/html", charset="utf-8", headers=headers
    )


def _form(signin: SignIn, user_code: str, message: str = "") -> str:
    note = f'<p class="err">{html.escape(message)}</p>' if message else ""
    action = html.escape(signin.prefix + "/oauth/device")
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
        '<button type="submit">Approve sign-in</button></form>'
    )


def _prefill(raw: str) -> str:
    """The code of ``?user_code=`` as it will be shown: normalised, or nothing."""
    code = codes.normalise_user_code(raw)
    return codes.shown(code) if code else ""


async def show(request: web.Request) -> web.Response:
    signin = request.app[SIGNIN]
    return _page(
        "Sign in to the gateway", _form(signin, _prefill(request.query.get("user_code", "")))
    )


def _cross_site(request: web.Request, signin: SignIn) -> bool:
    """An ``Origin`` naming another host (absent or ``null``: a browser's own form post
    under ``Referrer-Policy: no-referrer``, or no browser)."""
    sent = request.headers.get("Origin")
    if not sent or sent == "null":
        return False
    host = urlsplit(sent).netloc
    return host not in (request.host, urlsplit(signin.base_url).netloc)


async def approve(request: web.Request) -> web.Response:
    signin = request.app[SIGNIN]
    wait = signin.throttle.allow(request.remote or "", time.monotonic())
    if wait:
        return _page(
            "Too many tries",
            '<p class="err">Too many tries from this address. Wait a minute and try again.</p>',
            status=429,
            retry_after=int(wait + 0.999),
        )
    if _cross_site(request, signin):
        return _page(
            "Request refused",
            '<p class="err">This request came from another site. Open the sign-in link '
            "from your terminal directly.</p>",
            status=403,
        )
    form = await read_form(request)
    if form is None:
        return _page("Sign in to the gateway", _form(signin, "", REJECTED), status=400)
    typed = form.get("user_code", "")
    code = codes.normalise_user_code(typed)
    key = form.get("key", "").strip()
    client = signin.tenants().identify(key.encode("utf-8", "surrogateescape")) if key else None
    approved = False
    if code is not None and client is not None:
        try:
            approved = await signin.store.approve(code, client.name, time.time())
        except StoreError:
            return _page(
                "Try again",
                '<p class="err">The gateway could not record the approval. Try again.</p>',
                status=503,
            )
    if not approved:
        signin.count(codes="denied")
        _log.info("signin_refused", remote=request.remote)
        return _page("Sign in to the gateway", _form(signin, _prefill(typed), REJECTED), status=400)
    signin.count(codes="approved")
    _log.info("signin_approved", client=client.name if client else None, remote=request.remote)
    return _page(
        "Signed in",
        f'<p class="ok">The code <span class="code">{html.escape(codes.shown(code or ""))}'
        f"</span> is approved for the client {html.escape(client.name if client else '')}. "
        "Return to your terminal: Claude Code finishes the sign-in by itself within a few "
        "seconds. You can close this page.</p>",
    )
