"""Teams on one inference host: named clients, their limits, a fair share of each model and
their usage.

In: the key a request presents (``x-api-key`` or a bearer token) and the config's
``[[clients]]``, ``server.api_keys_env`` and ``[limits]``. Out: the request's
:class:`~gateway.tenancy.clients.Client` (or a 401), its limits' verdict (a 429 with the API's
``anthropic-ratelimit-*`` headers) and, when its reply ends, its usage.

- :mod:`.clients`: keys to clients (one SHA-256 and one dict lookup per request).
- :mod:`.counters`: the counters' interface and the in-process store; :mod:`.redis_counters`
  keeps them in Redis for replicas.
"""
