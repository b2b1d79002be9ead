"""The dashboard, proven against a real Prometheus scraping a real gateway.

A gateway process routes ``demo`` to the real llama.cpp server (the tiny
generated model) and a few aliases to the scripted stub (an upstream 500, an
in-band stream error, a dead upstream). Traffic flows through it for several
scrape intervals while Debian's ``prometheus`` binary, started here as a child
process with a 1 s scrape interval, scrapes ``/metrics``. Then every PromQL
expression of ``grafana/dashboards/llm-gateway.json`` is evaluated through
Prometheus's HTTP API (``$model`` -> ``.*``, ``$__rate_interval`` -> ``1m``)
and must return data. ``promtool check metrics`` must find nothing to lint in
the gateway's exposition.

Without the binaries the tests skip locally and fail in CI (``CI`` set).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import default_registry
from gateway.ops.metrics import Metrics
from tests.conftest import llama_config
from tests.procs import REPO, Proc, free_port, start_gateway, wait_http
from tests.waits import wait_until

DASHBOARD = REPO / "grafana" / "dashboards" / "llm-gateway.json"
SCRAPE_INTERVAL = 1.0
RATE_INTERVAL = "1m"  # covers the whole traffic window
TRAFFIC_SECONDS = 4.0  # several scrapes see counters move, so rate() is positive
HI = [{"role": "user", "content": "hi"}]
# the one named client all traffic comes from (the Clients row), its key on every request,
# the scrape and the test's own reads of /metrics
TEAM_KEY = "team-key-for-the-dashboard"
_PAGE_URL: list[str] = ["http://127.0.0.1:9/"]  # the fixture's page server, once started
# metric names in expressions; PromQL functions and keywords are not prefixed like this
_NAME = re.compile(r"\b((?:llm_gateway|process|python)_[a-zA-Z0-9_]+)\b")
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def _tool(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if path is None:
        why = f"{name} not installed (apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return path


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _expressions(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every query target of every panel, rows included."""
    out = []
    stack = list(dash["panels"])
    while stack:
        panel = stack.pop(0)
        stack.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


def _concrete(expr: str) -> str:
    return (
        expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("${model}", ".*")
        .replace("$model", ".*")
    )


def _exported_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name the registry's families can expose (by type, not by current series)."""
    suffixes = {
        "counter": ("_total",),
        "histogram": _HISTOGRAM_SUFFIXES,
        "info": ("_info",),
        "gauge": ("",),
        "summary": ("_sum", "_count", ""),
    }
    names = set()
    for family in registry.collect():
        for suffix in suffixes.get(family.type, ("",)):
            names.add(family.name + suffix)
        names.update(s.name for s in family.samples)
    return names


# --- the dashboard against the metrics module (no Prometheus needed) -------------------------


