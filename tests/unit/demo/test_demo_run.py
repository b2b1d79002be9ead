"""``--demo``'s start-up line names the llama.cpp child's pid, not the gateway's."""

from __future__ import annotations

import pytest

from gateway.demo import llama, run, tinymodel
from gateway.ops import config, log
from tests.logs import log_lines, matching


class _FakeServer:
    pid = 424242

    def __init__(self, *_: object, **__: object) -> None:
        self.stopped = False

    def start(self, timeout: float) -> str:
        return "http://127.0.0.1:9"

    def stop(self) -> None:
        self.stopped = True


def test_demo_upstream_started_logs_the_child_pid(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(llama, "LlamaServer", _FakeServer)
    monkeypatch.setattr(tinymodel, "ensure_model", lambda: ("/nonexistent.gguf", None))
    served: list[config.Config] = []

    async def serve(cfg: config.Config) -> None:
        served.append(cfg)

    log.configure("info")
    assert run.run_demo(config.load(None, {}), serve, explicit_config=False) == 0
    log.flush()
    started = matching(log_lines(capfd.readouterr().err), "demo_upstream_started")
    assert started and started[0]["upstream_pid"] == _FakeServer.pid
    assert served and "demo" in served[0].models
    # only what the demo serves: not the built-in default's reasoning / qwen2.5 routes
    assert set(served[0].models) == {"demo", "claude-*"}
    assert set(served[0].upstreams) == {"demo-llamacpp"}
