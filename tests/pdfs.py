"""Tiny valid PDFs built in the tests: Helvetica text lines per page, a correct xref.

pypdf reads PDFs well but draws no text, so the bytes are written here by hand. A page
is a list of lines (drawn top-down, one ``Tj`` per line, ``T*`` between them) or None:
a page holding only a 1x1 grey image, as a scan's page holds only a picture.
"""

from __future__ import annotations

import base64
import io
import re
import zlib
from collections.abc import Sequence

from pypdf import PdfReader, PdfWriter

_IMAGE = (
    b"<< /Type /XObject /Subtype /Image /Width 1 /Height 1 /ColorSpace /DeviceGray "
    b"/BitsPerComponent 8 /Length 1 >>\nstream\n\x80\nendstream"
)


def _escape(line: str) -> bytes:
    raw = line.encode("cp1252")
    return raw.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")


def _stream(content: bytes) -> bytes:
    return b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content)


def make_pdf(pages: Sequence[Sequence[str] | None], *, catalog_extra: bytes = b"") -> bytes:
    """A PDF with one page per item; objects: catalog, page tree, font, image, pages.

    ``catalog_extra`` is written into the catalog's dictionary as it is (hostile input).
    """
    first = 5  # page i is object first + 2i, its content stream the next one
    kids = b" ".join(b"%d 0 R" % (first + 2 * i) for i in range(len(pages)))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R %s>>" % catalog_extra,
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, len(pages)),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
        _IMAGE,
    ]
    for i, lines in enumerate(pages):
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources "
            b"<< /Font << /F1 3 0 R >> /XObject << /Im1 4 0 R >> >> /Contents %d 0 R >>"
            % (first + 2 * i + 1)
        )
        if lines is None:
            objects.append(_stream(b"q 612 0 0 792 0 0 cm /Im1 Do Q"))
        else:
            shown = b" T* ".join(b"(%s) Tj" % _escape(line) for line in lines)
            objects.append(_stream(b"BT /F1 12 Tf 14 TL 72 720 Td " + shown + b" ET"))
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def hostile_pdf(operators: int = 200_000) -> bytes:
    """A PDF of about 1.4 KB whose one page runs ``operators`` no-op operators (``T*``, a
    line move, deflated about 600 to 1) before one line of text: a second or more of pypdf's
    CPU time from a request of a few kilobytes."""
    content = b"BT /F1 12 Tf " + b"T* " * operators + b"72 720 Td (Hostile) Tj ET"
    packed = zlib.compress(content, 9)
    stream = b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(packed), packed)
    pdf = make_pdf([["placeholder"]])
    start = pdf.index(b"6 0 obj\n") + len(b"6 0 obj\n")
    end = pdf.index(b"\nendobj", start)
    body = pdf[:start] + stream + pdf[end:]
    return _fix_xref(body)


def _fix_xref(pdf: bytes) -> bytes:
    """The same objects with their xref offsets recomputed (pypdf would repair it anyway,
    at a cost the tests should not measure)."""
    head, _, _ = pdf.partition(b"xref\n")
    offsets = [m.start() for m in re.finditer(rb"(?m)^\d+ 0 obj\n", head)]
    out = bytearray(head)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(offsets) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(offsets) + 1,
        xref,
    )
    return bytes(out)


def encrypt(pdf: bytes, *, user_password: str, owner_password: str = "owner") -> bytes:
    """The same PDF encrypted (RC4, which pypdf opens without a cipher library)."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf)))
    writer.encrypt(user_password=user_password, owner_password=owner_password, algorithm="RC4-128")
    buf = io.BytesIO()
    writer.write(buf)
    return buf.getvalue()


def b64(pdf: bytes) -> str:
    return base64.b64encode(pdf).decode("ascii")


def document(pdf: bytes, **fields: str) -> dict[str, object]:
    """An Anthropic base64 PDF document block."""
    return {
        "type": "document",
        **fields,
        "source": {"type": "base64", "media_type": "application/pdf", "data": b64(pdf)},
    }
