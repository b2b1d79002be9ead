"""The benchmark: the gateway against a direct upstream, a lean floor and a bare relay.

    python -m tests.benchmarks.run [--quick | --tiny] [--echo] [--json out.json]

Everything is measured in one run, the targets taking turns (the order rotates each
repetition) so a noisy neighbour hurts them alike; figures are medians over the
repetitions. CPU is the process's own CPU time (every thread's ``/proc/PID/task/*/schedstat``,
nanoseconds) read before and after a load, so it does not depend on how busy the machine
was; memory is RSS from ``/proc/PID/status``. With two or more cores the measured server
runs on core 1, the stub upstream and this driver on core 0 (``taskset``).

Targets: ``gateway`` (a real ``python -m gateway`` process with everything on: API keys,
metrics, info logs, validation), ``floor`` (tests/benchmarks/lean_floor.py, Anthropic),
``relay`` (tests/benchmarks/bare_relay.py, OpenAI pass-through), ``router`` (sglang-router's
Rust router with ``--backend openai``, the pass-through anchor; from the ``bench`` extra, left
out with the reason printed where it is not installed) and ``direct`` (the driver calling the
stub itself: what "added" latency is measured against).

Every process started here is ended here, by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from gateway.text import jsonutil
from tests.benchmarks import driver
from tests.procs import wait_http

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
API_KEY = "bench-key-0123456789"
PREFIX = "/llm"

# per mode: reps; buffered requests per concurrency; TTFT requests (256 chunks 1 ms apart:
# the first chunk alone, so time to first token is not time to translate all); bulk streams;
# paced streams x chunks x ms; slow streams x chunks x ms; abandoned streams
MODES: dict[str, dict[str, Any]] = {
    "full": {
        "reps": 3,
        "buffered": {1: 800, 16: 3000, 64: 3000},
        "ttft": 15,
        "bulk": (8, 80, 256),
        "paced": (32, 256, 10),
        "slow": (1000, 200, 100),
        "abandon": 200,
    },
    "quick": {
        "reps": 2,
        "buffered": {1: 300, 16: 1000, 64: 1000},
        "ttft": 8,
        "bulk": (8, 30, 256),
        "paced": (16, 128, 10),
        "slow": (300, 50, 100),
        "abandon": 100,
    },
    "tiny": {
        "reps": 1,
        "buffered": {1: 20, 16: 48, 64: 64},
        "ttft": 3,
        "bulk": (4, 8, 256),
        "paced": (4, 16, 10),
        "slow": (20, 10, 50),
        "abandon": 10,
    },
}


# --- processes ------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class Proc:
    """A child process (optionally pinned to a core), ended by PID."""

    def __init__(
        self,
        name: str,
        args: list[str],
        *,
        core: int | None,
        logdir: Path,
        env: dict[str, str] | None = None,
        health: str,
    ) -> None:
        self.name = name
        self.log_path = logdir / f"{name}-{len(list(logdir.glob(name + '-*.log')))}.log"
        self.log = open(self.log_path, "wb")  # closed in stop()
        prefix = ["taskset", "-c", str(core)] if core is not None else []
        t0 = time.perf_counter()
        self.popen = subprocess.Popen(
            prefix + args,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=str(REPO),
            env={**os.environ, **(env or {})},
        )
        _PROCS.append(self)
        self._wait_health(health)
        self.startup = time.perf_counter() - t0

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _wait_health(self, url: str) -> None:
        try:
            wait_http(url, timeout=20, proc=self.popen)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{self.name}: {exc}: {self.log_path.read_text()[-2000:]}") from None

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(8)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        self.log.close()
        if self in _PROCS:
            _PROCS.remove(self)


_PROCS: list[Proc] = []


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` (ns precision where schedstat exists)."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return jsonutil.loads(resp.read())


# --- the setup ------------------------------------------------------------------------


def _models(mode: dict[str, Any]) -> list[str]:
    names = ["bench:16:0", "bench:256:0", "bench:256:1"]
    for key in ("paced", "slow"):
        _, n, ms = mode[key]
        names.append(f"bench:{n}:{ms}")
    names.append("bench:1000:100")  # the abandoned streams: long enough to be cut
    return sorted(set(names))


def _gateway_config(stub: str, models: list[str]) -> str:
    text = f"""
