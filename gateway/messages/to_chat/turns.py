"""Pure translation of a validated request's conversation: Anthropic system prompt and turns
-> OpenAI chat messages (the ``messages`` of :func:`gateway.messages.to_chat.translate.to_chat`).

Protocol facts relied on:

- OpenAI chat wants tool results as ``role: "tool"`` messages carrying ``tool_call_id``,
  right after the assistant turn that called them and before any other user content.
- Anthropic merges consecutive turns of the same role; chat templates usually reject them,
  so they are merged here too.
- Prior reasoning goes back as the assistant message's ``reasoning_content``.
- Templates expand ``tool_reference`` parts only at the start of a tool message, so each
  run of references and each run of other parts is its own tool message.
- A replayed web search or web fetch (``server_tool_use`` + ``web_search_tool_result`` /
  ``web_fetch_tool_result``) is the assistant's call and the ``tool`` message it got
  (:mod:`gateway.messages.search_blocks`, :mod:`gateway.messages.fetch_blocks`): a fetched
  document goes upstream as the block holds it.
- A system turn may carry nothing else than this turn's controls, or be cleared by a later
  user message (``clear_at``, :mod:`.turn_control`): no empty system message goes upstream.
- An upstream that cannot take images or ``tool_reference`` parts gets them as text
  (:class:`Render`): an image becomes a placeholder naming what was removed, a reference the
  tool's name.
- Claude Code's first system block, ``x-anthropic-billing-header: cc_version=...;``,
  changes on every request and would defeat the upstream's prefix cache at the head of
  the prompt, so it is dropped unless the config keeps it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from gateway.messages import fetch_blocks
from gateway.messages.search_blocks import OPENED, replayed_text
from gateway.messages.to_chat import turn_control
from gateway.text import jsonutil

__all__ = ["BILLING_HEADER_PREFIX", "PLAIN", "Message", "Render", "messages"]

BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"

Message = dict[str, Any]
Part = dict[str, Any]


class Render(NamedTuple):
    """What goes upstream as text rather than as its own part."""

    images_as_text: bool = False
    references_as_text: bool = False


PLAIN = Render()


def messages(
    req: Mapping[str, Any], keep_billing_header: bool, render: Render = PLAIN
) -> list[Message]:
    """The chat messages for the request's ``system`` and ``messages``."""
    # Group consecutive turns of one role; a system turn left blank (or holding only the
    # billing header) is skipped first, so the turns around it still merge.
    groups: list[tuple[str, list[Any]]] = []
    top = _system_text(req.get("system"), keep_billing_header)
    if top is not None:
        groups.append(("system", [top]))
    hidden = turn_control.hidden_turns(req["messages"])
    for i, turn in enumerate(req["messages"]):
        role = turn["role"]
        item: Any = turn
        if role == "system":
            if i in hidden:  # clear_at "next_user_message", and a user message followed
                continue
            item = _system_text(turn.get("content"), keep_billing_header)
            if item is None:
                continue
        if groups and groups[-1][0] == role:
            groups[-1][1].append(item)
        else:
            groups.append((role, [item]))
    out: list[Message] = []
    for role, group in groups:
        if role == "system":
            out.append({"role": "system", "content": "\n".join(group)})
        elif role == "user":
            out.extend(_user(group, render))
        else:
            out.extend(_assistant_turns(group))
    return out


def _system_text(content: Any, keep_billing_header: bool) -> str | None:
    """The text of a system prompt or turn; None when there is nothing to send."""
    if content is None:
        return None
    if isinstance(content, str):
        text = content
    else:
        text = "\n".join(
            b["text"]
            for b in content
            if keep_billing_header or not b["text"].startswith(BILLING_HEADER_PREFIX)
        )
    return text if text.strip() else None


def _collapse(parts: list[Part]) -> str | list[Part]:
    """Plain text when every part is text (templates handle strings best), else parts."""
    if len(parts) == 1:  # the usual turn: one string or one text block
        part = parts[0]
        return part["text"] if part["type"] == "text" else parts
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _text_part(text: str) -> Part:
    return {"type": "text", "text": text}


def _image_part(source: Mapping[str, Any], render: Render = PLAIN) -> Part:
    if render.images_as_text:
        return _text_part(_image_placeholder(source))
    if source["type"] == "url":
        url = source["url"]
    else:
        url = f"data:{source['media_type']};base64,{source['data']}"
    return {"type": "image_url", "image_url": {"url": url}}


_NOT_SHOWN = "not shown: this model does not take images"


def _image_placeholder(source: Mapping[str, Any]) -> str:
    """What the model reads instead of an image it cannot take: that one was there."""
    if source["type"] != "base64":
        return f"[image: from a URL, {_NOT_SHOWN}]"
    size = len(source["data"]) * 3 // 4
    shown = f"{size // 1024} KB" if size >= 1024 else f"{size} bytes"
    return f"[image: {source['media_type']}, {shown}, {_NOT_SHOWN}]"


def _document_parts(block: Mapping[str, Any], render: Render) -> list[Part]:
    header = "\n\n".join(
        block[key] for key in ("title", "context") if isinstance(block.get(key), str) and block[key]
    )
    source = block["source"]
    body = source["data"] if source["type"] == "text" else source["content"]
    if isinstance(body, str):
        return [_text_part(f"{header}\n\n{body}" if header else body)]
    parts = [_text_part(header)] if header else []
    for item in body:
        if item["type"] == "text":
            parts.append(_text_part(item["text"]))
        else:
            parts.append(_image_part(item["source"], render))
    return parts


def _search_result_text(block: Mapping[str, Any]) -> str:
    body = "\n".join(item["text"] for item in block["content"])
    return f"{block['title']}\n{block['source']}\n\n{body}"