def test_dashboard_identity_and_variables() -> None:
    dash = _dashboard()
    assert dash["uid"] == "llm-gateway"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["model"]["datasource"]["uid"] == "${datasource}"
    assert "llm_gateway_model_info" in variables["model"]["definition"]
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert rows == [
        "Traffic",
        "Latency",
        "Tokens",
        "Reliability",
        "Saturation",
        "Batches",
        "Local engines",
        "Clients",
    ]
    for title, expr in _expressions(dash):
        if "rate(" in expr:
            assert "[$__rate_interval]" in expr and not re.search(r"\[\d", expr), title
    for panel in dash["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_dashboard_metric_is_defined_in_the_metrics_module() -> None:
    ours = CollectorRegistry()
    Metrics(ours)
    defined = _exported_names(ours)
    defaults = _exported_names(default_registry())  # process_* and python_* collectors
    used = {name for _, expr in _expressions(_dashboard()) for name in _NAME.findall(expr)}
    assert used
    undefined = sorted(n for n in used if n not in defined and n not in defaults)
    assert undefined == []
    # and the other way round: every metric the gateway defines is on some panel
    families = {f.name for f in ours.collect()}
    shown = {
        n if n in families else re.sub(r"(_total|_bucket|_sum|_count|_info)$", "", n) for n in used
    }
    assert sorted(families - shown - {"llm_gateway_build"}) == []
    assert "llm_gateway_build_info" in used


# --- a real Prometheus scraping a real gateway -----------------------------------------------


def _get(url: str, timeout: float = 10) -> bytes:
    req = urllib.request.Request(url, headers={"authorization": f"Bearer {TEAM_KEY}"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def _post(
    url: str, body: dict[str, Any], timeout: float = 60, headers: dict[str, str] | None = None
) -> int:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "content-type": "application/json",
            "anthropic-version": "2023-06-01",
            "x-api-key": TEAM_KEY,
            **(headers or {}),
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        with exc:
            exc.read()
            return exc.code


def _traffic_round(base: str) -> None:
    """Every path the dashboard shows: llama.cpp buffered/streamed/chat, failures, refusals."""
    msgs, chat = base + "/llm/v1/messages", base + "/llm/v1/chat/completions"
    demo = {"model": "demo", "max_tokens": 24, "messages": HI}
    assert _post(msgs, demo) == 200
    assert _post(msgs, {**demo, "stream": True, "metadata": {"user_id": "u"}}) == 200
    assert _post(chat, {"model": "demo", "max_tokens": 16, "messages": HI}) == 200
    assert _post(chat, {"model": "demo", "max_tokens": 16, "messages": HI, "stream": True}) == 200
    assert _post(msgs, {**demo, "model": "not-configured"}) == 404
    # the team's key is a trusted proxy's (claude gateway): it names a developer
    assert _post(msgs, demo, headers={"x-claude-gateway-user-id": "dev-1"}) == 200
    assert _post(chat, {"model": "not-configured", "messages": HI}) == 404
    assert _post(msgs, {**demo, "model": "m-status:500"}) >= 500
    assert _post(msgs, {**demo, "model": "m-inband-error", "stream": True}) == 200
    assert _post(msgs, {**demo, "model": "m-dead"}) >= 500
    # the web_search server tool against the SearXNG stub: a search, and a failing one
    search = {
        **demo,
        "model": "m-search",
        "tools": [{"type": "web_search_20250305", "name": "web_search"}],
    }
    assert _post(msgs, {**search, "messages": [{"role": "user", "content": "paris"}]}) == 200
    assert _post(msgs, {**search, "messages": [{"role": "user", "content": "x #fail"}]}) == 200
    # the web_fetch server tool: a page the user names, on a page server of its own
    fetch = {
        **demo,
        "model": "m-fetch",
        "tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}],
        "messages": [{"role": "user", "content": f"read {_PAGE_URL[0]}"}],
    }
    assert _post(msgs, fetch) == 200
    # two at once on a model with one slot: one waits (the queue panels)
    with ThreadPoolExecutor(2) as pool:
        queued = list(pool.map(lambda _: _post(msgs, {**demo, "model": "m-queued"}), range(2)))
    assert queued == [200, 200]


def _gateway_config(llama_url: str, stub_url: str, searxng_url: str) -> str:
    text = llama_config(llama_url)
    text += f"""
[upstreams.stub]
base_url = "{stub_url}"
connect_timeout = 2
header_timeout = 5
idle_timeout = 5

[upstreams.dead]
base_url = "http://127.0.0.1:{free_port()}/v1"
connect_timeout = 1

# the fleet panel: the stub by the name localhost, followed through DNS and probed
[upstreams.fleet]
base_url = "{stub_url.replace("127.0.0.1", "localhost")}"
discover = "dns"
resolve_interval = 0.5
health_interval = 0.5
health_timeout = 1
"""
    for name in ("status:500", "inband-error"):
        text += f'\n[[models]]\nname = "m-{name}"\nupstream = "stub"\nupstream_model = "{name}"\n'
    text += '\n[[models]]\nname = "m-dead"\nupstream = "dead"\nupstream_model = "ok"\n'
    text += 'fallbacks = ["m-status:500"]\n'  # llm_gateway_fallbacks_total
    text += '\n[[models]]\nname = "m-search"\nupstream = "stub"\nupstream_model = "ok"\n'
    # the queue panels: one slot, a second request waits for it
    text += '\n[[models]]\nname = "m-queued"\nupstream = "stub"\nupstream_model = "delay:300"\n'
    text += "max_concurrency = 1\nqueue_timeout = 10\n"
    text += f'\n[web_search]\nsearxng_url = "{searxng_url}"\ntimeout = 5\n'
    text += '\n[[models]]\nname = "m-fetch"\nupstream = "stub"\nupstream_model = "fetch"\n'
    text += '\n[web_fetch]\nenabled = true\nallowed_networks = ["127.0.0.0/8"]\n'
    text += "fetch_timeout = 5\n"
    text += '\n[[clients]]\nname = "team"\nkey_env = "TEAM_KEY"\nforwards_identity = true\n'
    return text + '\n[auth]\ntrusted_forwarders = ["127.0.0.0/8"]\n'


class _Prometheus:
    def __init__(self, binary: str, target: str, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = workdir / "prometheus.yml"
        cfg.write_text(
            json.dumps(
                {  # JSON is YAML
                    "global": {
                        "scrape_interval": f"{SCRAPE_INTERVAL:g}s",
                        "scrape_timeout": f"{SCRAPE_INTERVAL:g}s",
                        "evaluation_interval": f"{SCRAPE_INTERVAL:g}s",
                    },
                    "scrape_configs": [
                        {
                            "job_name": "llm-gateway",
                            "static_configs": [{"targets": [target]}],
                            "authorization": {"type": "Bearer", "credentials": TEAM_KEY},
                        }
                    ],
                }
            )
        )
        self.proc = Proc(
            [
                binary,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            cwd=workdir,
        )

    def query(self, expr: str) -> list[dict[str, Any]]:
        qs = urllib.parse.urlencode({"query": expr})
        reply = json.loads(_get(f"{self.url}/api/v1/query?{qs}"))
        assert reply["status"] == "success", reply
        assert reply["data"]["resultType"] == "vector", reply
        return list(reply["data"]["result"])

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None


def _requests_total(metrics_text: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "llm_gateway_requests":
            total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return total


@pytest.fixture(scope="module")
def scraped(
    tmp_path_factory: pytest.TempPathFactory, llama_server: str, stub_url: str
) -> Iterator[tuple[str, _Prometheus]]:
    """(gateway URL, Prometheus) once traffic has flowed and Prometheus has the final values."""
    binary = _tool("prometheus")
    workdir = tmp_path_factory.mktemp("prometheus")
    searxng_port = free_port()
    searxng = Proc([sys.executable, str(REPO / "tests" / "searxng_stub.py"), str(searxng_port)])
    wait_http(f"http://127.0.0.1:{searxng_port}/healthz", proc=searxng.popen)
    searxng_url = f"http://127.0.0.1:{searxng_port}"
    # a page for web_fetch: another stub, not the search backend (which is never fetched)
    page_port = free_port()
    page = Proc([sys.executable, str(REPO / "tests" / "searxng_stub.py"), str(page_port)])
    wait_http(f"http://127.0.0.1:{page_port}/healthz", proc=page.popen)
    _PAGE_URL[:] = [f"http://127.0.0.1:{page_port}/healthz"]
    gateway, base = start_gateway(
        _gateway_config(llama_server, stub_url, searxng_url), workdir, env={"TEAM_KEY": TEAM_KEY}
    )
    prom = _Prometheus(binary, base.removeprefix("http://"), workdir)
    try:
        wait_http(prom.url + "/-/ready", timeout=20, proc=prom.proc.popen)
        # ready is not scraped: counters must already exist at the first sample, or their first
        # increments are invisible to rate()
        wait_until(
            lambda: prom.scalar('up{job="llm-gateway"}') == 1,
            "Prometheus scraped the gateway",
            timeout=15,
            every=0.1,
        )
        started = time.monotonic()
        rounds = 0
        while rounds < 3 or time.monotonic() - started < TRAFFIC_SECONDS:
            _traffic_round(base)
            rounds += 1
            time.sleep(0.2)
        expected = _requests_total(_get(base + "/metrics").decode())
        wait_until(
            lambda: prom.scalar("sum(llm_gateway_requests_total)") == expected,
            "Prometheus scraped the final values",
            timeout=15,
            every=0.2,
        )
        # one more sample after the last change for every rate: two scrapes past this one
        last = prom.scalar('timestamp(up{job="llm-gateway"})') or 0.0
        wait_until(
            lambda: (
                (prom.scalar('timestamp(up{job="llm-gateway"})') or 0.0) > last + SCRAPE_INTERVAL
            ),
            "two more scrapes",
            timeout=15,
            every=0.2,
        )
        yield base, prom
    finally:
        prom.proc.stop()
        gateway.stop()
        searxng.stop()
        page.stop()


@pytest.mark.e2e
@pytest.mark.llamacpp
@pytest.mark.timeout(90)
def test_every_dashboard_expression_returns_data(scraped) -> None:
    _, prom = scraped
    empty, no_numbers = [], []
    for title, expr in _expressions(_dashboard()):
        result = prom.query(_concrete(expr))
        if not result:
            empty.append((title, expr))
        elif not any(math.isfinite(float(r["value"][1])) for r in result):
            no_numbers.append((title, expr))
    assert empty == []
    assert no_numbers == []


@pytest.mark.e2e
@pytest.mark.llamacpp
def test_key_panels_show_the_traffic_that_flowed(scraped) -> None:
    _, prom = scraped
    rate = f"[{RATE_INTERVAL}]"
    checks = {
        f'sum(rate(llm_gateway_requests_total{{model="demo",code="200"}}{rate}))': "demo RPS",
        f'sum(rate(llm_gateway_tokens_total{{model="demo",type="output"}}{rate}))': "tokens",
        f'sum(rate(llm_gateway_stream_terminations_total{{model="demo",reason="completed"}}'
        f"{rate}))": "completed streams",
        f'sum(rate(llm_gateway_stream_terminations_total{{model="m-inband-error",'
        f'reason="upstream_error"}}{rate}))': "upstream_error streams",
        f'sum(rate(llm_gateway_upstream_requests_total{{code="connect_error"}}{rate}))': "connect errors",  # noqa: E501
        f'sum(rate(llm_gateway_upstream_requests_total{{code="500"}}{rate}))': "upstream 500",
        f'sum(rate(llm_gateway_rejected_total{{reason="unknown_model"}}{rate}))': "unknown model",
        f'sum(rate(llm_gateway_dropped_fields_total{{field="metadata"}}{rate}))': "dropped",
        f'sum(rate(llm_gateway_web_searches_total{{backend="searxng",outcome="ok"}}{rate}))': "web searches",  # noqa: E501
        f'sum(rate(llm_gateway_web_search_errors_total{{error_code="unavailable"}}{rate}))': "web search errors",  # noqa: E501
        f'sum(rate(llm_gateway_web_fetches_total{{model="fetch",outcome="ok"}}{rate}))': "web fetches",  # noqa: E501
    }
    for expr, what in checks.items():
        got = prom.scalar(expr)
        assert got is not None and got > 0, (what, expr, got)
    assert prom.scalar("sum(llm_gateway_streams_in_flight)") == 0
    assert (prom.scalar('process_resident_memory_bytes{job="llm-gateway"}') or 0) > 10e6
    models = json.loads(
        _get(
            prom.url
            + "/api/v1/label/model/values?"
            + urllib.parse.urlencode({"match[]": "llm_gateway_model_info"})
        )
    )["data"]
    configured = [
        "demo",
        "m-dead",
        "m-fetch",
        "m-inband-error",
        "m-queued",
        "m-search",
        "m-status:500",
    ]
    assert sorted(models) == configured
    # client-chosen names never become series
    assert prom.query('{__name__=~"llm_gateway_.*", model="not-configured"}') == []


@pytest.mark.e2e
@pytest.mark.llamacpp
def test_promtool_finds_nothing_to_lint_in_the_exposition(scraped) -> None:
    base, _ = scraped
    promtool = _tool("promtool")
    text = _get(base + "/metrics")
    assert b"llm_gateway_time_to_first_token_seconds_bucket" in text  # histograms populated
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == b"" and done.stderr.strip() == b"", done.stdout + done.stderr
