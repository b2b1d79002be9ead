"""The web fetch server tool, run by the gateway (docs/web-fetch.md).

What comes in: a validated Messages request offering a ``web_fetch_<date>`` tool (with
``[web_fetch] enabled``); it is served by the one rounds loop of the server tools
(:mod:`gateway.tools.rounds`), beside web search when the request offers both. What goes
out: per call of the model's ``web_fetch(url)``, a ``server_tool_use`` block and a
``web_fetch_tool_result`` block.

- :mod:`.fetches`: one request's fetches (limit, URL context, filters, documents);
- :mod:`.context`: the URLs the conversation holds, the only ones fetched;
- :mod:`.fetcher_service`: the process's fetcher, its policy from the config, metrics, logs;
- :mod:`.net`: one fetch, safe against the gateway's own network (addresses checked once,
  connections pinned to them, redirects checked again, every byte and second bounded);
- :mod:`.addresses`: which addresses a fetch may reach; :mod:`.inflate`: a body's
  ``Content-Encoding`` undone under a cap;
- :mod:`.extract`: a fetched page's readable text (HTML through selectolax/lexbor, text as is).

The wire surface the layers below read (validation, replay into chat turns) is
:mod:`gateway.messages.fetch_blocks`. The domain filters are web search's
(:mod:`gateway.tools.web_search.domains`), imported.
"""