def _parts(block: Mapping[str, Any], render: Render) -> list[Part]:
    """Content parts for a user (or tool_result) block other than tool_result itself."""
    kind = block["type"]
    if kind == "text":
        return [_text_part(block["text"])]
    if kind == "image":
        return [_image_part(block["source"], render)]
    if kind == "document":
        return _document_parts(block, render)
    return [_text_part(_search_result_text(block))]  # search_result


def _tool_messages(block: Mapping[str, Any], render: Render) -> list[Message]:
    call_id = block["tool_use_id"] if block.get("tool_use_id") is not None else block["id"]
    content = block.get("content")
    if not content:
        return [{"role": "tool", "tool_call_id": call_id, "content": ""}]
    if isinstance(content, str):
        return [{"role": "tool", "tool_call_id": call_id, "content": content}]
    # is_error is deliberately not rendered: the content goes upstream unchanged.
    messages: list[Message] = []
    run: list[Part] = []
    run_is_ref = False
    for item in content:
        is_ref = item["type"] == "tool_reference"
        if is_ref and render.references_as_text:
            # the tool's name, as text among the other parts (one message: no run to split)
            run.append(_text_part(item.get("tool_name", item.get("name"))))
            continue
        if run and is_ref != run_is_ref:
            messages.append(_tool_message(call_id, run, run_is_ref))
            run = []
        run_is_ref = is_ref
        if is_ref:
            run.append({"type": "tool_reference", "name": item.get("tool_name", item.get("name"))})
        else:
            run.extend(_parts(item, render))
    messages.append(_tool_message(call_id, run, run_is_ref))
    return messages


def _tool_message(call_id: str, parts: list[Part], is_ref: bool) -> Message:
    content = parts if is_ref else _collapse(parts)
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _user(group: list[Mapping[str, Any]], render: Render) -> list[Message]:
    out: list[Message] = []
    parts: list[Part] = []
    for turn in group:
        content = turn["content"]
        if isinstance(content, str):
            parts.append({"type": "text", "text": content})  # _text_part, inline
            continue
        for block in content:
            kind = block["type"]
            if kind == "tool_result":
                out.extend(_tool_messages(block, render))
            elif kind == "text":  # the usual block: what _parts makes of it, inline
                parts.append({"type": "text", "text": block["text"]})
            else:
                parts.extend(_parts(block, render))
    if parts:
        # one text part (the usual turn) is its text: what _collapse says, without the call
        one = parts[0] if len(parts) == 1 else None
        text = one["text"] if one is not None and one["type"] == "text" else _collapse(parts)
        out.append({"role": "user", "content": text})
    return out


_RESULT_BLOCKS = frozenset({"web_search_tool_result", "web_fetch_tool_result"})
_SEARCH_BLOCKS = _RESULT_BLOCKS | {"server_tool_use"}


def _assistant_turns(group: list[Mapping[str, Any]]) -> list[Message]:
    """An assistant turn (or a run of them) as chat messages: one assistant message, or,
    where web searches ran inside it, an assistant message with the search call and the
    search's ``tool`` message per search, the turn going on after it."""
    if not any(
        isinstance(turn["content"], list)
        and any(b["type"] in _SEARCH_BLOCKS for b in turn["content"])
        for turn in group
    ):
        return [_assistant(group)]
    out: list[Message] = []
    segment: list[Any] = []
    answered = {
        b["tool_use_id"]
        for turn in group
        if isinstance(turn["content"], list)
        for b in turn["content"]
        if b["type"] in _RESULT_BLOCKS
    }
    for turn in group:
        if isinstance(turn["content"], str):
            segment.append({"type": "text", "text": turn["content"]})
            continue
        for block in turn["content"]:
            if block["type"] == "server_tool_use" and block["id"] not in answered:
                continue  # a search without its result: nothing the model can be shown
            if block["type"] not in _RESULT_BLOCKS:
                segment.append(block)
                continue
            if segment:
                out.append(_assistant([{"content": segment}]))
                segment = []
            if block["type"] == "web_fetch_tool_result":
                text = fetch_blocks.replayed_text(block)
            else:
                text = block.get(OPENED)
                if text is None:  # not opened by the caller: title and URL only
                    text = replayed_text(block, ())
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
    if segment:
        out.append(_assistant([{"content": segment}]))
    return out


def _join_texts(texts: list[str], cited: list[bool]) -> str:
    """The assistant's text blocks as one content string.

    Blocks are joined with a newline, except next to a block carrying citations: the API (and
    gateway/tools/web_search/citations.py) splits one run of the model's text
    into blocks around each cited passage, so those pieces go back exactly as the model wrote
    them, with nothing inserted.
    """
    out = [texts[0]]
    for i in range(1, len(texts)):
        out.append("" if cited[i] or cited[i - 1] else "\n")
        out.append(texts[i])
    return "".join(out)


def _assistant(group: list[Mapping[str, Any]]) -> Message:
    texts: list[str] = []
    cited: list[bool] = []  # per text: it carries citations
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for turn in group:
        content = turn["content"]
        if isinstance(content, str):
            texts.append(content)
            cited.append(False)
            continue
        for block in content:
            kind = block["type"]
            if kind == "text":
                texts.append(block["text"])
                cited.append(bool(block.get("citations")))
            elif kind == "thinking":
                if block["thinking"]:
                    reasoning.append(block["thinking"])
            else:  # tool_use, or a web search's server_tool_use
                arguments = jsonutil.dumps(block["input"])
                calls.append(
                    {
                        "id": block["id"],
                        "type": "function",
                        "function": {"name": block["name"], "arguments": arguments},
                    }
                )
    message: Message = {
        "role": "assistant",
        "content": _join_texts(texts, cited) if texts else (None if calls else ""),
    }
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message
