"""Base64 PDF documents -> text with page markers (gateway/messages/documents/pdf_text.py).

An OpenAI-compatible upstream reads no PDF, and Claude Code's Read of a PDF puts a base64
``application/pdf`` document into a ``tool_result``, where it stays for the rest of the
session: refusing it would end the session. So the gateway sends the PDF's text, page by
page, and refuses (400, naming the field) only what it cannot read: bad base64, past the
API's limits (32 MB, 100 pages, 100 PDFs a request), encrypted, corrupt, no text at all.
The PDFs are built here (tests/pdfs.py), one Helvetica text line per ``Tj``.
"""

from __future__ import annotations

import copy
from typing import Any

import pypdf
import pytest
from pypdf import PageObject

from gateway.errors import InvalidRequest
from gateway.messages.documents import pdf_text as documents
from gateway.messages.documents.pdf_text import find_pdfs, pdf_text, pdfs_to_text
from gateway.messages.request.validate import validate_messages
from gateway.messages.to_chat.translate import to_chat
from gateway.ops.config import ModelRoute, UpstreamConfig
from tests.pdfs import b64, document, encrypt, make_pdf

PATH = "messages.0.content.0.source.data"
HELLO = make_pdf([["Hello, world."]])

# (id, pages, the exact text the upstream gets)
EXTRACTED: list[tuple[str, list[list[str] | None], str]] = [
    ("one-page", [["Hello, world."]], "--- Page 1 of 1 ---\nHello, world."),
    (
        "lines-and-pages",
        [["Quarterly report", "Revenue rose (a lot)."], ["Back\\slash and Café"]],
        "--- Page 1 of 2 ---\nQuarterly report\nRevenue rose (a lot).\n\n"
        "--- Page 2 of 2 ---\nBack\\slash and Café",
    ),
    (
        "a-page-without-text-keeps-its-marker",
        [["Cover"], None, ["End"]],
        "--- Page 1 of 3 ---\nCover\n\n--- Page 2 of 3 ---\n[no text on this page]\n\n"
        "--- Page 3 of 3 ---\nEnd",
    ),
    (
        "hundred-pages-is-the-limit",
        [[f"p{n}"] for n in range(1, 101)],
        "\n\n".join(f"--- Page {n} of 100 ---\np{n}" for n in range(1, 101)),
    ),
]


@pytest.mark.parametrize(
    ("pages", "text"), [c[1:] for c in EXTRACTED], ids=[c[0] for c in EXTRACTED]
)
def test_extracted_text_has_page_markers(pages: list[list[str] | None], text: str) -> None:
    assert pdf_text(b64(make_pdf(pages)), PATH) == text


def test_a_pdf_with_only_an_owner_password_opens() -> None:
    """ "Printing restricted" PDFs are encrypted with an empty user password: readable."""
    assert pdf_text(b64(encrypt(HELLO, user_password="")), PATH) == (
        "--- Page 1 of 1 ---\nHello, world."
    )


def _deep_catalog(levels: int) -> bytes:
    return make_pdf([["x"]], catalog_extra=b"/Deep " + b"[" * levels + b"]" * levels + b" ")


