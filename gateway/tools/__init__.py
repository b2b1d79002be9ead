"""Server tools the gateway runs itself: web search (:mod:`.web_search`) against a search
engine the operator runs, and web fetch (:mod:`.web_fetch`) of pages the conversation
names; one rounds loop (:mod:`.rounds`) runs both."""
