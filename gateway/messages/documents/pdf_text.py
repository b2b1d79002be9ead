"""PDF documents become text, page by page (pure: data in, data out; no I/O, no awaits).

Protocol facts relied on (Anthropic Messages API; Claude Code's Read tool):

- A PDF arrives as a ``document`` block with a base64 source,
  ``{"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
  "data": "..."}}``, either in a user turn or inside a ``tool_result``'s content list
  (Claude Code's Read of a PDF puts one there, and it stays in the history). An
  OpenAI-compatible upstream reads no PDF, so the gateway sends the PDF's text instead:
  the source becomes ``{"type": "text", "media_type": "text/plain", "data": TEXT}`` and
  ``to_chat`` renders it as any text document, after the block's ``title`` and ``context``.
- The API's limits apply: a PDF of at most 32 MB and 100 pages, and at most 100 PDFs
  (media items) in one request.

The text (:func:`pdf_text`) gives every page a marker line, pages apart by a blank line::

    --- Page 1 of 2 ---
    First page's text
    <blank line>
    --- Page 2 of 2 ---
    [no text on this page]

A page without extractable text (a scan, a figure) keeps its marker and says so; a PDF
in which no page has any text is refused (the model could read nothing of it).

Every failure is :class:`gateway.errors.InvalidRequest` naming the field
(``messages.3.content.0.content.1.source.data: PDF has 120 pages; at most 100 are
supported``): invalid base64, too large, too many pages, encrypted with a password,
corrupt, text-less, too much text. pypdf parses hostile input: anything it raises,
RecursionError from a deep object graph included, is a corrupt PDF. The work is bounded
by the page and PDF caps, by pypdf's own decompression caps (75 MB a stream), and by
:data:`MAX_TEXT_CHARS` for the whole request, checked while a page is being extracted.
It is still CPU work without a bound of its own (a 1.4 KB PDF of 200,000 no-op drawing
operators costs 2.3 CPU seconds): the gateway reads PDFs in worker processes, under a
CPU-time budget per document and per request, killed when the client leaves
(:mod:`gateway.messages.documents.pdf_pool`), and only when :func:`find_pdfs` found a PDF (a walk of
user blocks, without copies).
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.errors import InvalidRequest

__all__ = [
    "MAX_PAGES",
    "MAX_PDFS",
    "MAX_PDF_BYTES",
    "MAX_TEXT_CHARS",
    "Location",
    "check_count",
    "find_pdfs",
    "location_path",
    "pdf_data",
    "pdf_text",
    "pdfs_to_text",
    "with_texts",
]

PDF = "application/pdf"
MAX_PDF_BYTES = 32 * 1024 * 1024
MAX_PAGES = 100
MAX_PDFS = 100
# About a million tokens: more than any upstream's context, so no real request meets it.
MAX_TEXT_CHARS = 4_000_000
NO_TEXT = "[no text on this page]"

# (message index, block index, index inside a tool_result's content or None)
Location = tuple[int, int, int | None]


def _is_pdf(block: Mapping[str, Any]) -> bool:
    source = block["source"]
    return source["type"] == "base64" and source.get("media_type") == PDF


def find_pdfs(messages: Sequence[Any]) -> list[Location]:
    """Where a validated request's base64 PDFs are: user blocks and tool_result content only."""
    found: list[Location] = []
    for i, msg in enumerate(messages):
        if msg["role"] != "user":
            continue
        content = msg["content"]
        if isinstance(content, str):
            continue
        for j, block in enumerate(content):
            kind = block["type"]
            if kind == "document":
                if _is_pdf(block):
                    found.append((i, j, None))
            elif kind == "tool_result":
                inner = block.get("content")
                if isinstance(inner, list):
                    for k, item in enumerate(inner):
                        if item["type"] == "document" and _is_pdf(item):
                            found.append((i, j, k))
    return found


def pdfs_to_text(req: Mapping[str, Any], where: Sequence[Location]) -> dict[str, Any]:
    """A copy of ``req`` with the PDF at each of ``where`` replaced by its text, read here
    (in this thread, without CPU bounds: the gateway reads them in :mod:`.pdf_pool`).

    Raises InvalidRequest naming the first PDF that cannot be read.
    """
    check_count(where)
    texts: list[str] = []
    budget = MAX_TEXT_CHARS
    for loc in where:
        text = pdf_text(pdf_data(req, loc), f"{location_path(*loc)}.source.data", budget)
        texts.append(text)
        budget -= len(text)
    return with_texts(req, where, texts)


