"""Server tools the gateway runs itself: web search (:mod:`.web_search`) against a search
engine the operator runs (:mod:`.searxng`), with the tool's domain filters (:mod:`.domains`)."""
