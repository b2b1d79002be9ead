"""The web fetch server tool, run by the gateway.

- :mod:`.net`: one fetch, safe against the gateway's own network (addresses checked once,
  connections pinned to them, redirects checked again, every byte and second bounded);
- :mod:`.addresses`: which addresses a fetch may reach; :mod:`.inflate`: a body's
  ``Content-Encoding`` undone under a cap;
- :mod:`.extract`: a fetched page's readable text (HTML through selectolax/lexbor, text as is).
"""
