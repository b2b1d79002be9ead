"""Tool-call blocks of the stream translator: one ``tool_use`` block per upstream call.

Upstream facts: a call is named (``id``, ``function.name``) in its first delta; later
deltas carry only ``index`` and ``function.arguments`` pieces; parallel calls may
interleave by ``index``; Ollama reuses ``index: 0`` for every call, each with a new
``id``. Anthropic requires blocks one at a time, so the first named call streams and
the others are buffered and sent whole, in index order, when its block closes.

``ToolBlocks`` is an object the ``StreamTranslator`` holds: it keeps the calls (which
one streams, which wait, which are closed), checks each delta's shape and writes what
goes inside a ``tool_use`` block (its start's shell, argument deltas, ``{}`` for a call
that sent none). The translator places blocks (indexes, opening, closing, the order
with text and thinking): when :meth:`ToolBlocks.delta` returns a call, the translator
closes its open block and opens that call's (:meth:`ToolBlocks.shell`, then
:meth:`ToolBlocks.stream`); when it closes a tool block it calls
:meth:`ToolBlocks.finish`, then streams the :meth:`ToolBlocks.waiting` calls whole.
Frames are appended to the caller's ``out`` list, as the translator's own are.
"""

from __future__ import annotations

from typing import Any

from gateway.messages import frames
from gateway.text import ids


class Malformed(Exception):
    """A chunk is JSON but not the shape of a chat-completion chunk."""


# block kinds
NONE, TEXT, THINKING, TOOL = 0, 1, 2, 3
# tool call states
PENDING, STREAMING, CLOSED = 0, 1, 2


class Call:
    """One upstream tool call, by arrival."""

    __slots__ = ("id", "index", "name", "pieces", "sent", "seq", "state")

    def __init__(self, index: int, seq: int) -> None:
        self.index = index
        self.seq = seq
        self.id: str | None = None
        self.name: str | None = None
        self.pieces: list[str] = []  # arguments buffered while another call streams
        self.sent = False  # any argument bytes went out
        self.state = PENDING


class ToolBlocks:
    """Tool-call deltas -> the frames of ``tool_use`` blocks, streamed or buffered."""

    __slots__ = ("_all", "_calls", "_head", "_tool", "dropped", "opened")

    def __init__(self) -> None:
        self._tool: Call | None = None  # the call streaming into the open block
        self._calls: dict[int, Call] = {}  # latest call per upstream index
        self._all: list[Call] = []
        self._head = b""  # delta frame prefix of the streaming call's block
        self.opened = False  # a tool_use block was sent
        self.dropped = 0  # argument pieces that could not be delivered

    def delta(self, delta: Any, out: list[bytes]) -> Call | None:
        """One upstream tool_calls[] delta (the translator checked its state).

        Returns a named call whose block must open now (no call is streaming): the
        translator closes its open block, then opens this one.
        """
        if type(delta) is not dict:
            raise Malformed
        index = delta.get("index")
        upstream_id = delta.get("id")
        function = delta.get("function")
        if function is None:
            function = {}
        elif type(function) is not dict:
            raise Malformed
        name = function.get("name")
        args = function.get("arguments")
        if (
            (upstream_id is not None and type(upstream_id) is not str)
            or (name is not None and type(name) is not str)
            or (args is not None and type(args) is not str)
        ):
            raise Malformed
        call = self._find_call(index, upstream_id)
        if call is None:
            if not upstream_id and not name:
                if args:
                    self.dropped += 1
                return None
            call = Call(len(self._all) if type(index) is not int else index, len(self._all))
            self._calls[call.index] = call
            self._all.append(call)
        if upstream_id and call.id is None:
            call.id = upstream_id
        if name and call.name is None:
            call.name = name
        if call.state == STREAMING:
            if args:
                call.sent = True
                out.append(self._head + frames.jstr(args) + frames.DELTA_END)
            return None
        if call.state == CLOSED:
            if args:
                self.dropped += 1
            return None
        if args:
            call.pieces.append(args)
        if call.name is not None and self._tool is None:
            return call
        return None

    def _find_call(self, index: Any, upstream_id: Any) -> Call | None:
        if type(index) is int:
            call = self._calls.get(index)
            if call is not None and upstream_id and call.id and call.id != upstream_id:
                return None  # Ollama: a new call at a reused index
            return call
        if index is not None:
            raise Malformed
        if upstream_id:
            for call in self._all:
                if call.id == upstream_id:
                    return call
            return None
        return self._all[-1] if self._all else None

    @staticmethod
    def shell(call: Call) -> bytes:
        """The ``content_block`` of the call's ``content_block_start``, after its index."""
        return (
            b',"content_block":{"type":"tool_use","id":'
            + frames.jstr(ids.tool_use_id(call.id))
            + b',"name":'
            + frames.jstr(call.name or "")
            + b',"input":{}}}\n\n'
        )

    def stream(self, call: Call, head: bytes, out: list[bytes]) -> None:
        """The call's block was opened (``head``: its delta prefix): it streams from now on,
        starting with the argument pieces it buffered."""
        call.state = STREAMING
        self._tool = call
        self._head = head
        self.opened = True
        if call.pieces:
            call.sent = True
            out.append(head + frames.jstr("".join(call.pieces)) + frames.DELTA_END)
            call.pieces = []

    def finish(self, out: list[bytes]) -> None:
        """The streaming call's block closes: ``{}`` if it sent no argument bytes."""
        call = self._tool
        if call is not None:
            if not call.sent:
                out.append(self._head + frames.EMPTY_INPUT + frames.DELTA_END)
            call.state = CLOSED
            self._tool = None

    def waiting(self) -> list[Call]:
        """The named calls buffered while another streamed, in upstream index order."""
        waiting = [c for c in self._all if c.state == PENDING and c.name is not None]
        waiting.sort(key=lambda c: (c.index, c.seq))
        return waiting

    def drop_unnamed(self) -> None:
        """The stream ends: calls never named cannot be delivered; count their pieces."""
        for call in self._all:
            if call.state == PENDING:
                self.dropped += len(call.pieces)
