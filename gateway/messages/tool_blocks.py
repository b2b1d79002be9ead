"""Tool-call blocks of the stream translator: one ``tool_use`` block per upstream call.

Upstream facts: a call is named (``id``, ``function.name``) in its first delta; later
deltas carry only ``index`` and ``function.arguments`` pieces; parallel calls may
interleave by ``index``; Ollama reuses ``index: 0`` for every call, each with a new
``id``. Anthropic requires blocks one at a time, so the first named call streams and
the others are buffered and sent whole, in index order, when its block closes.

``ToolBlocks`` is a mixin of ``StreamTranslator`` and uses its block machinery:
``_open``, ``_close_block``, ``_head``, ``_index``, ``_kind``, and the call registers
``_tool``, ``_calls``, ``_all``, ``_has_tools``, ``dropped_tool_deltas``.
"""

from __future__ import annotations

from typing import Any

from gateway import ids
from gateway.messages import frames


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
    """Mixin: tool-call deltas -> tool_use blocks, streamed or buffered."""

    # provided by the host, StreamTranslator
    _head: bytes
    _index: int
    _kind: int
    _tool: Call | None
    _calls: dict[int, Call]
    _all: list[Call]
    _has_tools: bool
    dropped_tool_deltas: int

    def _open(self, kind: int, shell: bytes, delta: bytes, out: list[bytes]) -> None:
        raise NotImplementedError

    def _close_block(self, out: list[bytes], *, flush: bool) -> None:
        raise NotImplementedError

    def _tool_delta(self, delta: Any, out: list[bytes]) -> None:
        """One upstream tool_calls[] delta (the host checked the state)."""
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
                    self.dropped_tool_deltas += 1
                return
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
            return
        if call.state == CLOSED:
            if args:
                self.dropped_tool_deltas += 1
            return
        if args:
            call.pieces.append(args)
        if call.name is not None and self._tool is None:
            self._close_block(out, flush=True)
            self._open_tool(call, out)
            if call.pieces:
                call.sent = True
                out.append(self._head + frames.jstr("".join(call.pieces)) + frames.DELTA_END)
                call.pieces = []

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

    def _open_tool(self, call: Call, out: list[bytes]) -> None:
        shell = (
            b',"content_block":{"type":"tool_use","id":'
            + frames.jstr(ids.tool_use_id(call.id))
            + b',"name":'
            + frames.jstr(call.name or "")
            + b',"input":{}}}\n\n'
        )
        self._open(TOOL, shell, frames.JSON_DELTA, out)
        call.state = STREAMING
        self._tool = call
        self._has_tools = True

    def _finish_tool(self, out: list[bytes]) -> None:
        call = self._tool
        if call is not None:
            if not call.sent:
                out.append(self._head + frames.EMPTY_INPUT + frames.DELTA_END)
            call.state = CLOSED
            self._tool = None

    def _flush_buffered(self, out: list[bytes]) -> None:
        waiting = [c for c in self._all if c.state == PENDING and c.name is not None]
        waiting.sort(key=lambda c: (c.index, c.seq))
        for call in waiting:
            self._open_tool(call, out)
            if call.pieces:
                call.sent = True
                out.append(self._head + frames.jstr("".join(call.pieces)) + frames.DELTA_END)
                call.pieces = []
            self._finish_tool(out)
            out.append(frames.CB_STOP % self._index)
            self._kind = NONE
