"""A validated Messages request made ready to translate: replayed reasoning restored from its
signatures, replayed web search results opened, and PDFs (the user's, and those an earlier
web fetch returned) made text by the PDF worker processes.

:func:`make_ready` is what :func:`gateway.messages.call.prepare` runs before it makes the
:class:`~gateway.messages.call.Call`; :func:`restore` alone is what a server tool's next round
needs (gateway/tools/rounds/loop.py). Restoring is bounded per request and counted in the
request's memory lease (:data:`RESTORED_COPIES` times); opening and inflating signatures past
:data:`_OFF_LOOP_SIGNATURES` characters runs in a thread.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway import errors
from gateway.messages import fetch_blocks
from gateway.messages import search_blocks as web_search
from gateway.messages.deps import MessagesDeps
from gateway.messages.documents import pdf_text as documents
from gateway.messages.from_chat.signatures import Restorable, restorable, restore_reasoning
from gateway.ops.budget import Lease

__all__ = ["RESTORED_COPIES", "make_ready", "pdfs_as_text", "restore"]


async def make_ready(deps: MessagesDeps, req: dict[str, Any], lease: Lease) -> dict[str, Any]:
    """The request with its replayed reasoning restored (counted in ``lease``, see
    :func:`restore`) and its PDFs made text: each walk only where an assistant turn holds
    blocks or the request holds a PDF, nothing awaited otherwise (most requests)."""
    replayed = _replays_blocks(req["messages"])
    blocks = _to_restore(deps, req) if replayed else None
    if blocks:
        await _restore(deps, req, lease, blocks)
    if _holds_pdfs(req, replayed):
        req = await pdfs_as_text(deps, req)
    return req


async def pdfs_as_text(deps: MessagesDeps, req: dict[str, Any]) -> dict[str, Any]:
    """The request with its PDFs as text; the extraction (CPU work, bounded) runs in the
    PDF worker processes, and stops when the caller is cancelled (the client left).
    A PDF an earlier web fetch returned (replayed ``web_fetch_tool_result``) is read the
    same way, its text kept on the block for the translation (:data:`fetch_blocks.OPENED`)."""
    fetched = _fetched_pdfs(req)
    if fetched:
        await _fetched_pdfs_as_text(deps, fetched)
    where = documents.find_pdfs(req["messages"])  # a walk of user blocks, no copies
    if not where:
        return req
    return await deps.pdfs.to_text(req, where)


# a replayed fetched PDF: its block, the fetch's result and the document in it
_Fetched = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]


def _fetched_pdfs(req: dict[str, Any]) -> list[_Fetched]:
    """The replayed fetched PDFs not read yet (at most ``MAX_PDFS``): one walk of the
    assistant turns, nothing awaited."""
    found: list[_Fetched] = []
    for turn in req["messages"]:
        content = turn["content"]
        if turn["role"] != "assistant" or isinstance(content, str):
            continue
        for block in content:
            if block["type"] != "web_fetch_tool_result" or fetch_blocks.OPENED in block:
                continue
            result = block["content"]
            if result["type"] != "web_fetch_result":
                continue
            doc = result["content"]
            if doc["source"]["type"] != "base64" or len(found) >= documents.MAX_PDFS:
                continue
            found.append((block, result, doc))
    return found


async def _fetched_pdfs_as_text(deps: MessagesDeps, fetched: list[_Fetched]) -> None:
    """Each replayed fetched PDF's tool message: its text read by the PDF workers (past
    ``MAX_PDFS`` of them, or unreadable, the translation says it is a PDF)."""
    for block, result, doc in fetched:
        one = {"messages": [{"role": "user", "content": [{**doc, "title": None}]}]}
        try:
            out = await deps.pdfs.to_text(one, documents.find_pdfs(one["messages"]))
        except errors.InvalidRequest:
            continue
        text = out["messages"][0]["content"][0]["source"]["data"]
        block[fetch_blocks.OPENED] = fetch_blocks.document_text(
            result["url"], doc.get("title"), text
        )


def _to_restore(deps: MessagesDeps, req: dict[str, Any]) -> list[Restorable]:
    """Replayed web search results opened (:func:`web_search.open_history`); the replayed
    thinking blocks whose reasoning :func:`restore` puts back (nothing awaited)."""
    keys = deps.opening_keys
    web_search.open_history(req, keys)
    return restorable(req)


async def restore(deps: MessagesDeps, req: dict[str, Any], lease: Lease) -> None:
    """Restore replayed reasoning from its signatures (:func:`restore_reasoning`), bounded
    per request and counted in ``lease`` (:data:`RESTORED_COPIES` times: reserved before a
    signature is opened, what it did not use given back). Opening and inflating is CPU work: past
    :data:`_OFF_LOOP_SIGNATURES` characters of signatures it runs in a thread (zlib and
    OpenSSL let go of the GIL; what a thread can restore is bounded by the same caps).
    Replayed web search results are opened too (:func:`web_search.open_history`)."""
    blocks = _to_restore(deps, req)
    if blocks:
        await _restore(deps, req, lease, blocks)


async def _restore(
    deps: MessagesDeps, req: dict[str, Any], lease: Lease, blocks: list[Restorable]
) -> None:
    keys = deps.opening_keys

    def take(size: int) -> bool:
        return lease.take(RESTORED_COPIES * size)

    def give(size: int) -> None:
        lease.give(RESTORED_COPIES * size)

    if sum(len(block["signature"]) for _, _, block in blocks) <= _OFF_LOOP_SIGNATURES:
        restore_reasoning(
            req, keys, max_bytes=deps.max_restored_bytes, take=take, give=give, blocks=blocks
        )
        return
    await asyncio.to_thread(
        restore_reasoning,
        req,
        keys,
        max_bytes=deps.max_restored_bytes,
        take=take,
        give=give,
        blocks=blocks,
    )


# Copies of restored reasoning a request holds until its reply ends: the text in the request
# (kept: a fallback route or a refused image translates it again) and in the upstream payload.
RESTORED_COPIES = 2


# Signature characters opened on the event loop, at most: 64 K of signature restores at most
# 2 MiB (MAX_EXPANSION), a few milliseconds of inflating; more goes to a thread.
_OFF_LOOP_SIGNATURES = 64 * 1024


def _replays_blocks(messages: list[dict[str, Any]]) -> bool:
    """Whether an assistant turn holds blocks: where replayed reasoning, search results
    and fetched PDFs are (none of their walks is needed otherwise); stops at the first."""
    for turn in messages:
        if turn["role"] == "assistant" and not isinstance(turn["content"], str):
            return True
    return False


def _holds_pdfs(req: dict[str, Any], replayed: bool) -> bool:
    """Whether :func:`pdfs_as_text` has a PDF to read (else it is not awaited at all)."""
    return (replayed and bool(_fetched_pdfs(req))) or bool(documents.find_pdfs(req["messages"]))
