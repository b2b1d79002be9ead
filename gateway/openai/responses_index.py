"""llama.cpp's Responses stream, given the indices the OpenAI SDKs read (pure).

llama.cpp's ``/v1/responses`` (``tools/server``, observed on the xllamacpp build the demo runs)
sends its events without ``output_index``, ``content_index`` and ``sequence_number``:
``{"type":"response.output_item.added","item":{...}}``, ``{"type":
"response.output_text.delta","item_id":...,"delta":...}``. The OpenAI Python SDK's
``responses.stream()`` keys its snapshot by ``output_index`` and so raises "Duplicate response
output index None" at the second output item (llama.cpp sends a reasoning item, then the
message). :class:`ResponsesIndexer` fills in what is missing: an item's ``output_index`` is
its position among the ``output_item.added`` events (later events find it by ``item_id``, or
by ``item.id``); ``content_index`` counts the item's ``content_part.added`` events (0 for a
reasoning item's text); ``sequence_number`` counts the events. A value the upstream did send
is kept.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ResponsesIndexer"]


class ResponsesIndexer:
    """One per stream: what the next event is missing, from the events before it."""

    __slots__ = ("_items", "_parts", "_sequence")

    def __init__(self) -> None:
        self._items: dict[str, int] = {}  # item id -> output_index
        self._parts: dict[str, int] = {}  # item id -> content parts added so far
        self._sequence = 0

    def __call__(self, event: dict[str, Any]) -> dict[str, Any]:
        kind = event.get("type")
        if not isinstance(kind, str) or not kind.startswith("response."):
            return event
        event.setdefault("sequence_number", self._sequence)
        self._sequence += 1
        item = event.get("item")
        item_id = event.get("item_id")
        if item_id is None and isinstance(item, dict):
            item_id = item.get("id")
        if not isinstance(item_id, str):
            return event
        if kind == "response.output_item.added" and item_id not in self._items:
            self._items[item_id] = len(self._items)
        if item_id in self._items:
            event.setdefault("output_index", self._items[item_id])
        if kind == "response.content_part.added":
            self._parts[item_id] = self._parts.get(item_id, 0) + 1
        if "delta" in event or "part" in event or "text" in event:
            event.setdefault("content_index", max(self._parts.get(item_id, 1) - 1, 0))
        return event