def check_count(where: Sequence[Location]) -> None:
    """At most :data:`MAX_PDFS` PDFs in one request (checked before any work)."""
    if len(where) > MAX_PDFS:
        raise InvalidRequest(
            _path(*where[MAX_PDFS]),
            f"at most {MAX_PDFS} PDF documents are supported in one request",
        )


def pdf_data(req: Mapping[str, Any], loc: Location) -> str:
    """The base64 data of the PDF at ``loc``."""
    i, j, k = loc
    block = req["messages"][i]["content"][j]
    if k is not None:
        block = block["content"][k]
    data: str = block["source"]["data"]
    return data


def with_texts(
    req: Mapping[str, Any], where: Sequence[Location], texts: Sequence[str]
) -> dict[str, Any]:
    """A copy of ``req`` with the PDF at each of ``where`` replaced by its text.

    Only the containers on the way to a PDF are copied; the client's dicts are left as
    they were.
    """
    original = req["messages"]
    messages = list(original)
    for (i, j, k), text in zip(where, texts, strict=True):
        if messages[i] is original[i]:  # the turn's first PDF: copy the turn and its list
            messages[i] = {**original[i], "content": list(original[i]["content"])}
        holder = messages[i]["content"]
        index = j
        if k is not None:
            if holder[j] is original[i]["content"][j]:  # the result's first PDF: copy it
                holder[j] = {**holder[j], "content": list(holder[j]["content"])}
            holder = holder[j]["content"]
            index = k
        holder[index] = _as_text(holder[index], text)
    return {**req, "messages": messages}


def location_path(i: int, j: int, k: int | None) -> str:
    """The document's path in the request: ``messages.N.content.M`` (``.content.K`` in a
    tool_result)."""
    return _path(i, j, k)


def _path(i: int, j: int, k: int | None) -> str:
    return f"messages.{i}.content.{j}" + ("" if k is None else f".content.{k}")


def _as_text(block: Mapping[str, Any], text: str) -> dict[str, Any]:
    return {**block, "source": {"type": "text", "media_type": "text/plain", "data": text}}


class _TooMuchText(Exception):
    pass


def pdf_text(data: str, path: str, max_chars: int = MAX_TEXT_CHARS) -> str:
    """The text of the base64 PDF ``data`` with page markers; ``path`` names the field."""
    if len(data) > (MAX_PDF_BYTES + 2) // 3 * 4:  # before decoding what is surely too large
        raise InvalidRequest(path, f"PDF is larger than {MAX_PDF_BYTES // (1024 * 1024)} MB")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(path, "PDF data is not valid base64") from None
    if len(raw) > MAX_PDF_BYTES:
        raise InvalidRequest(path, f"PDF is larger than {MAX_PDF_BYTES // (1024 * 1024)} MB")
    try:
        return _extract(raw, path, max_chars)
    except InvalidRequest:
        raise
    except _TooMuchText:
        raise InvalidRequest(
            path,
            f"PDF text is longer than the {max_chars} characters "
            "left for documents in this request",
        ) from None
    except Exception:  # pypdf on hostile input: any error, RecursionError included
        raise InvalidRequest(path, "PDF could not be read (corrupt or not a PDF)") from None


def _extract(raw: bytes, path: str, max_chars: int) -> str:
    # imported here: this module's finding and bounding run in the gateway's process, which
    # never parses a PDF (14 MB of its idle memory); the PDF workers import pypdf at start
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(raw))
    if reader.is_encrypted:
        # An owner password alone (printing or copying restricted) still opens with "".
        try:
            opened = bool(reader.decrypt(""))
        except Exception:  # e.g. an AES key and no cipher library: it stays closed
            opened = False
        if not opened:
            raise InvalidRequest(path, "PDF is encrypted with a password; send it decrypted")
    count = len(reader.pages)
    if count > MAX_PAGES:
        raise InvalidRequest(path, f"PDF has {count} pages; at most {MAX_PAGES} are supported")
    if count == 0:
        raise InvalidRequest(path, "PDF has no pages")
    seen = 0

    def on_text(text: str, *_: Any) -> None:  # stops a page whose text runs past the budget
        nonlocal seen
        seen += len(text)
        if seen > max_chars:
            raise _TooMuchText

    pages: list[str] = []
    any_text = False
    for number, page in enumerate(reader.pages, 1):
        text = page.extract_text(visitor_text=on_text).strip()
        any_text = any_text or bool(text)
        pages.append(f"--- Page {number} of {count} ---\n{text or NO_TEXT}")
    if not any_text:
        raise InvalidRequest(
            path,
            "PDF has no extractable text (its pages are images, "
            "e.g. a scan); only a PDF's text reaches this model",
        )
    out = "\n\n".join(pages)
    if len(out) > max_chars:
        raise _TooMuchText
    return out
