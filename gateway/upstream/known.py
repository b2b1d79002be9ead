"""Every secret the process knows, gathered once at app start for the one scrubber.

Upstream error text (a status reply's body, an in-band error) reaches a client only through
:func:`gateway.errors.from_upstream`, which scrubs it with the :class:`Redactor` built here:

* every upstream's key, in every form (:func:`gateway.text.redact.secrets_of`); these also
  go from relayed pass-through bytes;
* for error text only: the clients' keys (``server.api_keys``, ``[[clients]]``'s,
  ``server.admin_keys``; a reload's new ones too: :meth:`Redactor.adopt`), the signing keys (as text
  when printable, and in hex: the form the ``--workers`` supervisor shares), the batch
  database's URL, the web search backend's URL;
* every upstream's host names, ``host:port`` and base URLs (a DNS upstream's name; the
  addresses it resolves to are the answering client's ``hosts``).

Facts relied on: an upstream sees only its own key, but several may sit behind one proxy
(one can quote another's); no key of the gateway's own is sent upstream, yet a prompt may
hold one and an engine's error may quote the prompt.
"""

from __future__ import annotations

from collections.abc import Iterator

from gateway.ops.config import Config
from gateway.text.redact import Redactor, key_forms, secrets_of
from gateway.upstream.members import hosts_of

__all__ = ["known_secrets"]


def known_secrets(config: Config) -> Redactor:
    """The redactor of every secret and upstream host ``config`` holds."""
    upstreams = config.upstreams.values()
    return Redactor(
        (s for cfg in upstreams for s in secrets_of(cfg)),
        text_only=_own(config),
        hosts=hosts_of(url for cfg in upstreams for url in cfg.replica_urls),
    )


def _own(config: Config) -> Iterator[str]:
    """The gateway's own secrets, in the forms a text could hold them."""
    server = config.server
    for key in (*server.api_keys, *server.admin_keys, *(c.key for c in config.clients if c.key)):
        yield from key_forms(key)
    for signing in (server.signing_key, *server.previous_signing_keys):
        if not signing:
            continue
        yield signing.hex()
        text = signing.decode("ascii", "replace")
        if text.isprintable() and "\ufffd" not in text:
            yield from key_forms(text)
    if config.batches.database_url:
        yield config.batches.database_url
    if config.web_search is not None and config.web_search.searxng_url:
        yield config.web_search.searxng_url
    if config.auth.oidc_client_secret:
        yield from key_forms(config.auth.oidc_client_secret)
    if config.telemetry is not None:  # the collector's headers hold its key
        for _, value in config.telemetry.headers:
            token = value.rsplit(" ", 1)[-1]  # "Bearer KEY": the key alone too
            for text in {value, token}:
                if len(text) >= 8:
                    yield from key_forms(text)
