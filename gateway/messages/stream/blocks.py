"""Content-block placement for the stream translator: which block is open, its index and the
frame prefix its deltas share; opening and closing blocks, one at a time.

Anthropic facts relied on: blocks come one at a time with indexes 0, 1, 2...; each starts
as an empty shell (``content_block_start``) and ends with one ``content_block_stop``.

Gateway decisions:

- A thinking block always ends with one ``signature_delta`` (the text streamed in it,
  sealed: see :mod:`.signatures`), on the failure path too: partial thinking is still the
  gateway's. Its text is kept while it is open, whether it is shown or not.
- A text block that ends while a tail that may begin a stop sequence is held back
  (:class:`~gateway.messages.stream.stops.StopMatcher`) sends that tail first: it was no stop.
- A tool block's contents are :class:`~gateway.messages.stream.tool_blocks.ToolBlocks`'s; when
  one closes (``flush``), the calls that waited behind it are sent, each a whole block, in
  upstream index order. On the failure path they are not (``flush=False``).

:class:`Blocks` is an object the ``StreamTranslator`` holds; the translator decides when a
block opens or closes (its transitions), this writes the frames. Frames are appended to the
caller's ``out`` list.
"""

from __future__ import annotations

from gateway.messages.from_chat import signatures
from gateway.messages.stream import frames
from gateway.messages.stream.stops import StopMatcher
from gateway.messages.stream.tool_blocks import NONE, TEXT, THINKING, TOOL, StreamedCall, ToolBlocks


class Blocks:
    """The blocks of one streamed message; ``kind`` is the open one's (``NONE``: none)."""

    __slots__ = (
        "_hidden",
        "_key",
        "_stops",
        "_tools",
        "head",
        "index",
        "kind",
        "next_index",
        "thinking",
    )

    def __init__(
        self,
        signing_key: bytes,
        stops: StopMatcher | None,
        tools: ToolBlocks,
        hidden: bool = False,
    ) -> None:
        self._key = signing_key
        self._hidden = hidden  # thinking.display hides the text: signatures sealed
        self._stops = stops
        self._tools = tools
        self.kind = NONE
        self.index = -1
        self.next_index = 0
        self.head = b""  # delta frame prefix of the open block, up to the delta body
        self.thinking: list[str] = []  # the open thinking block's text, for its signature

    def open(self, kind: int, shell: bytes, delta: bytes, out: list[bytes]) -> None:
        index = self.next_index
        self.next_index = index + 1
        number = b"%d" % index
        out.append(frames.CBS + number + shell)
        self.kind = kind
        self.index = index
        self.head = frames.CBD + number + delta

    def close(self, out: list[bytes], *, flush: bool) -> None:
        kind = self.kind
        if kind == NONE:
            return
        if kind == TEXT and self._stops is not None and self._stops.held:
            # the block ends: the held tail was not a stop sequence after all
            out.append(self.head + frames.jstr(self._stops.take_held()) + frames.DELTA_END)
        elif kind == THINKING:
            signature = signatures.for_block(self._key, "".join(self.thinking), self._hidden)
            out.append(
                frames.CBD
                + b"%d" % self.index
                + frames.SIGNATURE_DELTA
                + frames.jstr(signature)
                + frames.DELTA_END
            )
            self.thinking = []
        elif kind == TOOL:
            self._tools.finish(out)
        out.append(frames.CB_STOP % self.index)
        self.kind = NONE
        if kind == TOOL and flush:
            self.flush_waiting(out)

    def open_tool(self, call: StreamedCall, out: list[bytes]) -> None:
        self.open(TOOL, self._tools.shell(call), frames.JSON_DELTA, out)
        self._tools.stream(call, self.head, out)

    def flush_waiting(self, out: list[bytes]) -> None:
        """The calls buffered while another streamed, each a whole block, in index order."""
        tools = self._tools
        for call in tools.waiting():
            self.open_tool(call, out)
            tools.finish(out)
            out.append(frames.CB_STOP % self.index)
            self.kind = NONE
