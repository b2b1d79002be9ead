"""PDF documents through the real gateway process: the upstream gets their text.

The Python SDK sends what Claude Code sends: a base64 ``application/pdf`` document at top
level, and one inside a ``tool_result`` (its Read tool on a PDF). The scripted stub
upstream records what it received (``GET /_requests``).
"""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests import sdk
from tests.conftest import clear_stub, stub_config, stub_requests
from tests.logs import log_lines
from tests.pdfs import document, make_pdf

pytestmark = pytest.mark.e2e

REPORT = make_pdf([["Quarterly report", "Revenue rose 12%."], ["Costs fell 3%."]])
NOTES = make_pdf([["Meeting notes: ship Friday."]])


def _messages(notes: bytes) -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": [
                document(REPORT, title="report.pdf"),
                {"type": "text", "text": "Summarize; then read notes."},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "Read",
                    "input": {"file_path": "/w/notes.pdf"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": [{"type": "text", "text": "PDF file read"}, document(notes)],
                }
            ],
        },
    ]


def test_pdfs_reach_the_upstream_as_text_with_page_markers(stub_url, gateway_factory) -> None:
    _, url = gateway_factory(stub_config(stub_url, models=("ok",)))
    clear_stub(stub_url)
    client = sdk.client(url + "/llm", api_key="k", max_retries=0)
    msg = client.messages.create(model="m-ok", max_tokens=30, messages=_messages(NOTES))
    assert msg.content[0].text == "Hello from the stub."
    (seen,) = stub_requests(stub_url)
    messages = seen["body"]["messages"]
    assert messages[0] == {
        "role": "user",
        "content": "report.pdf\n\n--- Page 1 of 2 ---\nQuarterly report\nRevenue rose 12%.\n\n"
        "--- Page 2 of 2 ---\nCosts fell 3%.\nSummarize; then read notes.",
    }
    assert messages[2] == {
        "role": "tool",
        "tool_call_id": "toolu_01",
        "content": "PDF file read\n--- Page 1 of 1 ---\nMeeting notes: ship Friday.",
    }
    assert "JVBERi" not in seen["raw"]  # no base64 PDF ("%PDF-") went upstream


@pytest.mark.parametrize("route", ["messages", "count_tokens"])
def test_a_corrupt_pdf_is_a_400_naming_the_field(stub_url, gateway_factory, route) -> None:
    proc, url = gateway_factory(stub_config(stub_url, models=("ok",)))
    clear_stub(stub_url)
    client = sdk.client(url + "/llm", api_key="k", max_retries=0)
    call = client.messages.create if route == "messages" else client.messages.count_tokens
    kwargs = {"max_tokens": 30} if route == "messages" else {}
    with pytest.raises(anthropic.BadRequestError) as err:
        call(model="m-ok", messages=_messages(NOTES[:100]), **kwargs)  # type: ignore[operator]
    assert err.value.status_code == 400
    assert err.value.body["error"] == {  # type: ignore[index]
        "type": "invalid_request_error",
        "message": "messages.2.content.0.content.1.source.data: PDF could not be read "
        "(corrupt or not a PDF)",
    }
    assert stub_requests(stub_url) == []  # refused before any upstream call
    proc.stop()
    log_lines(proc.output(), strict=True)  # pypdf's complaints stay out of the log


def test_count_tokens_counts_the_text(stub_url, gateway_factory) -> None:
    _, url = gateway_factory(stub_config(stub_url, models=("ok",)))
    client = sdk.client(url + "/llm", api_key="k", max_retries=0)
    counted = client.messages.count_tokens(model="m-ok", messages=_messages(NOTES))
    # the stub's kind has no tokenizer: an estimate of 4 bytes a token of the text sent,
    # far below what the base64 of the two PDFs would be
    assert 0 < counted.input_tokens < (len(REPORT) + len(NOTES)) // 4
