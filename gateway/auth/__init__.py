"""Claude Code's sign-in to the gateway: the gateway protocol's OAuth device flow.

In: a developer's Claude Code (``/login``, or ``claude auth login``) asks for a device code
(RFC 8628), the developer approves it on the verification page with their gateway key (a
``[[clients]]`` key or a ``server.api_keys_env`` key) or, configured, by signing in at an
OpenID Connect provider whose ID token names a ``[[clients]]`` entry (``oidc_*.py``,
``id_token.py``), the client polls the token endpoint
and gets an access token and a refresh token. Out: a bearer token that the middleware maps
to the client whose key approved it, so its limits, fair share and usage apply.

Layer: below the HTTP shell (which wires these routes and asks :class:`SignIn` about an
unknown bearer), above batches (whose database holds the tokens).

Cost per request: none for a request whose credential is a configured key (the middleware
asks here only when the key lookup missed); for a gateway token, one SHA-256 and one dict
lookup while its cache entry is fresh (``auth.cache_seconds``), else one database read off
the event loop.
"""
