"""A server tools reply's rounds as one stream of events, and the blocks kept of them.

Each round's :class:`~gateway.messages.stream.translator.StreamTranslator` output is read by
its frames' prefixes (:mod:`gateway.messages.stream.frames`: pre-encoded, so an event is
recognised and its index respliced without decoding it; the rest passes as it is): only
the first round's ``message_start`` passes, block indexes continue across rounds, a call of
a server tool's function becomes a ``server_tool_use`` block, a round's ``message_delta`` and
``message_stop`` are held (its usage and stop reason are read from the translator), and
once results with snippets came, text is split around verbatim quotes (:mod:`.citations`).

A block's text, signature and input are kept as the encoded delta bodies and decoded once,
as its round ends (:meth:`RoundEvents.end_round`): they are the next round's request's
assistant turn and the buffered reply's content (:meth:`RoundEvents.message`, equal to the
stream's events folded as the SDKs fold them). Pure: no I/O, no awaits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway.messages import search_blocks as blocks
from gateway.messages.stream import frames
from gateway.messages.stream.translator import StreamTranslator
from gateway.text import ids, jsonutil
from gateway.text.sse import encode_event
from gateway.tools.web_search.citations import Piece, Quotes

__all__ = ["RoundEvents"]

# the translator's frames (gateway/messages/stream/frames.py), recognised by their prefix
_CBS_LEN = len(frames.CBS)
_CBD_LEN = len(frames.CBD)
_CB_STOP = frames.CB_STOP.split(b"%d")[0]
_CB_STOP_LEN = len(_CB_STOP)
_TEXT_SHELL = frames.TEXT_SHELL.removesuffix(b"\n\n")
_THINKING_SHELL = frames.THINKING_SHELL.removesuffix(b"\n\n")
_TEXT_DELTA, _TEXT_DELTA_LEN = frames.TEXT_DELTA, len(frames.TEXT_DELTA)
_THINKING_DELTA, _THINKING_DELTA_LEN = frames.THINKING_DELTA, len(frames.THINKING_DELTA)
_SIGNATURE_DELTA, _SIGNATURE_DELTA_LEN = frames.SIGNATURE_DELTA, len(frames.SIGNATURE_DELTA)
_JSON_DELTA, _JSON_DELTA_LEN = frames.JSON_DELTA, len(frames.JSON_DELTA)
_MESSAGE_START = b"event: message_start\n"
_MESSAGE_DELTA = b"event: message_delta\n"
_MESSAGE_STOP = b"event: message_stop\n"
_ERROR = b"event: error\n"


class RoundEvents:
    """One reply's events across its rounds (see the module docstring)."""

    def __init__(self, quotes: Quotes, names: Iterable[str], translator: StreamTranslator) -> None:
        self._quotes = quotes
        # a call of a server tool's function: the end of its tool_use shell (tool_blocks.shell)
        self._tails = {b',"name":' + frames.jstr(name) + b',"input":{}}}': name for name in names}
        self.message_id = self.model = ""
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self._usage: dict[str, Any] = {}
        self.started = False
        self.errored = False
        self.next = 0  # the client's next block index
        self.history: list[dict[str, Any]] = []  # every block so far, in the client's order
        self.input = self.output = self.cache_read = 0
        self.new_round(translator)

    @property
    def usage(self) -> tuple[int, int]:
        """(prompt, output) tokens of the rounds so far (a round's once its delta came)."""
        return (
            self.input + self.round_in + self.cache_read + self.round_cache,
            self.output + self.round_out,
        )

    def result(self, call: Mapping[str, Any], kind: str, content: Any, text: str) -> bytes:
        """A server tool's result block (``kind``: its type), complete at its start
        (``text``: the tool message the model gets, kept for the next round's request)."""
        result = {"type": kind, "tool_use_id": call["id"], "content": content}
        index = self.next
        self.next += 1
        self.history.append({**result, blocks.OPENED: text})
        return encode_event(
            "content_block_start",
            jsonutil.dumpb(
                {"type": "content_block_start", "index": index, "content_block": result}
            ),
        ) + (frames.CB_STOP % index)

    def new_round(self, translator: StreamTranslator) -> None:
        """The next round's translator, whose output :meth:`rewrite` reads."""
        self.translator = translator
        if not self.message_id:  # the reply's is its first round's
            self.message_id, self.model = translator.message_id, translator.model
        self._map: dict[int, int] = {}
        self._blocks: dict[int, dict[str, Any]] = {}
        # the blocks' delta bodies as the translator encoded them (JSON strings), decoded
        # once per block as the round ends: the text (or thinking), the signature, the input
        self._parts: dict[int, list[bytes]] = {}
        self._signature: dict[int, bytes] = {}
        self._json: dict[int, list[bytes]] = {}
        self.calls: list[int] = []  # client indexes of this round's server_tool_use blocks
        self.client_tools = False
        self.held: tuple[str | None, str | None] | None = None  # stop reason, sequence
        self.round_in = self.round_out = self.round_cache = 0
        # the text block read for quotes: its translator index, held text, client index
        self._quoting: int | None = None
        self._quote_held = ""
        self._quote_open: int | None = None

    def rewrite(self, data: bytes) -> bytes:
        """A round's events as the client gets them (see the module docstring).

        ``data`` is the round translator's output, in the frames of
        :mod:`gateway.messages.stream.frames`: each is recognised by its prefix and its
        index respliced, never decoded whole; what the round's end needs (usage, stop
        reason) is read from the translator itself."""
        out: list[bytes] = []
        for frame in data.split(b"\n\n"):
            if frame.startswith(frames.CBD):
                self._delta(frame, out)
            elif frame.startswith(frames.CBS):
                self._block_start(frame, out)
            elif frame.startswith(_CB_STOP):
                self._block_stop(frame, out)
            elif frame.startswith(_MESSAGE_START):
                translator = self.translator
                self.round_in = translator.input_tokens
                if not self.started:
                    self.started = True
                    out.append(frame + b"\n\n")
            elif frame.startswith(_MESSAGE_DELTA):
                translator = self.translator
                self.round_out = translator.output_tokens
                self.round_in = translator.input_tokens
                self.round_cache = (
                    (translator.cache_read or 0) if (translator.prompt_reported) else 0
                )
                self.held = (translator.stop_reason, translator.stop_sequence)
            elif frame.startswith(_MESSAGE_STOP):
                if self.errored:
                    out.append(frames.MESSAGE_STOP)
            elif frame:
                if frame.startswith(_ERROR):
                    self.errored = True
                out.append(frame + b"\n\n")
        return b"".join(out)

    def _block_start(self, frame: bytes, out: list[bytes]) -> None:
        comma = frame.index(b",", _CBS_LEN)
        upstream = int(frame[_CBS_LEN:comma])
        shell = frame[comma:]
        block: dict[str, Any]
        if shell == _TEXT_SHELL:
            if self._quotes:
                self._quoting = upstream  # opened with its first plain text
                return
            block = {"type": "text", "text": ""}
        elif shell == _THINKING_SHELL:
            block = {"type": "thinking", "thinking": ""}
        elif (name := self._server_tool(shell)) is not None:  # a server tool's call
            block = {
                "type": "server_tool_use",
                "id": "srvtoolu_" + ids.b62(24),
                "name": name,
                "input": {},
            }
            shell = b',"content_block":' + jsonutil.dumpb(block) + b"}"
        else:  # a client tool's call: its shell, decoded once for the next round's request
            block = jsonutil.loads(b"{" + shell[1:])["content_block"]
            self.client_tools = True
        index = self._map[upstream] = self.next
        self.next += 1
        if block["type"] == "server_tool_use":
            self.calls.append(index)
        self._blocks[index] = block
        out.append(frames.CBS + b"%d" % index + shell + b"\n\n")

    def _server_tool(self, shell: bytes) -> str | None:
        """The server tool a tool_use shell calls, or None (a client tool's)."""
        for tail, name in self._tails.items():
            if shell.endswith(tail):
                return name
        return None

    def _delta(self, frame: bytes, out: list[bytes]) -> None:
        comma = frame.index(b",", _CBD_LEN)
        upstream = int(frame[_CBD_LEN:comma])
        rest = frame[comma:]
        if upstream == self._quoting:
            if rest.startswith(_TEXT_DELTA):
                text = jsonutil.loads(rest[_TEXT_DELTA_LEN:-2])
                pieces, self._quote_held = self._quotes.split(self._quote_held + text)
                self._text_pieces(pieces, out)
            return
        index = self._map[upstream]
        if rest.startswith(_TEXT_DELTA):
            self._parts.setdefault(index, []).append(rest[_TEXT_DELTA_LEN:-2])
        elif rest.startswith(_THINKING_DELTA):
            self._parts.setdefault(index, []).append(rest[_THINKING_DELTA_LEN:-2])
        elif rest.startswith(_SIGNATURE_DELTA):
            self._signature[index] = rest[_SIGNATURE_DELTA_LEN:-2]
        elif rest.startswith(_JSON_DELTA):
            self._json.setdefault(index, []).append(rest[_JSON_DELTA_LEN:-2])
        out.append(frames.CBD + b"%d" % index + rest + b"\n\n")

    def _block_stop(self, frame: bytes, out: list[bytes]) -> None:
        upstream = int(frame[_CB_STOP_LEN:-1])
        if upstream == self._quoting:
            if self._quote_held:
                self._text_pieces([(self._quote_held, None)], out)
            if self._quote_open is not None:
                out.append(frames.CB_STOP % self._quote_open)
            self._quoting, self._quote_held, self._quote_open = None, "", None
            return
        out.append(frames.CB_STOP % self._map[upstream])

    def _text_pieces(self, pieces: list[Piece], out: list[bytes]) -> None:
        """Plain text into the open text block (opened if need be); a quote into a text
        block of its own, its citation first (gateway/tools/web_search/citations.py)."""
        for text, citation in pieces:
            if citation is not None and self._quote_open is not None:
                out.append(frames.CB_STOP % self._quote_open)
                self._quote_open = None
            if self._quote_open is None:
                index = self._quote_open = self.next
                self.next += 1
                out.append(frames.CBS + b"%d" % index + frames.TEXT_SHELL)
                self._blocks[index] = {"type": "text", "text": ""}
            index = self._quote_open
            if citation is not None:
                self._blocks[index]["citations"] = [citation]
                out.append(
                    encode_event(
                        "content_block_delta",
                        jsonutil.dumpb(
                            {
                                "type": "content_block_delta",
                                "index": index,
                                "delta": {"type": "citations_delta", "citation": citation},
                            }
                        ),
                    )
                )
            self._blocks[index]["text"] += text
            out.append(
                frames.CBD
                + b"%d" % index
                + frames.TEXT_DELTA
                + frames.jstr(text)
                + frames.DELTA_END
            )
            if citation is not None:
                out.append(frames.CB_STOP % index)
                self._quote_open = None

    def end_round(self) -> list[dict[str, Any]]:
        """The round's blocks into the history; its search calls (their blocks)."""
        for index in sorted(self._blocks):
            block = self._blocks[index]
            kind = block["type"]
            parts = self._parts.get(index)
            if parts:
                block["text" if kind == "text" else "thinking"] = _joined(parts)
            signature = self._signature.get(index)
            if signature is not None:
                block["signature"] = jsonutil.loads(signature)
            if kind in ("tool_use", "server_tool_use"):
                try:
                    value = jsonutil.loads(_joined(self._json.get(index, [])) or "{}")
                except ValueError:
                    value = {}
                block["input"] = value if isinstance(value, dict) else {}
            self.history.append(block)
        self.input += self.round_in
        self.output += self.round_out
        self.cache_read += self.round_cache
        self.round_in = self.round_out = self.round_cache = 0
        return [self._blocks[i] for i in self.calls]

    def finish(self, stop_reason: str | None, counts: Mapping[str, int]) -> bytes:
        """The reply's ``message_delta`` (usage of every round; ``counts``: the server
        tools' requests, by their ``usage.server_tool_use`` key) and ``message_stop``."""
        held_reason, held_sequence = self.held or ("end_turn", None)
        if stop_reason is None:
            stop_reason, sequence = held_reason, held_sequence
        else:
            sequence = None
        self.stop_reason = stop_reason
        self.stop_sequence = sequence
        usage: dict[str, Any] = {"input_tokens": self.input}
        if self.cache_read:
            usage["cache_read_input_tokens"] = self.cache_read
        usage["output_tokens"] = self.output
        usage["server_tool_use"] = {"web_search_requests": 0, "web_fetch_requests": 0, **counts}
        self._usage = usage
        body = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": sequence},
            "usage": usage,
        }
        return encode_event("message_delta", jsonutil.dumpb(body)) + frames.MESSAGE_STOP

    def message(self) -> dict[str, Any]:
        """The reply as one buffered Message (after :meth:`run` completed it): the blocks
        its stream carried, as the SDKs would fold its events, made from what the rounds
        kept for their requests instead of folding the events again."""
        content = [{k: v for k, v in block.items() if k != blocks.OPENED} for block in self.history]
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content or [{"type": "text", "text": ""}],
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stop_sequence,
            "usage": self._usage,
        }


def _joined(parts: list[bytes]) -> str:
    """JSON strings' bodies, decoded once as one string (the text they hold, joined)."""
    if len(parts) == 1:
        return jsonutil.loads(parts[0])  # type: ignore[no-any-return]
    return jsonutil.loads(b'"' + b"".join([part[1:-1] for part in parts]) + b'"')  # type: ignore[no-any-return]
