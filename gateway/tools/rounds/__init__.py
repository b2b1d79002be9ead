"""The rounds loop every server tool the gateway runs shares: web search and web fetch.

One reply with server tools is the Messages call in rounds (:mod:`.loop`), each round's
events rewritten into the reply's one stream (:mod:`.round_events`): a call of a server
tool's function becomes a ``server_tool_use`` block, the tool runs between rounds, its
result block goes to the client and its tool message to the model, and the model is called
again. A request may offer both tools: one loop runs them, a round's calls of either in
the order the model made them, ``max_tokens`` one budget and ``usage.server_tool_use``
counting each tool's requests.

A tool is a :class:`ServerTool`, made per request by its package
(:class:`gateway.tools.web_search.searches.Searches`,
:class:`gateway.tools.web_fetch.fetches.Fetches`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["ServerTool"]


class ServerTool(Protocol):
    """One request's runner of one server tool."""

    @property
    def name(self) -> str:
        """The function the model is offered, and the ``server_tool_use`` block's name."""

    @property
    def result_type(self) -> str:
        """Its result block's ``type`` (``web_search_tool_result``, ...)."""

    @property
    def usage_key(self) -> str:
        """Its count's key in ``usage.server_tool_use`` (``web_search_requests``, ...)."""

    @property
    def limit(self) -> int:
        """Calls it runs in this request; past it each is ``max_uses_exceeded``."""

    @property
    def requests(self) -> int:
        """Calls it ran (the count ``usage.server_tool_use`` reports)."""

    async def run(self, tool_input: Mapping[str, Any]) -> tuple[Any, str]:
        """(the result block's ``content``, the tool message the model gets) for one call."""

    def seen(self, block: Mapping[str, Any]) -> None:
        """A result block of this reply (of any tool), as it is sent."""
