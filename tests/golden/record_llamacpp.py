"""Record raw replies of a real llama.cpp server (xllamacpp) serving the tiny generated model.

    python tests/golden/record_llamacpp.py [OUT_DIR]      # default: tests/golden/recorded/

Writes the bytes exactly as the server sent them (ids, timestamps and timings change per run):

* ``llamacpp_stream_thinking.sse``  default template (thinking), ``include_usage``
* ``llamacpp_stream_nothink.sse``   ``chat_template_kwargs: {"enable_thinking": false}``
* ``llamacpp_stream_length.sse``    ``max_tokens: 4`` (ends inside the reasoning)
* ``llamacpp_stream_stop.sse``      ``stop: [" demo"]`` (ends inside the answer)
* ``llamacpp_buffered_thinking.json``  the buffered reply body
* ``llamacpp_context_overflow.json``   ``{"status", "content_type", "body"}`` of a too-long prompt
* ``llamacpp_stream_midstream_error.sse``  a stream cut by the shared-context overflow of two
  concurrent generations (2 slots, one unified 256-token KV cache)
* ``requests.json``  the request body behind each file

The server answers as model ``demo`` (its alias), as the gateway's demo serves it.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway.demo.llama import LlamaServer  # noqa: E402
from gateway.demo.tinymodel import ensure_model  # noqa: E402

HI = [{"role": "user", "content": "hi"}]
USAGE = {"include_usage": True}

STREAMS: dict[str, dict[str, Any]] = {
    "llamacpp_stream_thinking.sse": {"messages": HI, "stream_options": USAGE},
    "llamacpp_stream_nothink.sse": {
        "messages": HI,
        "stream_options": USAGE,
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "llamacpp_stream_length.sse": {"messages": HI, "stream_options": USAGE, "max_tokens": 4},
    "llamacpp_stream_stop.sse": {"messages": HI, "stream_options": USAGE, "stop": [" demo"]},
}
BUFFERED = {"llamacpp_buffered_thinking.json": {"messages": HI}}
OVERFLOW = {"messages": [{"role": "user", "content": "x" * 1100}]}  # > 1024 tokens per slot
MIDSTREAM = {
    "stream": True,
    "stream_options": USAGE,
    "max_tokens": 200,
    "ignore_eos": True,  # keep going past <|im_end|> so two replies overflow 256 tokens
}


def _post(url: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.headers.get("Content-Type", ""), err.read()


def _chat(base: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    return _post(f"{base}/chat/completions", {"model": "demo", **body})


def _record_basic(base: str, out: Path, requests: dict[str, Any]) -> None:
    for name, body in STREAMS.items():
        body = {"stream": True, **body}
        status, _, raw = _chat(base, body)
        assert status == 200, raw
        (out / name).write_bytes(raw)
        requests[name] = body
    for name, body in BUFFERED.items():
        status, _, raw = _chat(base, body)
        assert status == 200, raw
        (out / name).write_bytes(raw)
        requests[name] = body
    status, ctype, raw = _chat(base, OVERFLOW)
    record = {"status": status, "content_type": ctype, "body": json.loads(raw)}
    (out / "llamacpp_context_overflow.json").write_text(json.dumps(record, indent=2) + "\n")
    requests["llamacpp_context_overflow.json"] = {**OVERFLOW, "messages": "[user: 'x' * 1100]"}


def _record_midstream(base: str, out: Path, requests: dict[str, Any], tries: int = 5) -> bool:
    for _ in range(tries):
        results: list[bytes] = []

        def run(i: int, results: list[bytes] = results) -> None:
            body = {**MIDSTREAM, "messages": [{"role": "user", "content": f"hello {i}"}]}
            results.append(_chat(base, body)[2])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        broken = [raw for raw in results if b'data: {"error"' in raw]
        if broken:
            (out / "llamacpp_stream_midstream_error.sse").write_bytes(broken[0])
            requests["llamacpp_stream_midstream_error.sse"] = {
                **MIDSTREAM,
                "messages": [{"role": "user", "content": "hello 0 (and hello 1 at once)"}],
                "_server": "n_ctx=256, n_parallel=2, kv_unified=true; two requests at once",
            }
            return True
    return False


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path(__file__).resolve().parent / "recorded"
    out.mkdir(parents=True, exist_ok=True)
    requests: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model, _ = ensure_model(tmp)
        with LlamaServer(model, ctx_size=2048, parallel=2, alias="demo") as server:
            assert server.base_url is not None
            _record_basic(server.base_url, out, requests)
        unified = LlamaServer(
            model, ctx_size=256, parallel=2, alias="demo", extra_args=("kv_unified=true",)
        )
        with unified:
            assert unified.base_url is not None
            got = _record_midstream(unified.base_url, out, requests)
    (out / "requests.json").write_text(json.dumps(requests, indent=2) + "\n")
    print(f"recorded into {out}" + ("" if got else " (no mid-stream error provoked)"))
    return 0 if got else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
