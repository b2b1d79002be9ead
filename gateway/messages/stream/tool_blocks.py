"""Tool-call blocks of the stream translator: one ``tool_use`` block per upstream call.

Upstream facts: a call is named (``id``, ``function.name``) in its first delta; later
deltas carry only ``index`` and ``function.arguments`` pieces; parallel calls may
interleave by ``index``; Ollama reuses ``index: 0`` for every call, each with a new
``id``. Anthropic requires blocks one at a time, so the first named call's block opens
at once and the others wait, in index order, until it closes.

A call's arguments are held until its block closes and then sent as one
``input_json_delta``: local models write arguments that are not JSON (a trailing comma,
Python literals, a cut by ``max_tokens``), and only the whole can be repaired
(:mod:`gateway.local.tool_args`, within one repair budget for the reply) into the object
the buffered reply carries too. What it
costs a client: the block's start still comes at once, the arguments at its end instead of
piece by piece (SDKs build ``input`` at the block's end either way).

``ToolBlocks`` is an object the ``StreamTranslator`` holds: it keeps the calls (which
one has the open block, which wait, which are closed), checks each delta's shape and writes what
goes inside a ``tool_use`` block (its start's shell, its arguments, ``{}`` for a call
that sent none). The translator places blocks (indexes, opening, closing, the order
with text and thinking): when :meth:`ToolBlocks.delta` returns a call, the translator
closes its open block and opens that call's (:meth:`ToolBlocks.shell`, then
:meth:`ToolBlocks.stream`); when it closes a tool block it calls
:meth:`ToolBlocks.finish`, then sends the :meth:`ToolBlocks.waiting` calls, each a whole
block.
Frames are appended to the caller's ``out`` list, as the translator's own are.
"""

from __future__ import annotations

from typing import Any

from gateway.local.tool_args import RepairBudget, repair_arguments
from gateway.messages.stream import frames
from gateway.text import ids, jsonutil


class Malformed(Exception):
    """A chunk is JSON but not the shape of a chat-completion chunk."""


# A call's arguments are held until its block closes (so they can be repaired): at most this
# much per call; past it the stream ends as malformed.
MAX_HELD_ARGUMENTS = 16 * 1024 * 1024

# block kinds
NONE, TEXT, THINKING, TOOL = 0, 1, 2, 3
# tool call states
PENDING, STREAMING, CLOSED = 0, 1, 2


class StreamedCall:
    """One upstream tool call, by arrival."""

    __slots__ = ("held", "id", "index", "name", "pieces", "seq", "state")

    def __init__(self, index: int, seq: int) -> None:
        self.index = index
        self.seq = seq
        self.id: str | None = None
        self.name: str | None = None
        self.pieces: list[str] = []  # its arguments so far: sent whole when its block closes
        self.held = 0  # their length
        self.state = PENDING


class ToolBlocks:
    """Tool-call deltas -> the frames of ``tool_use`` blocks, arguments held and sent whole."""

    __slots__ = (
        "_all",
        "_budget",
        "_calls",
        "_head",
        "_tool",
        "dropped",
        "opened",
        "repaired",
        "unrepairable",
    )

    def __init__(self) -> None:
        self._tool: StreamedCall | None = None  # the call streaming into the open block
        self._calls: dict[int, StreamedCall] = {}  # latest call per upstream index
        self._all: list[StreamedCall] = []
        self._head = b""  # delta frame prefix of the streaming call's block
        self.opened = False  # a tool_use block was sent
        self.dropped = 0  # argument pieces that could not be delivered
        self.repaired = 0  # calls whose arguments were not a JSON object, repaired
        self.unrepairable = 0  # calls whose arguments could not be repaired: {} sent
        # one budget for all the repairs of the reply (waiting calls are repaired in one step)
        self._budget = RepairBudget()

    @property
    def over_budget(self) -> int:
        """Calls left unrepaired because the reply's repair budget was spent (in
        :attr:`unrepairable` too)."""
        return self._budget.refused

    def delta(self, delta: Any, out: list[bytes]) -> StreamedCall | None:
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
            call = StreamedCall(len(self._all) if type(index) is not int else index, len(self._all))
            self._calls[call.index] = call
            self._all.append(call)
        if upstream_id and call.id is None:
            call.id = upstream_id
        if name and call.name is None:
            call.name = name
        if call.state == STREAMING:
            if args:
                self._hold(call, args)
            return None
        if call.state == CLOSED:
            if args:
                self.dropped += 1
            return None
        if args:
            self._hold(call, args)
        if call.name is not None and self._tool is None:
            return call
        return None

    def _hold(self, call: StreamedCall, args: str) -> None:
        call.held += len(args)
        if call.held > MAX_HELD_ARGUMENTS:  # a hostile or looping upstream: end the stream
            raise Malformed
        call.pieces.append(args)

    def _find_call(self, index: Any, upstream_id: Any) -> StreamedCall | None:
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
    def shell(call: StreamedCall) -> bytes:
        """The ``content_block`` of the call's ``content_block_start``, after its index."""
        return (
            b',"content_block":{"type":"tool_use","id":'
            + frames.jstr(ids.tool_use_id(call.id))
            + b',"name":'
            + frames.jstr(call.name or "")
            + b',"input":{}}}\n\n'
        )

    def stream(self, call: StreamedCall, head: bytes, out: list[bytes]) -> None:
        """The call's block was opened (``head``: its delta prefix); its arguments keep being
        held until :meth:`finish` sends them whole."""
        call.state = STREAMING
        self._tool = call
        self._head = head
        self.opened = True

    def finish(self, out: list[bytes]) -> None:
        """The streaming call's block closes: its arguments, whole and repaired, as one
        ``input_json_delta`` (``{}`` for a call that sent none)."""
        call = self._tool
        if call is not None:
            out.append(self._head + frames.jstr(self._arguments(call)) + frames.DELTA_END)
            call.pieces = []
            call.state = CLOSED
            self._tool = None

    def _arguments(self, call: StreamedCall) -> str:
        """The call's arguments as JSON text of an object: as sent when they are one, else
        repaired (:mod:`gateway.local.tool_args`, the same repair a buffered reply gets)."""
        raw = "".join(call.pieces)
        if not raw.strip():
            return "{}"
        repaired = repair_arguments(raw, self._budget)
        if repaired.outcome == "ok":
            return raw
        if repaired.outcome == "repaired":
            self.repaired += 1
        else:
            self.unrepairable += 1
        return jsonutil.dumps(repaired.value)

    def waiting(self) -> list[StreamedCall]:
        """The named calls buffered while another streamed, in upstream index order."""
        waiting = [c for c in self._all if c.state == PENDING and c.name is not None]
        waiting.sort(key=lambda c: (c.index, c.seq))
        return waiting

    def regenerable(self) -> StreamedCall | None:
        """The call streaming into the open block when no call's block has closed yet: then
        nothing of any call's arguments has reached the client (only that block's start),
        and the calls may be generated again whole (gateway/messages/continuation.py)."""
        call = self._tool
        if call is None or any(c.state == CLOSED for c in self._all):
            return None
        return call

    def restart(self) -> None:
        """The calls are being generated again: the streaming call keeps its open block and
        forgets the arguments it held; the calls waiting behind it are forgotten."""
        call = self._tool
        if call is None:
            return
        call.pieces = []
        call.held = 0
        self._all = [call]
        self._calls = {call.index: call}

    def drop_unnamed(self) -> None:
        """The stream ends: calls never named cannot be delivered; count their pieces."""
        for call in self._all:
            if call.state == PENDING:
                self.dropped += len(call.pieces)
