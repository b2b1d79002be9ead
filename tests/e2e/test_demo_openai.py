"""``llm-gateway --demo`` as OpenAI clients see it: only the demo's models, and the OpenAI
SDK's ``responses.stream()`` over the pass-through to the demo's llama.cpp.

llama.cpp's Responses stream carries no ``output_index`` / ``content_index`` /
``sequence_number``; the SDK keys its snapshot by ``output_index`` and raised "Duplicate
response output index None" at the demo's second output item (reasoning, then the message)
until the gateway filled them in (gateway/openai/responses_index.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.demo.tinymodel import ANSWER_TEXT
from tests.procs import Proc, free_port, get, require_demo_extra, wait_http

pytestmark = [pytest.mark.e2e, pytest.mark.llamacpp]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_demo_extra()
    if importlib.util.find_spec("openai") is None:
        reason = "openai is not installed (pip install '.[test]')"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    tmp: Path = tmp_path_factory.mktemp("demo-openai")
    port = free_port()
    proc = Proc(
        [sys.executable, "-m", "gateway", "--demo", "--port", str(port)],
        env={"XDG_STATE_HOME": str(tmp / "state"), "GATEWAY_CONFIG": ""},
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=120, proc=proc.popen)
        yield f"http://127.0.0.1:{port}/llm"
    finally:
        proc.stop()


def test_models_lists_only_what_the_demo_serves(demo: str) -> None:
    status, _, raw = get(demo + "/v1/models", {"anthropic-version": "2023-06-01"})
    assert status == 200
    assert {m["id"] for m in json.loads(raw)["data"]} == {"demo"}  # a pattern is never listed


def test_openai_sdk_responses_stream_accepts_the_demo_stream(demo: str) -> None:
    import openai

    client = openai.OpenAI(base_url=demo + "/v1", api_key="x", max_retries=0)
    try:
        with client.responses.stream(model="demo", input="hi", max_output_tokens=200) as stream:
            kinds = [event.type for event in stream]
            final = stream.get_final_response()
    finally:
        client.close()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert final.output_text == ANSWER_TEXT
    assert [item.type for item in final.output] == ["reasoning", "message"]
