"""The pass-through's model rewrite: bytes kept exactly, only ``model`` changes."""

from __future__ import annotations

import pytest

from gateway.chat import _ModelRewriter, _usage

CASES = [
    # (upstream_model, payload, expected)
    ("org/m", b'{"id":"1","model":"org/m","choices":[]}',
     b'{"id":"1","model":"alias","choices":[]}'),
    ("org/m", b'{"model":"org/m","x":"\\"model\\":\\"org/m\\""}',
     b'{"model":"alias","x":"\\"model\\":\\"org/m\\""}'),  # text inside strings untouched
    ("org/m", b'{"id": "1", "model": "org/m"}', b'{"id":"1","model":"alias"}'),  # re-encoded
    ("org/m", b'{"id":"1"}', b'{"id":"1"}'),
    ("org/m", b"[DONE]", b"[DONE]"),
    ("org/m", b'{"model":"org/m"', b'{"model":"alias"'),  # not JSON, still the pair
]


@pytest.mark.parametrize("upstream_model,payload,expected", CASES)
def test_rewrite(upstream_model: str, payload: bytes, expected: bytes) -> None:
    assert _ModelRewriter(upstream_model, "alias")(payload) == expected


def test_upstream_reporting_another_name_is_learned_once() -> None:
    rewrite = _ModelRewriter("demo", "alias")
    first = b'{"model":"/models/tiny.gguf","choices":[{"delta":{"content":"a"}}]}'
    second = b'{"model":"/models/tiny.gguf","choices":[{"delta":{"content":"b"}}]}'
    assert rewrite(first) == first.replace(b"/models/tiny.gguf", b"alias")
    assert rewrite._needle == b'"model":"/models/tiny.gguf"'  # the fast path from now on
    assert rewrite(second) == second.replace(b"/models/tiny.gguf", b"alias")


@pytest.mark.parametrize("payload,expected", [
    (b'{"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}', (12, 5)),
    (b'{"choices":[],"usage": {"prompt_tokens": 3, "completion_tokens": 0}}', (3, 0)),
    (b'{"usage":null}', None),
    (b'{"choices":[{"delta":{"content":"\\"prompt_tokens\\":9"}}]}', None),
])
def test_usage_is_read_without_parsing(payload: bytes, expected: tuple[int, int] | None) -> None:
    assert _usage(payload) == expected