# (id, base64 data, the message after "<path>: ")
REFUSED: list[tuple[str, str, str]] = [
    ("not-base64", "JVBER$$$", "PDF data is not valid base64"),
    ("base64-unpadded", b64(HELLO)[:-1], "PDF data is not valid base64"),
    ("not-a-pdf", b64(b"<html>hello</html>" * 10), "PDF could not be read (corrupt or not a PDF)"),
    ("truncated", b64(HELLO[: len(HELLO) // 2]), "PDF could not be read (corrupt or not a PDF)"),
    (
        "garbage-after-header",
        b64(b"%PDF-1.4\n" + bytes(range(256)) * 4),
        "PDF could not be read (corrupt or not a PDF)",
    ),
    (
        "nested-past-recursion",
        b64(_deep_catalog(50_000)),
        "PDF could not be read (corrupt or not a PDF)",
    ),
    (
        "encrypted",
        b64(encrypt(HELLO, user_password="secret")),
        "PDF is encrypted with a password; send it decrypted",
    ),
    (
        "scanned-only",
        b64(make_pdf([None, None])),
        "PDF has no extractable text (its pages are images, e.g. a scan); only a PDF's text "
        "reaches this model",
    ),
    (
        "blank-lines-only",
        b64(make_pdf([["  "]])),
        "PDF has no extractable text (its pages are images, e.g. a scan); only a PDF's text "
        "reaches this model",
    ),
    ("no-pages", b64(make_pdf([])), "PDF has no pages"),
    ("101-pages", b64(make_pdf([["p"]] * 101)), "PDF has 101 pages; at most 100 are supported"),
]


@pytest.mark.parametrize(("data", "message"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_unreadable_pdfs_are_400_naming_the_field(data: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        pdf_text(data, PATH)
    assert info.value.status == 400
    assert info.value.message == f"{PATH}: {message}"


def test_any_exception_from_pypdf_is_a_400(monkeypatch: pytest.MonkeyPatch) -> None:
    """RecursionError on a deep object graph (older pypdf lets it out) is a corrupt PDF."""

    def deep(*_: Any, **__: Any) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(pypdf, "PdfReader", deep)  # what _extract imports when it runs
    with pytest.raises(InvalidRequest, match="corrupt or not a PDF"):
        pdf_text(b64(HELLO), PATH)


def test_a_pdf_over_32_mb_is_refused_before_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(documents, "MAX_PDF_BYTES", len(HELLO) - 1)
    with pytest.raises(InvalidRequest) as info:
        pdf_text(b64(HELLO), PATH)
    assert info.value.message == f"{PATH}: PDF is larger than 0 MB"
    monkeypatch.setattr(documents, "MAX_PDF_BYTES", 32 * 1024 * 1024)
    with pytest.raises(InvalidRequest, match=r"^x: PDF is larger than 32 MB$"):
        pdf_text("A" * (44 * 1024 * 1024), "x")  # refused on its length, never decoded


def test_text_past_the_budget_stops_extraction(monkeypatch: pytest.MonkeyPatch) -> None:
    """A page whose text runs past the characters left is stopped while it is extracted."""
    pdf = b64(make_pdf([["x" * 50], ["y" * 50]]))
    assert pdf_text(pdf, PATH, max_chars=200).endswith("y" * 50)
    extracted: list[int] = []
    extract = PageObject.extract_text

    def spy(page: PageObject, *args: Any, **kwargs: Any) -> str:
        extracted.append(page.page_number or 0)
        return extract(page, *args, **kwargs)

    monkeypatch.setattr(PageObject, "extract_text", spy)
    with pytest.raises(InvalidRequest) as info:
        pdf_text(pdf, PATH, max_chars=30)
    assert info.value.message == (
        f"{PATH}: PDF text is longer than the 30 characters left for documents in this request"
    )
    assert extracted == [0]  # the second page was never read


# --- requests: where PDFs are, and what the request becomes ------------------------------


def _call(call_id: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": call_id, "name": "Read", "input": {"file_path": "/r.pdf"}}
        ],
    }


def _request(*messages: dict[str, Any]) -> dict[str, Any]:
    return validate_messages({"model": "m", "max_tokens": 64, "messages": list(messages)})


REPORT = make_pdf([["Revenue: 12"], ["Costs: 7"]])
REPORT_TEXT = "--- Page 1 of 2 ---\nRevenue: 12\n\n--- Page 2 of 2 ---\nCosts: 7"
TOP_AND_TOOL = _request(
    {
        "role": "user",
        "content": [
            document(REPORT, title="report.pdf", context="Q3"),
            {"type": "text", "text": "Read the other one too."},
        ],
    },
    _call("toolu_1"),
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "PDF file read"}, document(HELLO)],
            }
        ],
    },
)


def test_find_pdfs_at_top_level_and_in_tool_results() -> None:
    assert find_pdfs(TOP_AND_TOOL["messages"]) == [(0, 0, None), (2, 0, 1)]


