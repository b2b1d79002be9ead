"""docs/configuration.md is generated from the schema (gateway/ops/config_doc.py) and current."""

from __future__ import annotations

import re

from gateway.ops import config_doc, config_schema
from tests.procs import REPO

PAGE = REPO / "docs" / "configuration.md"


def test_the_committed_page_is_the_generators_output() -> None:
    assert PAGE.is_file(), f"docs/configuration.md is missing; run: {config_doc.COMMAND}"
    assert PAGE.read_text() == config_doc.render(), (
        f"docs/configuration.md is out of date with gateway/ops/config_schema.py; "
        f"run: {config_doc.COMMAND}"
    )


def _rows(section: str) -> list[str]:
    """The key cells of one section's table."""
    text = config_doc.render()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"^\| `([^`]+)` \|", text[start : end if end != -1 else None], flags=re.M)


def test_every_key_is_listed_once_and_advanced_keys_apart() -> None:
    listed = []
    for table in config_schema.TABLES:
        heading = config_doc._heading(table)
        listed += [f"{table}.{key}" for key in _rows(f"`{heading}`")]
    advanced = [key.replace("NAME", "<name>") for key in _rows("Advanced (internals)")]
    schema = config_schema.schema()
    assert sorted(listed + advanced) == sorted(schema)
    assert advanced == [p for p, k in schema.items() if k.advanced]
    assert "server.decode_offload_bytes" in advanced and "server.port" in listed


def test_a_row_shows_type_default_bounds_and_description() -> None:
    text = config_doc.render()
    assert "| `port` | integer | `8080` | 0..65535 | listen port |" in text
    assert (
        '| `keepalive` | string or boolean | `"auto"` | `auto`, `always`, `never`; '
        "`true` = `auto`; `false` = `never` |" in text
    )
    assert "| `max_results` | integer | `5` | > 0, <= 20 |" in text


def test_names_with_two_meanings_are_documented_side_by_side() -> None:
    page = config_doc.render()
    text = page[page.index("## Names with two meanings") :]
    pairs = re.findall(r"^\| `(\w+)` \| `([^`]+)` \|", text, flags=re.M)
    assert pairs == [
        ("max_body_bytes", "server.max_body_bytes"),
        ("max_body_bytes", "batches.max_body_bytes"),
        ("idle_timeout", "server.idle_timeout"),
        ("idle_timeout", "upstreams.NAME.idle_timeout"),
        ("max_response_bytes", "upstreams.NAME.max_response_bytes"),
        ("max_response_bytes", "web_search.max_response_bytes"),
        ("name", "models[].name"),
        ("name", "clients[].name"),
        ("max_concurrency", "models[].max_concurrency"),
        ("max_concurrency", "clients[].max_concurrency"),
        ("enabled", "batches.enabled"),
        ("enabled", "web_fetch.enabled"),
        ("enabled", "auth.enabled"),
    ]
    # each meaning names another key of its name
    for name, path in pairs:
        others = [p for n, p in pairs if n == name and p != path]
        row = next(line for line in text.splitlines() if f"| `{path}` |" in line)
        assert any(f"`{other}`" in row for other in others), row
