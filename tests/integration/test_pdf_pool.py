"""PDF text extraction in worker processes (gateway/messages/documents/pdf_pool.py): CPU-time
budgets per document and per request, answered with a 400 naming the document, and a worker killed
as soon as its caller is cancelled (aiohttp cancels a handler whose client hung up).

Protocol facts: a PDF's content stream is a list of operators that pypdf interprets one by
one; deflated, 200,000 no-op operators fit in about 1.4 KB and cost pypdf a second or more
of CPU. ``/proc/PID`` exists while a process (or its zombie) does.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.messages.documents import pdf_text as documents
from gateway.messages.documents.pdf_pool import PdfPool
from tests.pdfs import document, hostile_pdf, make_pdf

HOSTILE = hostile_pdf()


def _req(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "read"}, *blocks]}]}


async def _to_text(pool: PdfPool, req: dict[str, Any]) -> dict[str, Any]:
    return await pool.to_text(req, documents.find_pdfs(req["messages"]))


async def test_text_comes_back_from_a_worker_and_the_worker_is_kept() -> None:
    pool = PdfPool(1)
    try:
        for _ in range(2):
            out = await _to_text(pool, _req(document(make_pdf([["hello"], ["world"]]))))
            block = out["messages"][0]["content"][1]
            assert block["source"] == {
                "type": "text",
                "media_type": "text/plain",
                "data": "--- Page 1 of 2 ---\nhello\n\n--- Page 2 of 2 ---\nworld",
            }
        assert len(pool._idle) == 1 and pool.killed == 0
    finally:
        await pool.close()


async def test_a_document_past_its_cpu_budget_is_a_400_naming_it() -> None:
    assert len(HOSTILE) < 2048
    pool = PdfPool(1, doc_cpu=0.2, request_cpu=10)
    try:
        with pytest.raises(InvalidRequest) as info:
            await _to_text(pool, _req(document(make_pdf([["fine"]])), document(HOSTILE)))
        assert info.value.status == 400
        assert info.value.message.startswith(
            "messages.0.content.2: PDF took more than 0.2 CPU seconds to read"
        )
        # the worker stopped itself and stays in the pool
        assert pool.killed == 0 and len(pool._idle) == 1
        # a PDF's own faults still name its data
        with pytest.raises(
            InvalidRequest,
            match=r"^messages\.0\.content\.1\.source\.data: "
            "PDF data is not valid base64",
        ):
            await _to_text(
                pool,
                _req(
                    {
                        "type": "document",
                        "source": {"type": "base64", "media_type": "application/pdf", "data": "!!"},
                    }
                ),
            )
    finally:
        await pool.close()


async def test_a_request_past_its_cpu_budget_is_a_400_naming_the_document() -> None:
    pool = PdfPool(1, doc_cpu=10, request_cpu=0.3)
    try:
        with pytest.raises(InvalidRequest) as info:
            await _to_text(pool, _req(*(document(HOSTILE) for _ in range(10))))
        assert "PDF documents in this request took more than 0.3 CPU seconds" in (
            info.value.message
        )
        assert info.value.message.startswith("messages.0.content.")
    finally:
        await pool.close()


async def test_a_cancelled_extraction_kills_its_worker() -> None:
    """asyncio.to_thread went on after the client left (four hung-up clients: 81 CPU s); a
    worker process is killed the moment its caller is cancelled."""
    pool = PdfPool(1, doc_cpu=60, request_cpu=600)
    try:
        many = _req(*(document(HOSTILE) for _ in range(50)))
        task = asyncio.create_task(_to_text(pool, many))
        for _ in range(200):  # until the worker has started (bounded: 10 s)
            await asyncio.sleep(0.05)
            if pool._busy:
                break
        worker = next(iter(pool._busy))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.killed == 1 and not pool._idle
        await asyncio.wait_for(worker.proc.wait(), 10)
        assert worker.proc.returncode is not None  # reaped, not a zombie
    finally:
        await pool.close()


@pytest.mark.parametrize(
    ("docs", "order"),
    [
        # one request's many PDFs were one job: the one-page request waited for all of them
        ({"many": 3, "one": 1}, ["one", "many"]),
        ({"many": 3, "more": 3, "one": 1}, ["one", "many", "more"]),
        ({"one": 1, "many": 3}, ["one", "many"]),
        ({"two": 2, "three": 3, "four": 4}, ["two", "three", "four"]),
    ],
)
async def test_requests_take_turns_at_the_workers(docs: dict[str, int], order: list[str]) -> None:
    """One worker, requests started together in this order: a freed worker goes to the
    request that has had the fewest documents read, so requests end in the order of their
    document counts, not of their arrival."""
    pool = PdfPool(1)
    ended: list[str] = []

    async def one(name: str, count: int) -> None:
        await _to_text(pool, _req(*(document(make_pdf([[f"{name} {i}"]])) for i in range(count))))
        ended.append(name)

    try:
        await asyncio.gather(*(one(name, count) for name, count in docs.items()))
        assert ended == order
        assert len(pool._idle) == 1 and pool._free == 1 and not pool._waiting
    finally:
        await pool.close()


async def test_a_request_cancelled_while_waiting_for_its_turn_gives_it_on() -> None:
    pool = PdfPool(1)
    try:
        first = asyncio.create_task(_to_text(pool, _req(document(make_pdf([["a"]])))))
        gone = asyncio.create_task(_to_text(pool, _req(document(make_pdf([["b"]])))))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if pool._waiting:
                break
        gone.cancel()
        await first
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert not pool._waiting and pool._free == 1 and pool.killed == 0
        out = await _to_text(pool, _req(document(make_pdf([["after"]]))))
        assert "after" in out["messages"][0]["content"][1]["source"]["data"]
    finally:
        await pool.close()
