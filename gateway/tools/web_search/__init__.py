"""The web search server tool, run by the gateway: one feature, in one package.

What comes in: a validated Messages request offering a ``web_search_<date>`` tool (with
``[web_search]`` configured), prepared as a :class:`~gateway.messages.call.Call`, and the
first round's open upstream response. What goes out: one Messages reply, streamed (the
rounds' events rewritten into one message) or buffered, its figures in the reply's one
record. The rounds are the server tools' one loop (:mod:`gateway.tools.rounds`, shared with
web fetch): the HTTP shell (:mod:`gateway.http.anthropic`) makes its
:class:`~gateway.tools.rounds.loop.ServerToolsReply` with this package's
:class:`.searches.Searches` as one of its tools.

- :mod:`.searches`: one request's searches (limits, text budget, filters, sealing);
- :mod:`.searxng`: the backend, a SearXNG instance the operator runs (bounded reads);
- :mod:`.citations`: a result's snippet quoted verbatim becomes a cited text block;
- :mod:`.domains`, :mod:`.hosts`: the tool's ``allowed_domains`` / ``blocked_domains``.

What the layers below need of the tool (its definition and validation, its blocks, sealing
and opening results, replaying them into chat turns) is the tool's wire surface, not its
running: it stays in :mod:`gateway.messages.search_blocks`, which validation
(``messages/request``), translation (``messages/to_chat``), the Messages call's restore and
the batch and HTTP shells read; this package sits above ``messages`` and imports it.

Cost per request, besides the upstream rounds and the searches' waits: the round translator
as for any reply; per event the rewriter looks at its frame's prefix and resplices its index
(no JSON decode or encode; text quoted for citations is decoded per delta, once results with
snippets came); per block one decode, as its round ends, of what the next round's request
needs, which is also the buffered reply's content; per search one result block encoded.
Bounded by the tool's ``max_uses`` and ``web_search.max_searches`` (two rounds past them, the
reply pauses), ``max_tokens`` as one budget for all rounds, and the backend's timeout and
response cap.
"""