def test_find_pdfs_skips_everything_else() -> None:
    text_doc = {"type": "document", "source": {"type": "text", "data": "d"}}
    req = _request(
        {"role": "user", "content": "a string turn"},
        {"role": "user", "content": [text_doc, {"type": "text", "text": "t"}]},
        _call("toolu_1"),
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a string result"}
            ],
        },
    )
    assert find_pdfs(req["messages"]) == []


def test_pdfs_become_text_sources_and_the_request_is_not_touched() -> None:
    pristine = copy.deepcopy(TOP_AND_TOOL)
    out = pdfs_to_text(TOP_AND_TOOL, find_pdfs(TOP_AND_TOOL["messages"]))
    assert TOP_AND_TOOL == pristine
    assert out["messages"][0]["content"][0] == {
        "type": "document",
        "title": "report.pdf",
        "context": "Q3",
        "source": {"type": "text", "media_type": "text/plain", "data": REPORT_TEXT},
    }
    assert out["messages"][2]["content"][0]["content"][1]["source"] == {
        "type": "text",
        "media_type": "text/plain",
        "data": "--- Page 1 of 1 ---\nHello, world.",
    }
    # what is not on the way to a PDF is shared, not copied
    assert out["messages"][1] is TOP_AND_TOOL["messages"][1]
    assert out["messages"][0]["content"][1] is TOP_AND_TOOL["messages"][0]["content"][1]


def test_the_upstream_gets_title_context_and_page_text() -> None:
    route = ModelRoute(
        name="m",
        upstream_model="org/model",
        upstream=UpstreamConfig(name="u", base_url="http://127.0.0.1:9/v1"),
    )
    body = to_chat(pdfs_to_text(TOP_AND_TOOL, find_pdfs(TOP_AND_TOOL["messages"])), route)
    assert body["messages"][0] == {
        "role": "user",
        "content": f"report.pdf\n\nQ3\n\n{REPORT_TEXT}\nRead the other one too.",
    }
    assert body["messages"][2] == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": "PDF file read\n--- Page 1 of 1 ---\nHello, world.",
    }


# (id, request, the error message: the path names the PDF inside its container)
def _bad_in_tool_result() -> dict[str, Any]:
    return _request(
        {"role": "user", "content": "q"},
        _call("toolu_1"),
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "see"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [
                        {"type": "text", "text": "read"},
                        document(HELLO),
                        document(make_pdf([["p"]] * 120)),
                    ],
                },
            ],
        },
    )


REQUEST_REFUSED: list[tuple[str, dict[str, Any], str]] = [
    (
        "120-pages-in-a-tool-result",
        _bad_in_tool_result(),
        "messages.2.content.1.content.2.source.data: PDF has 120 pages; at most 100 are supported",
    ),
    (
        "corrupt-at-top-level",
        _request(
            {"role": "user", "content": [{"type": "text", "text": "x"}, document(HELLO[:40])]}
        ),
        "messages.0.content.1.source.data: PDF could not be read (corrupt or not a PDF)",
    ),
    (
        "101-pdfs",
        _request({"role": "user", "content": [document(HELLO)] * 101}),
        "messages.0.content.100: at most 100 PDF documents are supported in one request",
    ),
]


@pytest.mark.parametrize(
    ("req", "message"), [c[1:] for c in REQUEST_REFUSED], ids=[c[0] for c in REQUEST_REFUSED]
)
def test_request_refusals_name_the_pdf(req: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        pdfs_to_text(req, find_pdfs(req["messages"]))
    assert info.value.message == message


def test_the_text_budget_is_for_the_whole_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(documents, "MAX_TEXT_CHARS", len(REPORT_TEXT) + 10)
    with pytest.raises(InvalidRequest) as info:
        pdfs_to_text(TOP_AND_TOOL, find_pdfs(TOP_AND_TOOL["messages"]))
    assert info.value.message == (
        "messages.2.content.0.content.1.source.data: PDF text is longer than the 10 "
        "characters left for documents in this request"
    )
