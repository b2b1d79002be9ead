"""The managed settings' checksum (gateway/http/managed_settings.py) is the one Claude Code
computes: node's JSON.stringify of the deep-key-sorted settings, hashed (a subprocess: node)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from typing import Any

import pytest

from gateway.http import managed_settings as ms

# Claude Code's checksum, as its binary computes it (notes: ``function s1``): sha256 of
# JSON.stringify of the object with keys sorted at every level
_JS = """
const crypto = require("crypto");
const sort = (v) => Array.isArray(v) ? v.map(sort) : (v && typeof v === "object")
  ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, sort(v[k])])) : v;
let out = [];
for (const doc of JSON.parse(require("fs").readFileSync(0, "utf8"))) {
  out.push("sha256:" + crypto.createHash("sha256").update(JSON.stringify(sort(doc))).digest("hex"));
}
process.stdout.write(JSON.stringify(out));
"""

DOCS: list[dict[str, Any]] = [
    {},
    {
        "env": {
            "ANTHROPIC_DEFAULT_OPUS_MODEL": "claude-big",
            "ANTHROPIC_MODEL": "claude-mid",
            "CLAUDE_CODE_MAX_CONTEXT_TOKENS": "32768",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096",
            "CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY": "1",
        }
    },
    {"env": {"b": "1", "a": "2", "B": "3", "_": "4", "é": "ü", "z": "日本", "q": 'a"\\\n\t<'}},
    {"permissions": {"deny": ["Bash(rm:*)"], "allow": []}, "env": {"X": "1"}, "model": "m"},
    {"nested": {"z": {"b": [{"d": "1", "c": "2"}], "a": "x"}}, "emoji": "😀", "ctl": "\u2028"},
]


def test_the_checksum_is_the_one_claude_code_computes() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    proc = subprocess.run(
        [node, "-e", _JS], input=json.dumps(DOCS), capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    assert [ms.checksum(d) for d in DOCS] == json.loads(proc.stdout)
    # and it is no plain digest of Python's default dump
    assert (
        ms.checksum(DOCS[1]) != "sha256:" + hashlib.sha256(json.dumps(DOCS[1]).encode()).hexdigest()
    )
