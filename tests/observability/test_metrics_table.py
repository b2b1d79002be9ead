"""grafana/METRICS.md is the one metrics table, and it says what gateway/ops/metrics.py defines.

Every metric the module defines (the per-worker ``process_*`` ones too) is a row with its
exposed name, type and labels, and every row is a defined metric: a metric added, renamed or
relabelled without its row (or a row left behind) fails here. docs/metrics.md links to the table
instead of keeping a second one, which had drifted.
"""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from gateway.ops.metric_kinds import Memo
from gateway.ops.metrics import Metrics
from tests.procs import REPO

TABLE = REPO / "grafana" / "METRICS.md"
_ROW = re.compile(r"^\|\s*`([a-z_]+)`\s*\|\s*([a-z]+)\s*\|([^|]*)\|", re.M)
_SUFFIX = {"counter": "_total", "info": "_info"}


def _defined() -> dict[str, tuple[str, tuple[str, ...]]]:
    """exposed name -> (type, label names) of every metric gateway/ops/metrics.py defines."""
    registry = CollectorRegistry()
    metrics = Metrics(registry, per_worker_process=True)
    assert metrics.process is not None
    found = [*vars(metrics).values(), metrics.process.cpu, *metrics.process.gauges.values()]
    out = {}
    for obj in found:
        metric = obj.metric if isinstance(obj, Memo) else obj
        if isinstance(metric, MetricWrapperBase):
            name = metric._name + _SUFFIX.get(metric._type, "")
            labels = metric._labelnames
            if metric._type == "info":  # an Info's labels are the keys it was given
                labels = tuple(metric._value)
            out[name] = (metric._type, tuple(labels))
    # nothing is registered that the walk above missed
    assert {f.name for f in registry.collect()} <= {
        name.removesuffix(_SUFFIX.get(kind, "")) for name, (kind, _) in out.items()
    }
    return out


def _tabled() -> dict[str, tuple[str, tuple[str, ...]]]:
    rows = _ROW.findall(TABLE.read_text())
    names = [name for name, _, _ in rows]
    assert len(names) == len(set(names)), "a metric is listed twice"
    return {name: (kind, tuple(re.findall(r"`([a-z_]+)`", labels))) for name, kind, labels in rows}


def test_every_defined_metric_is_in_the_table_and_every_row_is_defined() -> None:
    defined, tabled = _defined(), _tabled()
    assert len(defined) >= 25  # the walk over Metrics found them
    missing, extra = sorted(defined.keys() - tabled.keys()), sorted(tabled.keys() - defined.keys())
    assert not missing, f"missing from grafana/METRICS.md: {missing}"
    assert not extra, f"grafana/METRICS.md lists undefined metrics: {extra}"
    wrong = {name: (tabled[name], want) for name, want in defined.items() if tabled[name] != want}
    assert not wrong, f"(table, module) type and labels differ: {wrong}"


def test_docs_keep_no_second_table_and_link_the_one() -> None:
    page = (REPO / "docs" / "metrics.md").read_text()
    assert "(../grafana/METRICS.md)" in page
    for doc in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        assert not re.search(r"^\| `(llm_gateway|process)_", doc.read_text(), re.M), doc.name
