"""Every metric family a fresh ``Metrics`` defines, compared with a golden file.

The golden (``metrics_golden.txt`` here) lists, per attribute of ``Metrics`` (and of its
``--workers`` :class:`WorkerProcess`): the attribute, whether its children are memoised, the
family's name, type, help, label names, buckets and multiprocess mode; then the whole
exposition of a registry with one model, queue, upstream and web search backend added (every
series created at zero). A metric renamed, re-helped, relabelled, re-bucketed or moved out of
the memo fails here; so does a series no longer created at zero.

After a deliberate change to a metric, regenerate it:
``PYTHONPATH=$PWD python3 tests/observability/test_metrics_golden.py`` and review the diff.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from gateway.ops.metrics import Metrics

GOLDEN = Path(__file__).with_name("metrics_golden.txt")


def _family(attribute: str, obj: Any) -> str | None:
    memo = hasattr(obj, "metric") and isinstance(obj.metric, MetricWrapperBase)
    metric = obj.metric if memo else obj
    if not isinstance(metric, MetricWrapperBase):
        return None
    fields = [
        attribute,
        "memo" if memo else "plain",
        metric._type,
        metric._name,
        repr(metric._documentation),
        "labels=" + ",".join(metric._labelnames),
    ]
    if metric._type == "histogram":
        fields.append("buckets=" + ",".join(repr(b) for b in metric._upper_bounds))
    if metric._type == "gauge":
        fields.append("mode=" + metric._multiprocess_mode)
    return " ".join(fields)


def render() -> str:
    registry, info = CollectorRegistry(), CollectorRegistry()
    metrics = Metrics(registry, info, per_worker_process=True)
    assert metrics.process is not None
    lines = [_family(k, v) for k, v in vars(metrics).items()]
    lines.append(_family("process.cpu", metrics.process.cpu))
    lines += [_family(f"process.gauges[{k}]", v) for k, v in metrics.process.gauges.items()]
    families = sorted(line for line in lines if line is not None)

    # the series a configured gateway creates at zero (no per-worker process figures: they vary)
    registry, info = CollectorRegistry(), CollectorRegistry()
    metrics = Metrics(registry, info)
    metrics.add_model("alias", "up", "up-model", ("other",))
    metrics.add_queue("alias")
    metrics.add_upstream("up")
    metrics.add_web_search_backend("searxng")
    exposition = (generate_latest(info) + generate_latest(registry)).decode()
    return "\n".join(families) + "\n\n" + exposition


def test_the_metrics_are_the_golden_ones() -> None:
    got = render()
    want = GOLDEN.read_text()
    assert got.count("\n") > 400  # the walk and the exposition found the families
    assert got == want, "metrics changed; if deliberate, regenerate (see this module's docstring)"


if __name__ == "__main__":
    GOLDEN.write_text(render())
