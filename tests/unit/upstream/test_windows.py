"""The engines' context windows read from their own answers (gateway/upstream/windows.py):
golden answers (llama.cpp's recorded from the real server, the others written from their
servers' sources: tests/golden/engine_windows/README.md) and hostile values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.upstream import windows

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "engine_windows"


@pytest.mark.parametrize(
    ("kind", "model", "file", "want"),
    [
        ("llamacpp", "demo", "llamacpp_props.json", 1024),  # 2048 / 2 slots, as served
        ("llamacpp", "anything", "llamacpp_props.json", 1024),  # one model per server
        ("vllm", "Qwen/Qwen3-32B", "vllm_v1_models.json", 32768),
        ("vllm", "sql-lora", "vllm_v1_models.json", 32768),
        ("openai", "Qwen/Qwen3-32B", "vllm_v1_models.json", None),  # not a kind that says
        ("sglang", "Qwen/Qwen3-8B", "sglang_v1_models.json", 40960),
        ("sglang", "my-lora", "sglang_v1_models.json", 40960),  # null: its parent's
        ("sglang", "default", "sglang_v1_models.json", 40960),  # SGLang serves any name
        ("ollama", "qwen3:8b", "ollama_show.json", 40960),  # the trained length
        ("ollama", "qwen3:8b", "ollama_show_num_ctx.json", 16384),  # num_ctx wins
        ("llamacpp", "demo", "vllm_v1_models.json", None),  # another engine's shape
        ("ollama", "demo", "llamacpp_props.json", None),
    ],
)
def test_golden_answers(kind: str, model: str, file: str, want: int | None) -> None:
    assert windows.parse(kind, model, (GOLDEN / file).read_bytes()) == want


def test_the_recorded_props_are_the_real_server_s() -> None:
    """The recording holds what the tests' llama-server (2048 tokens, 2 slots) says."""
    doc = json.loads((GOLDEN / "llamacpp_props.json").read_bytes())
    assert doc["total_slots"] == 2 and doc["default_generation_settings"]["n_ctx"] == 1024


HOSTILE: list[tuple[str, Any, int | None]] = [
    ("int", 4096, 4096),
    ("one", 1, 1),
    ("the cap", windows.MAX_WINDOW, windows.MAX_WINDOW),
    ("past the cap", windows.MAX_WINDOW + 1, None),
    ("huge", 10**30, None),
    ("zero", 0, None),
    ("negative", -4096, None),
    ("string", "4096", None),
    ("float", 4096.0, None),
    ("true", True, None),
    ("null", None, None),
    ("list", [4096], None),
    ("object", {"n_ctx": 4096}, None),
]


@pytest.mark.parametrize(("case", "value", "want"), HOSTILE, ids=[c[0] for c in HOSTILE])
def test_a_window_is_a_sane_integer(case: str, value: Any, want: int | None) -> None:
    assert windows.window(value) == want


def _props(n_ctx: Any) -> bytes:
    return json.dumps({"default_generation_settings": {"n_ctx": n_ctx}}).encode()


def _models(*cards: dict[str, Any]) -> bytes:
    return json.dumps({"object": "list", "data": list(cards)}).encode()


def _show(parameters: Any, info: Any) -> bytes:
    return json.dumps({"parameters": parameters, "model_info": info}).encode()


@pytest.mark.parametrize(
    ("kind", "body", "want"),
    [
        # each hostile value in each engine's place
        *[("llamacpp", _props(v), w) for _, v, w in HOSTILE],
        *[("vllm", _models({"id": "m", "max_model_len": v}), w) for _, v, w in HOSTILE],
        *[
            ("ollama", _show("", {"general.architecture": "a", "a.context_length": v}), w)
            for _, v, w in HOSTILE
        ],
        # missing and malformed
        ("llamacpp", b"{}", None),
        ("llamacpp", json.dumps({"n_ctx": 2048}).encode(), 2048),  # top-level n_ctx
        ("llamacpp", json.dumps({"default_generation_settings": []}).encode(), None),
        ("llamacpp", b"[1024]", None),
        ("llamacpp", b"not json", None),
        ("llamacpp", b"", None),
        ("llamacpp", b'{"default_generation_settings":{"n_ctx":NaN}}', None),
        ("llamacpp", b'{"n_ctx":' + b"9" * 5000 + b"}", None),  # a number past 4300 digits
        ("llamacpp", _props(1024) + b" " * windows.MAX_REPLY_BYTES, None),  # too large
        ("vllm", b'{"data":"x"}', None),
        ("vllm", b'{"data":[1,"a",null]}', None),
        ("vllm", _models({"id": "other", "max_model_len": 8192}), 8192),  # one window: taken
        (
            "vllm",
            _models({"id": "a", "max_model_len": 8192}, {"id": "b", "max_model_len": 4096}),
            None,  # no card of its own and no agreement: unknown
        ),
        ("sglang", _models({"id": "m", "max_model_len": None, "parent": "m"}), None),
        ("ollama", _show("num_ctx                        8192", {}), 8192),
        ("ollama", _show("num_ctx -1", {"general.architecture": "a", "a.context_length": 9}), None),
        ("ollama", _show("num_ctx 1e9", {}), None),
        ("ollama", _show("num_ctx ٨١٩٢", {}), None),  # Arabic-Indic digits
        ("ollama", _show("num_ctx " + "9" * 5000, {}), None),
        ("ollama", _show(["num_ctx 8192"], {"x.context_length": 2048}), 2048),
        ("ollama", _show(None, {"general.architecture": 7, "q.context_length": 2048}), 2048),
        ("ollama", _show(None, {"a.context_length": 1, "b.context_length": 2}), None),
        ("ollama", _show(None, None), None),
        ("unknown-kind", _props(1024), None),
    ],
)
def test_engine_answers(kind: str, body: bytes, want: int | None) -> None:
    assert windows.parse(kind, "m", body) == want


def test_what_is_asked_of_each_kind() -> None:
    assert windows.ask("vllm", "m") == windows.Ask("GET", "/models", root=False)
    assert windows.ask("sglang", "m") == windows.Ask("GET", "/models", root=False)
    assert windows.ask("llamacpp", "m") == windows.Ask("GET", "/props", root=True)
    show = windows.ask("ollama", 'q"3')
    assert show is not None and (show.method, show.path, show.root) == ("POST", "/api/show", True)
    assert json.loads(show.body or b"") == {"model": 'q"3', "name": 'q"3'}
    assert windows.ask("openai", "m") is None and windows.ask("nonesuch", "m") is None
