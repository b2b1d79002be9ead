"""A reply's figures written through the kept children (ops/reply_series.py ReplySeries) make the
exposition the labels() calls make: the same values, and no series created before it is
written."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.messages.from_chat.figures import Figures
from gateway.ops.metrics import Metrics

# (a reply's figures, as Figures fields): buffered, streamed, cut, hidden reasoning, bare
REPLIES: list[dict[str, Any]] = [
    {"overhead": 0.002, "stop_reason": "end_turn", "usage": (12, 34)},
    {
        "streamed": True,
        "overhead": 0.001,
        "ttft": 0.25,
        "decode": 1.5,
        "decoded": 30,
        "stop_reason": "tool_use",
        "termination": "complete",
        "usage": (5, 31),
    },
    {"streamed": True, "termination": "client_disconnect"},
    {"reasoning_hidden": 2, "stop_reason": "max_tokens", "usage": (1, 2), "api": "chat"},
    {},
]


def _figures(fields: dict[str, Any], model: str) -> Figures:
    figures = Figures(
        model,
        overhead=fields.get("overhead"),
        streamed=fields.get("streamed", False),
        api=fields.get("api", "messages"),
    )
    for name in ("ttft", "decode", "decoded", "stop_reason", "termination", "usage"):
        if name in fields:
            setattr(figures, name, fields[name])
    figures.reasoning_hidden = fields.get("reasoning_hidden", 0)
    return figures


def _by_labels(metrics: Metrics, figures: Figures) -> None:
    """What Figures.write wrote before the kept children: one labels() call a series."""
    model, api = figures.model, figures.api
    if figures.overhead is not None:
        metrics.overhead.labels(api).observe(figures.overhead)
    if figures.streamed:
        if figures.ttft is not None:
            metrics.ttft.labels(api, model).observe(figures.ttft)
        if figures.decoded:
            metrics.tpot.labels(model).observe(figures.decode / figures.decoded)
    if figures.reasoning_hidden:
        metrics.reasoning_hidden.labels(model).inc(figures.reasoning_hidden)
    if figures.stop_reason:
        metrics.stop_reasons.labels(model, figures.stop_reason).inc()
    if figures.termination is not None:
        metrics.terminations.labels(api, model, figures.termination).inc()
    metrics.count_tokens(model, figures.usage)


@pytest.mark.parametrize("configured", [True, False])
def test_a_replys_figures_expose_what_the_labels_calls_exposed(configured: bool) -> None:
    written, expected = Metrics(CollectorRegistry()), Metrics(CollectorRegistry())
    if configured:  # its series made at zero; otherwise none before it is written
        for metrics in (written, expected):
            metrics.add_model("m", "up", "up-m")
    for _ in range(2):  # the second time through the kept children
        for fields in REPLIES:
            _figures(fields, "m").write(written)
            _by_labels(expected, _figures(fields, "m"))
    got = generate_latest(written.registry)
    assert got == generate_latest(expected.registry)
    assert b'llm_gateway_tokens_total{model="m",type="output"} 134.0' in got


def test_a_reply_creates_no_series_it_did_not_write() -> None:
    metrics = Metrics(CollectorRegistry())
    before = generate_latest(metrics.registry)
    _figures({}, "unconfigured").write(metrics)
    assert generate_latest(metrics.registry) == before
    assert metrics.reply_series("messages", "unconfigured") is metrics.reply_series(
        "messages", "unconfigured"
    )