[server]
host = "{HOST}"
prefix = "{PREFIX}"
log_level = "info"
api_keys_env = "BENCH_GATEWAY_KEYS"
shutdown_grace = 2

[upstreams.stub]
base_url = "{stub}"
kind = "vllm"
"""
    for m in models:
        text += f'\n[[models]]\nname = "{m}"\nupstream = "stub"\nupstream_model = "{m}"\n'
    return text


class Bench:
    stub_args: tuple[str, ...] = ()  # e.g. ("--echo",): the stub echoes X-Request-Id

    def __init__(self, mode_name: str, *, echo: bool = False) -> None:
        if echo:
            self.stub_args = ("--echo",)
        self.mode_name = mode_name
        self.mode = MODES[mode_name]
        self.tmp = Path(tempfile.mkdtemp(prefix="llm-gateway-bench-"))
        self.pin = (os.cpu_count() or 1) >= 2 and bool(_which("taskset"))
        self.server_core = 1 if self.pin else None
        self.client_core = 0 if self.pin else None
        if self.pin:
            os.sched_setaffinity(0, {0})
        self.stub_port = free_port()
        self.stub = Proc(
            "stub",
            [
                sys.executable,
                "-m",
                "tests.benchmarks.stub_fast",
                str(self.stub_port),
                *self.stub_args,
            ],
            core=self.client_core,
            logdir=self.tmp,
            health=f"http://{HOST}:{self.stub_port}/health",
        )
        self.stub_url = f"http://{HOST}:{self.stub_port}/v1"
        self.models = _models(self.mode)
        self.cfg = self.tmp / "gateway.toml"
        self.cfg.write_text(_gateway_config(self.stub_url, self.models))
        self.servers: dict[str, tuple[Proc, int]] = {}
        self.router_missing = _router_missing()

    # server processes, started on demand, restarted for clean memory figures
    def start(self, name: str) -> Proc:
        if name == "gateway":
            return self.start_gateway(name, ["-m", "gateway"])
        port = free_port()
        if name == "router":
            args = [
                sys.executable,
                "-m",
                "sglang_router.launch_router",
                "--host",
                HOST,
                "--port",
                str(port),
                "--worker-urls",
                self.stub_url.removesuffix("/v1"),
                "--backend",
                "openai",
                "--log-level",
                "warn",
                "--prometheus-port",
                str(free_port()),
            ]
        else:
            module = {"floor": "lean_floor", "relay": "bare_relay"}[name]
            args = [sys.executable, "-m", f"tests.benchmarks.{module}", str(port), self.stub_url]
        return self._spawn(name, args, port, {})

    def start_gateway(self, name: str, runner: list[str]) -> Proc:
        """The gateway as ``name``, run by ``runner``: ``["-m", "gateway"]``, or a module that
        changes it and then runs it (``["-m", "tests.benchmarks.regressed", "100"]``)."""
        port = free_port()
        args = [sys.executable, *runner, "--config", str(self.cfg), "--port", str(port)]
        # its own state directory: the signing key and the batch database (batches on, as by
        # default, the scheduler polling its store)
        state = self.tmp / ("state" if name == "gateway" else f"state-{name}")
        return self._spawn(
            name, args, port, {"BENCH_GATEWAY_KEYS": API_KEY, "XDG_STATE_HOME": str(state)}
        )

    def _spawn(self, name: str, args: list[str], port: int, env: dict[str, str]) -> Proc:
        proc = Proc(
            name,
            args,
            core=self.server_core,
            logdir=self.tmp,
            env=env,
            health=f"http://{HOST}:{port}/health",
        )
        self.servers[name] = (proc, port)
        return proc

    def restart(self, name: str) -> Proc:
        if name in self.servers:
            self.servers.pop(name)[0].stop()
        return self.start(name)

    def close(self) -> None:
        for proc in list(_PROCS):
            proc.stop()

    def stub_stats(self) -> dict[str, int]:
        return _get_json(f"http://{HOST}:{self.stub_port}/_stats")  # type: ignore[no-any-return]

    # requests ------------------------------------------------------------------------

    def request(self, target: str, api: str, model: str, stream: bool) -> tuple[int, bytes]:
        """(port, raw request bytes) for ``target`` speaking ``api``."""
        if api == "anthropic":
            # thinking asked for, as the floor always shows it: the same blocks and events
            # out of both (without it the gateway hides the engine's reasoning, as the API
            # would, and its first delta comes only after the reasoning has ended)
            body = {
                "model": model,
                "max_tokens": 2048,
                "stream": stream,
                "system": "You are a concise assistant.",
                "thinking": {"type": "enabled", "budget_tokens": 1024},
                "messages": [{"role": "user", "content": "Say hello to the benchmark."}],
            }
        else:
            body = {
                "model": model,
                "max_tokens": 1024,
                "stream": stream,
                "messages": [
                    {"role": "system", "content": "You are a concise assistant."},
                    {"role": "user", "content": "Say hello to the benchmark."},
                ],
            }
            if stream:
                body["stream_options"] = {"include_usage": True}
        if target == "direct":
            if api == "anthropic":  # the same conversation as the stub is sent it
                body = {
                    "model": model,
                    "max_tokens": 2048,
                    "stream": stream,
                    "messages": [
                        {"role": "system", "content": body["system"]},
                        {"role": "user", "content": "Say hello to the benchmark."},
                    ],
                }
                if stream:
                    body["stream_options"] = {"include_usage": True}
            return self.stub_port, driver.build_request(
                HOST, self.stub_port, "/v1/chat/completions", jsonutil.dumpb(body)
            )
        port = self.servers[target][1]
        if target == "gateway":
            path = PREFIX + ("/v1/messages" if api == "anthropic" else "/v1/chat/completions")
            headers = (
                {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
                if api == "anthropic"
                else {"Authorization": f"Bearer {API_KEY}"}
            )
        else:
            path = "/v1/messages" if api == "anthropic" else "/v1/chat/completions"
            headers = {}
        return port, driver.build_request(HOST, port, path, jsonutil.dumpb(body), headers)

    def pid(self, target: str) -> int | None:
        return self.servers[target][0].pid if target in self.servers else None


def _router_missing() -> str | None:
    """Why sglang-router cannot be measured here, or None when it can."""
    import importlib.util

    if importlib.util.find_spec("sglang_router") is None:
        return "sglang-router is not installed (pip install '.[bench]')"
    return None


def _which(cmd: str) -> str | None:
    from shutil import which

    return which(cmd)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _med(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def _markers(api: str, target: str = "gateway") -> tuple[bytes, bytes]:
    """(first-token marker, terminal event) of what ``target`` answers (direct: OpenAI)."""
    return (
        (b"content_block_delta", b"message_stop")
        if api == "anthropic" and target != "direct"
        else (b"reasoning_content", b"[DONE]")
    )


# --- scenarios ------------------------------------------------------------------------


async def measured(bench: Bench, target: str, coro: Any) -> tuple[driver.LoadResult, float]:
    pid = bench.pid(target)
    before = cpu_seconds(pid) if pid else 0.0
    res = await coro
    after = cpu_seconds(pid) if pid else 0.0
    return res, after - before


def _rotations(targets: list[str], reps: int) -> list[list[str]]:
    return [targets[i % len(targets) :] + targets[: i % len(targets)] for i in range(reps)]


def _ratios(row: dict[str, Any], others: list[str], key: str) -> None:
    """``cpu_ratio``: gateway over the floor (others[0]); ``cpu_ratio_router`` where measured."""
    row["cpu_ratio"] = row["gateway"][key] / row[others[0]][key]
    if "router" in others:
        row["cpu_ratio_router"] = row["gateway"][key] / row["router"][key]


async def buffered(bench: Bench, api: str, others: list[str]) -> dict[str, Any]:
    targets = ["direct", "gateway", *others]
    out: dict[str, Any] = {}
    for conc, count in bench.mode["buffered"].items():
        runs: dict[str, list[dict[str, float]]] = {t: [] for t in targets}
        for order in _rotations(targets, bench.mode["reps"]):
            for target in order:
                port, raw = bench.request(target, api, "bench:16:0", False)
                await driver.closed_loop(
                    HOST, port, raw, concurrency=conc, requests=max(conc, count // 10)
                )  # warm-up
                res, cpu = await measured(
                    bench,
                    target,
                    driver.closed_loop(HOST, port, raw, concurrency=conc, requests=count),
                )
                lat = [r.latency for r in res.results]
                runs[target].append(
                    {
                        "rps": len(res.results) / res.wall,
                        "p50_ms": _pct(lat, 0.5) * 1e3,
                        "p99_ms": _pct(lat, 0.99) * 1e3,
                        "ok": res.ok / len(res.results),
                        "cpu_us": cpu / len(res.results) * 1e6 if target != "direct" else 0.0,
                    }
                )
        row = {t: {k: _med([r[k] for r in rs]) for k in rs[0]} for t, rs in runs.items()}
        for t in targets[1:]:
            row[t]["added_p50_ms"] = row[t]["p50_ms"] - row["direct"]["p50_ms"]
            row[t]["added_p99_ms"] = row[t]["p99_ms"] - row["direct"]["p99_ms"]
        _ratios(row, others, "cpu_us")
        out[f"c{conc}"] = row
    return out


async def streamed(bench: Bench, api: str, others: list[str]) -> dict[str, Any]:
    mode = bench.mode
    out: dict[str, Any] = {}
    # 1) latency at concurrency 1, 256 chunks 1 ms apart: TTFT and time to last byte
    targets = ["direct", "gateway", *others]
    runs: dict[str, list[dict[str, float]]] = {t: [] for t in targets}
    for order in _rotations(targets, mode["reps"]):
        for target in order:
            port, raw = bench.request(target, api, "bench:256:1", True)
            marker, terminal = _markers(api, target)
            await driver.closed_loop(
                HOST, port, raw, concurrency=1, requests=2, marker=marker, terminal=terminal
            )
            res = await driver.closed_loop(
                HOST,
                port,
                raw,
                concurrency=1,
                requests=mode["ttft"],
                marker=marker,
                terminal=terminal,
            )
            runs[target].append(
                {
                    "ttft_ms": _med([r.ttft for r in res.results]) * 1e3,
                    "ttlb_ms": _med([r.latency for r in res.results]) * 1e3,
                    "ok": res.ok / len(res.results),
                }
            )
    row = {t: {k: _med([r[k] for r in rs]) for k in rs[0]} for t, rs in runs.items()}
    for t in targets[1:]:
        row[t]["added_ttft_ms"] = row[t]["ttft_ms"] - row["direct"]["ttft_ms"]
        row[t]["added_ttlb_ms"] = row[t]["ttlb_ms"] - row["direct"]["ttlb_ms"]
    out["latency_c1"] = row
    # 2) bulk: every chunk at once, concurrency C: chunks/s and CPU per 1,000 chunks
    conc, count, n = mode["bulk"]
    runs = {t: [] for t in targets}
    for order in _rotations(targets, mode["reps"]):
        for target in order:
            port, raw = bench.request(target, api, f"bench:{n}:0", True)
            marker, terminal = _markers(api, target)
            res, cpu = await measured(
                bench,
                target,
                driver.closed_loop(
                    HOST,
                    port,
                    raw,
                    concurrency=conc,
                    requests=count,
                    marker=marker,
                    terminal=terminal,
                ),
            )
            chunks = n * len(res.results)
            runs[target].append(
                {
                    "chunks_per_s": chunks / res.wall,
                    "cpu_s_per_1k_chunks": cpu / chunks * 1000,
                    "ok": res.ok / len(res.results),
                }
            )
    row = {t: {k: _med([r[k] for r in rs]) for k in rs[0]} for t, rs in runs.items()}
    _ratios(row, others, "cpu_s_per_1k_chunks")
    out["bulk"] = row
    # 3) paced: chunks one by one, CPU per 1,000 chunks
    streams, n, ms = mode["paced"]
    targets = ["gateway", *others]
    runs = {t: [] for t in targets}
    for order in _rotations(targets, mode["reps"]):
        for target in order:
            port, raw = bench.request(target, api, f"bench:{n}:{ms}", True)
            marker, terminal = _markers(api, target)
            res, cpu = await measured(
                bench,
                target,
                driver.streams_at_once(
                    HOST,
                    port,
                    raw,
                    count=streams,
                    marker=marker,
                    terminal=terminal,
                    within=n * ms / 1000 * 3 + 10,
                ),
            )
            chunks = n * streams
            runs[target].append(
                {"cpu_s_per_1k_chunks": cpu / chunks * 1000, "ok": res.ok / streams}
            )
    row = {t: {k: _med([r[k] for r in rs]) for k in rs[0]} for t, rs in runs.items()}
    _ratios(row, others, "cpu_s_per_1k_chunks")
    out["paced"] = row
    return out


async def slow_streams(bench: Bench, api: str, others: list[str]) -> dict[str, Any]:
    """Many concurrent slow streams against freshly started servers (clean memory)."""
    marker, terminal = _markers(api)
    count, n, ms = bench.mode["slow"]
    expected = (n - 1) * ms / 1000
    out: dict[str, Any] = {"streams": count, "chunks": n, "interval_ms": ms}
    for target in ("gateway", *others):
        proc = bench.restart(target)
        port, raw = bench.request(target, api, f"bench:{n}:{ms}", True)
        warm_port, warm = bench.request(target, api, "bench:16:0", True)
        await driver.closed_loop(
            HOST, warm_port, warm, concurrency=4, requests=16, marker=marker, terminal=terminal
        )
        await asyncio.sleep(0.2)
        base_rss = rss_bytes(proc.pid)
        peaks = [base_rss]
        stop = asyncio.Event()
        sampler = asyncio.create_task(_sample_rss(proc.pid, stop, peaks))
        res, cpu = await measured(
            bench,
            target,
            driver.streams_at_once(
                HOST, port, raw, count=count, marker=marker, terminal=terminal, within=expected + 15
            ),
        )
        stop.set()
        await sampler
        peak = max(peaks)
        await asyncio.sleep(0.5)
        late = [r.latency - expected for r in res.results]
        out[target] = {
            "completed": res.ok,
            "completed_ratio": res.ok / count,
            "on_time_ratio": sum(
                1 for r in res.results if r.complete and r.latency - expected < 1.0
            )
            / count,
            "late_p50_ms": _pct(late, 0.5) * 1e3,
            "late_max_ms": max(late or [0.0]) * 1e3,
            "kb_per_stream": (peak - base_rss) / count / 1024,
            "peak_rss_mb": peak / 2**20,
            "cpu_s_per_1k_chunks": cpu / (count * n) * 1000,
            "upstream_open_after": bench.stub_stats()["open"],
        }
        out[target]["abandoned_open_after"] = await _abandon(bench, target, api)
    return out


async def _sample_rss(pid: int, stop: asyncio.Event, peaks: list[int]) -> None:
    while not stop.is_set():
        peaks.append(rss_bytes(pid))
        await asyncio.sleep(0.25)


async def _abandon(bench: Bench, target: str, api: str) -> int:
    """Open long streams, hang up after a second: the upstream streams must all close."""
    count = bench.mode["abandon"]
    port, raw = bench.request(target, api, "bench:1000:100", True)
    marker, terminal = _markers(api)
    await driver.streams_at_once(
        HOST, port, raw, count=count, marker=marker, terminal=terminal, within=1.0
    )
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        if bench.stub_stats()["open"] == 0:
            break
    return bench.stub_stats()["open"]


async def one_core(bench: Bench) -> dict[str, Any]:
    """Buffered c1 added p50 with the server on the driver's and stub's core.

    Pinned apart, each request makes four cross-core wake-ups of an idle core (driver ->
    server -> stub -> server -> driver), which on a virtual machine cost tens of µs each
    and land in "added" latency. On one core there are none, so this is the server's own
    latency. The pinned figure stays the one checked against the target.
    """
    if not bench.pin:
        return {}
    saved = bench.server_core
    bench.server_core = bench.client_core
    out: dict[str, Any] = {}
    count = bench.mode["buffered"][1]
    try:
        for api, floor in (("anthropic", "floor"), ("openai", "relay")):
            for target in ("gateway", floor):
                bench.restart(target)
            targets = ["direct", "gateway", floor]
            runs: dict[str, list[float]] = {t: [] for t in targets}
            for order in _rotations(targets, bench.mode["reps"]):
                for target in order:
                    port, raw = bench.request(target, api, "bench:16:0", False)
                    await driver.closed_loop(
                        HOST, port, raw, concurrency=1, requests=max(1, count // 10)
                    )  # warm-up
                    res = await driver.closed_loop(HOST, port, raw, concurrency=1, requests=count)
                    runs[target].append(_pct([r.latency for r in res.results], 0.5) * 1e3)
            direct = _med(runs["direct"])
            out[api] = {t: _med(runs[t]) - direct for t in targets[1:]}
    finally:
        bench.server_core = saved
        for target in ("gateway", "floor", "relay"):
            if target in bench.servers:
                bench.servers.pop(target)[0].stop()
    return out


def startup(bench: Bench) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("gateway", "floor", "relay"):
        times, rss = [], []
        for _ in range(1 if bench.mode_name == "tiny" else 3):
            proc = bench.restart(name)
            times.append(proc.startup)
            time.sleep(0.3)
            rss.append(rss_bytes(proc.pid) / 2**20)
        out[name] = {"startup_s": _med(times), "idle_rss_mb": _med(rss)}
    return out


# --- targets and the table ------------------------------------------------------------


def check_targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    a, o = r["anthropic"], r["openai"]
    ab, ob = a["buffered"], o["buffered"]
    router = "router" in ob["c16"]
    rows = [
        ("buffered Anthropic CPU/request vs floor (c1)", ab["c1"]["cpu_ratio"], 1.3),
        ("buffered Anthropic CPU/request vs floor (c16)", ab["c16"]["cpu_ratio"], 1.3),
        ("paced stream CPU/1k chunks vs floor", a["stream"]["paced"]["cpu_ratio"], 1.3),
        ("bulk stream CPU/1k chunks vs floor", a["stream"]["bulk"]["cpu_ratio"], 1.3),
        (
            "pass-through CPU/request vs Rust router (c16)",
            ob["c16"]["cpu_ratio_router"] if router else None,
            1.0,
        ),
        (
            "pass-through paced stream CPU/1k chunks vs Rust router",
            o["stream"]["paced"]["cpu_ratio_router"] if router else None,
            1.0,
        ),
        ("pass-through CPU/request vs relay (c16)", ob["c16"]["cpu_ratio"], 1.2),
        ("added p50 latency, buffered, c1 (ms)", ab["c1"]["gateway"]["added_p50_ms"], 0.35),
        ("added TTFT, stream, c1 (ms)", a["stream"]["latency_c1"]["gateway"]["added_ttft_ms"], 1.0),
        ("slow streams: KB per stream", a["slow"]["gateway"]["kb_per_stream"], 40),
        (
            "slow streams: not completed",
            a["slow"]["streams"] - a["slow"]["gateway"]["completed"],
            0,
        ),
        (
            "slow streams: upstream streams left open",
            a["slow"]["gateway"]["upstream_open_after"]
            + o["slow"]["gateway"]["upstream_open_after"]
            + a["slow"]["gateway"]["abandoned_open_after"]
            + o["slow"]["gateway"]["abandoned_open_after"],
            0,
        ),
        # 60 MB before Message Batches; their SQL layer (SQLAlchemy Core) adds about 12 MB
        ("idle RSS (MB)", r["startup"]["gateway"]["idle_rss_mb"], 75),
        ("start-up (s)", r["startup"]["gateway"]["startup_s"], 1.0),
    ]
    return [
        {
            "target": name,
            "value": value,
            "limit": limit,
            "holds": None if value is None else value <= limit,
        }
        for name, value, limit in rows
    ]


def _f(v: float | None, nd: int = 2) -> str:
    if v is None or v != v:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{nd}f}"


def table(r: dict[str, Any]) -> str:
    lines = [
        "| figure | gateway | floor / relay | Rust router | direct | ÷ floor | ÷ router |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def cell(v: Any) -> str:
        return v if isinstance(v, str) else _f(v)

    def div(g: Any, f: Any) -> str:
        ok = isinstance(g, int | float) and isinstance(f, int | float) and f
        return _f(g / f) if ok else ""

    def add(
        label: str,
        x: dict[str, Any],
        floor: str,
        key: str,
        *,
        direct: bool = False,
        ratio: bool = True,
    ) -> None:
        g, f = x["gateway"][key], x[floor][key]
        ro = x["router"][key] if "router" in x else ""
        d = x["direct"][key] if direct and "direct" in x else ""
        lines.append(
            f"| {label} | {cell(g)} | {cell(f)} | {cell(ro)} | {cell(d)} | "
            f"{div(g, f) if ratio else ''} | {div(g, ro) if ratio else ''} |"
        )

    def both(x: dict[str, Any], a: str, b: str) -> dict[str, Any]:
        return {
            t: {"v": f"{_f(v[a])} / {_f(v[b])}"}
            for t, v in x.items()
            if isinstance(v, dict) and t != "direct"
        }

    for api, floor in (("anthropic", "floor"), ("openai", "relay")):
        x = r[api]
        tag = "Anthropic" if api == "anthropic" else "OpenAI pass-through"
        for c, row in x["buffered"].items():
            add(f"{tag} buffered {c}: requests/s", row, floor, "rps", direct=True)
            add(f"{tag} buffered {c}: CPU µs/request", row, floor, "cpu_us")
            add(
                f"{tag} buffered {c}: added p50 / p99 ms",
                both(row, "added_p50_ms", "added_p99_ms"),
                floor,
                "v",
                ratio=False,
            )
        one = r.get("one_core", {}).get(api)
        if one:
            lines.append(
                f"| {tag} buffered c1, all on one core: added p50 ms | "
                f"{_f(one['gateway'])} | {_f(one[floor])} | | | | |"
            )
        lat = x["stream"]["latency_c1"]
        add(f"{tag} stream c1: added TTFT ms", lat, floor, "added_ttft_ms", ratio=False)
        add(f"{tag} stream c1: added last byte ms", lat, floor, "added_ttlb_ms", ratio=False)
        b = x["stream"]["bulk"]
        add(f"{tag} stream bulk: chunks/s", b, floor, "chunks_per_s", direct=True)
        add(f"{tag} stream bulk: CPU ms/1k chunks", _ms(b), floor, "cpu_ms_per_1k_chunks")
        p = x["stream"]["paced"]
        add(f"{tag} stream paced: CPU ms/1k chunks", _ms(p), floor, "cpu_ms_per_1k_chunks")
        s = x["slow"]
        label = f"{tag} {s['streams']} slow streams"
        add(f"{label}: completed", s, floor, "completed", ratio=False)
        add(f"{label}: on time (<1 s late)", s, floor, "on_time_ratio", ratio=False)
        add(f"{label}: KB/stream", s, floor, "kb_per_stream")
        add(f"{label}: CPU ms/1k chunks", _ms(s), floor, "cpu_ms_per_1k_chunks")
        add(
            f"{label}: upstream open after / after hang-up",
            both(s, "upstream_open_after", "abandoned_open_after"),
            floor,
            "v",
            ratio=False,
        )
    st = r["startup"]
    lines.append(
        f"| idle RSS MB (relay) | {_f(st['gateway']['idle_rss_mb'])} | "
        f"{_f(st['floor']['idle_rss_mb'])} ({_f(st['relay']['idle_rss_mb'])}) "
        f"| | | | |"
    )
    lines.append(
        f"| start-up s (relay) | {_f(st['gateway']['startup_s'])} | "
        f"{_f(st['floor']['startup_s'])} ({_f(st['relay']['startup_s'])}) | | | | |"
    )
    lines.append("")
    lines.append("| target | value | limit | holds |")
    lines.append("| --- | ---: | ---: | :---: |")
    for t in r["targets"]:
        holds = "skipped" if t["holds"] is None else "yes" if t["holds"] else "NO"
        lines.append(f"| {t['target']} | {_f(t['value'])} | {t['limit']} | {holds} |")
    return "\n".join(lines)


def _ms(x: dict[str, Any]) -> dict[str, Any]:
    """``x`` with each target's CPU per 1,000 chunks in milliseconds (the table's unit)."""
    return {
        t: {**v, "cpu_ms_per_1k_chunks": v["cpu_s_per_1k_chunks"] * 1e3}
        for t, v in x.items()
        if isinstance(v, dict) and "cpu_s_per_1k_chunks" in v
    }


# --- main -----------------------------------------------------------------------------


async def _run_all(bench: Bench) -> dict[str, Any]:
    r: dict[str, Any] = {}
    router = [] if bench.router_missing else ["router"]
    for api, others in (("anthropic", ["floor"]), ("openai", ["relay", *router])):
        for name in ("gateway", *others):
            if name not in bench.servers:
                bench.start(name)
        r[api] = {
            "buffered": await buffered(bench, api, others),
            "stream": await streamed(bench, api, others),
            "slow": await slow_streams(bench, api, others),
        }
        for name in others:
            bench.servers.pop(name)[0].stop()
    return r


def run(mode_name: str = "full", *, echo: bool = False) -> dict[str, Any]:
    t0 = time.perf_counter()
    bench = Bench(mode_name, echo=echo)
    try:
        result: dict[str, Any] = {
            "mode": mode_name,
            "stub_echo": bool(bench.stub_args),
            "machine": {
                "cpus": os.cpu_count(),
                "pinned": bench.pin,
                "loadavg_before": os.getloadavg(),
                "python": sys.version.split()[0],
            },
        }
        result["startup"] = startup(bench)
        result["one_core"] = asyncio.run(one_core(bench))
        result.update(asyncio.run(_run_all(bench)))
        result["machine"]["loadavg_after"] = os.getloadavg()
        result["router_missing"] = bench.router_missing
        result["targets"] = check_targets(result)
        result["elapsed_s"] = time.perf_counter() - t0
        bench.close()
        # every gateway log of the run: an error line is a bug the load found
        result["gateway_error_lines"] = sum(
            1
            for log in bench.tmp.glob("gateway-*.log")
            for ln in log.read_text(errors="replace").splitlines()
            if '"level": "error"' in ln or '"level":"error"' in ln
        )
        return result
    finally:
        bench.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.benchmarks.run")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="fewer, shorter runs (< 2 min)")
    group.add_argument("--tiny", action="store_true", help="seconds: proves it runs (tests)")
    ap.add_argument(
        "--echo",
        action="store_true",
        help="the stub echoes X-Request-Id as vLLM does with its flag, so the "
        "gateway keeps upstream connections alive (default: no echo, a "
        "connection per request, as with llama.cpp or Ollama)",
    )
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    result = run(mode, echo=args.echo)
    print(table(result))
    print(
        f"\nmode {mode}, {result['elapsed_s']:.0f} s, cpus {result['machine']['cpus']}, "
        f"pinned {result['machine']['pinned']}, stub echoes X-Request-Id "
        f"{result['stub_echo']}, load average before/after "
        f"{result['machine']['loadavg_before'][0]:.2f}/"
        f"{result['machine']['loadavg_after'][0]:.2f}, gateway error log lines "
        f"{result['gateway_error_lines']}"
    )
    if result.get("router_missing"):
        print(f"Rust router left out: {result['router_missing']}")
    if args.json:
        Path(args.json).write_text(jsonutil.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
