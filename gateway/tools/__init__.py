"""Server tools the gateway runs itself: web search (:mod:`.web_search`, the whole feature
in one package) against a search engine the operator runs."""
