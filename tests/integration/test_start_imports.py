"""What the gateway's own process imports at start: not the libraries only another process or
an unused feature needs. Each costs idle memory and start-up time in every gateway.

- pypdf (about 14 MB): PDFs are parsed in the PDF worker processes
  (gateway/messages/documents/pdf_worker.py), which import it at their start so that their
  first job's CPU budget is not spent on the import;
- the OpenTelemetry SDK: only with ``[telemetry]`` configured;
- psycopg: only for a batch store on PostgreSQL;
- selectolax (1.8 MB): only when a web fetch reads an HTML page (imported there, under 2 ms).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.procs import REPO

# (module, what imports it and when)
NOT_AT_START = [
    ("pypdf", "the PDF workers"),
    ("opentelemetry", "[telemetry]"),
    ("psycopg", "a PostgreSQL batch store"),
    ("selectolax", "a web fetch of an HTML page"),
]


def _loaded(code: str, names: list[str]) -> list[str]:
    probe = (
        f"import sys\n{code}\n"
        f"print(' '.join(n for n in {names!r} "
        "if any(m == n or m.startswith(n + '.') for m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.split()


@pytest.mark.parametrize("module,needed_by", NOT_AT_START, ids=[m for m, _ in NOT_AT_START])
def test_the_gateways_process_does_not_import(module: str, needed_by: str) -> None:
    loaded = _loaded("import gateway.__main__, gateway.app", [module])
    assert loaded == [], f"{module} is imported at start; only {needed_by} need it"


def test_a_pdf_worker_imports_pypdf_at_its_start() -> None:
    assert _loaded("import gateway.messages.documents.pdf_worker", ["pypdf"]) == ["pypdf"]
