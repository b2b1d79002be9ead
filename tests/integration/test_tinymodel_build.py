"""The tiny model built for real (a few MiB of GGUF, seconds each): the same bytes twice, the
metadata and the output head wired as the plan says, a cache that builds once; and the module
importing in a fresh interpreter without the demo extra."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.demo import tinymodel
from gateway.demo.tinymodel import ANSWER_TEXT, build_tiny_model, ensure_model, expectations

needs_gguf = pytest.mark.skipif(
    importlib.util.find_spec("gguf") is None or importlib.util.find_spec("numpy") is None,
    reason="gguf/numpy (the demo extra) not installed",
)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_module_imports_without_the_demo_extra():
    code = (
        "import sys; sys.modules['gguf'] = None; sys.modules['numpy'] = None; "
        "sys.modules['xllamacpp'] = None; "
        "import gateway.demo.tinymodel as t, gateway.demo.llama; "
        "print(t.expectations()['answer'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=_repo()
    )
    assert out.stdout.strip() == ANSWER_TEXT


def _repo() -> str:
    return str(Path(__file__).resolve().parents[2])


# --- the written file -----------------------------------------------------------------------


@needs_gguf
def test_build_is_deterministic_and_returns_expectations(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    assert build_tiny_model(str(a)) == expectations()
    build_tiny_model(str(b))
    assert _sha(a) == _sha(b)
    assert a.stat().st_size < 6_000_000  # two 16k x 64 tables in f16, the rest is small


@needs_gguf
def test_gguf_metadata_and_head_wiring(tmp_path):
    import gguf
    import numpy as np

    path = tmp_path / "m.gguf"
    build_tiny_model(str(path))
    reader = gguf.GGUFReader(str(path))

    def field(name):
        f = reader.fields[name]
        return f.contents() if hasattr(f, "contents") else f.parts[f.data[0]]

    plan = tinymodel._plan()
    assert field("general.architecture") == "llama"
    assert field("tokenizer.chat_template") == tinymodel.CHAT_TEMPLATE
    assert field("tokenizer.ggml.model") == "gpt2"
    assert field("tokenizer.ggml.tokens") == plan.tokens
    assert int(field("tokenizer.ggml.eos_token_id")) == plan.ids["<|im_end|>"]

    assert field("tokenizer.ggml.pre") == "gpt-2"
    assert field("tokenizer.ggml.merges") == [f"{a} {b}" for a, b in plan.merges]

    tensors = {t.name: np.asarray(t.data, dtype=np.float32) for t in reader.tensors}
    embed, head = tensors["token_embd.weight"], tensors["output.weight"]
    # a copy token's own code reads as its character, as the copy head's output does
    successor = {**dict(plan.edges), **plan.copies}
    expected = np.array([successor.get(t, plan.default_next) for t in range(len(plan.tokens))])
    h = embed / np.sqrt(np.mean(embed**2, axis=1, keepdims=True))  # RMS norm, weight 1
    # every logit of a head row that is all zero is exactly 0: compute only the others
    live = np.flatnonzero(np.abs(head).sum(axis=1))
    assert len(live) < len(plan.tokens)
    logits = np.concatenate([h @ head[live].T, np.zeros((len(h), 1))], axis=1)
    columns = np.append(live, -1)  # -1: any token of a zero row
    top2 = np.sort(np.partition(logits, -2, axis=1)[:, -2:], axis=1)
    assert (columns[np.argmax(logits, axis=1)] == expected).all()
    assert (top2[:, 1] - top2[:, 0] > 50).all()  # deterministic under any usual sampling


# --- the cache ------------------------------------------------------------------------------


@needs_gguf
def test_ensure_model_builds_once(tmp_path, monkeypatch):
    path, expect = ensure_model(str(tmp_path))
    assert expect == expectations()
    assert Path(path).parent == tmp_path
    assert f"v{tinymodel.GENERATOR_VERSION}" in Path(path).name
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"

    def boom(_path):
        raise AssertionError("rebuilt a cached model")

    monkeypatch.setattr(tinymodel, "build_tiny_model", boom)
    assert ensure_model(str(tmp_path)) == (path, expect)
    assert [p.name for p in tmp_path.iterdir()] == [Path(path).name]
