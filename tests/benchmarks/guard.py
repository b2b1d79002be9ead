"""The CI guard on the request path's cost: the gateway against the in-repo floors, one run.

    python -m tests.benchmarks.guard [--json out.json] [--regress-us N]

Runs the real gateway (everything on, as in ``tests.benchmarks.run``), the leanest Anthropic
translator (``lean_floor.py``) and the bare pass-through (``bare_relay.py``) against the same
stub upstream, the targets taking turns (5 repetitions, order rotated, medians), and compares
the gateway's CPU per request and per 1,000 streamed chunks with the floor's. It exits 1 when a
ratio passes its limit in :data:`LIMITS` in two runs in a row (a figure over its limit is
measured once more, and the lower of the two counts: a regression stays, a noisy run does not).

The limits are ratios, not times: CPU time of each server process (``/proc/PID/task/*/
schedstat``), so a busy machine moves both sides alike. Each limit is today's ratio (the
docs/performance.md, re-measured when the limit is changed) times about 1.3: the
ratios of one run move by up to about 15% on a shared 2-core machine, and a step of 1.5x in
the gateway's cost passes the limit. ``--regress-us N`` starts the gateway with a middleware
that burns N µs of CPU per request (``tests/benchmarks/regressed.py``): how the guard was
seen to fail.

About 90 s on an idle 2-core machine. Loopback only; every process is ended by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from gateway.text import jsonutil
from tests.benchmarks import run as bench_run

# figure -> (limit, today's ratio when the limit was set): gateway ÷ floor, CPU.
LIMITS: dict[str, tuple[float, float]] = {
    "anthropic buffered c1, CPU/request": (1.7, 1.30),  # 1.28-1.32 seen
    # c16 moved by up to 0.5 while every write woke a halted peer (gateway/ops/coalesce.py)
    "anthropic buffered c16, CPU/request": (1.6, 1.16),  # 1.12-1.20 seen
    "anthropic stream paced, CPU/1k chunks": (1.45, 1.01),
    "anthropic stream bulk, CPU/1k chunks": (1.8, 1.31),
    "openai pass-through c16, CPU/request vs relay": (1.55, 1.07),  # 1.00-1.13 seen
}

bench_run.MODES["guard"] = {
    "reps": 5,
    "buffered": {1: 300, 16: 1200},
    "ttft": 3,
    "bulk": (8, 30, 256),
    "paced": (16, 128, 10),
    "slow": (0, 0, 0),
    "abandon": 0,
}


class _GuardBench(bench_run.Bench):
    """The benchmark's setup, the stub echoing ``X-Request-Id`` as vLLM does (so the gateway
    keeps its upstream connections alive, as the floors do); with ``regress_us`` the gateway
    burns that much per request."""

    stub_args = ("--echo",)

    def __init__(self, regress_us: float) -> None:
        super().__init__("guard")
        self.regress_us = regress_us

    def start(self, name: str) -> bench_run.Proc:
        if name != "gateway" or not self.regress_us:
            return super().start(name)
        return self.start_gateway(name, ["-m", "tests.benchmarks.regressed", str(self.regress_us)])


async def _measure(bench: _GuardBench) -> dict[str, float]:
    for name in ("gateway", "floor"):
        bench.start(name)
    ab = await bench_run.buffered(bench, "anthropic", ["floor"])
    st = await bench_run.streamed(bench, "anthropic", ["floor"])
    bench.servers.pop("floor")[0].stop()
    bench.start("relay")
    ob = await bench_run.buffered(bench, "openai", ["relay"])
    return {
        "anthropic buffered c1, CPU/request": ab["c1"]["cpu_ratio"],
        "anthropic buffered c16, CPU/request": ab["c16"]["cpu_ratio"],
        "anthropic stream paced, CPU/1k chunks": st["paced"]["cpu_ratio"],
        "anthropic stream bulk, CPU/1k chunks": st["bulk"]["cpu_ratio"],
        "openai pass-through c16, CPU/request vs relay": ob["c16"]["cpu_ratio"],
        "_gateway_c16_cpu_us": ab["c16"]["gateway"]["cpu_us"],
        "_floor_c16_cpu_us": ab["c16"]["floor"]["cpu_us"],
        "_passthrough_c16_cpu_us": ob["c16"]["gateway"]["cpu_us"],
        "_relay_c16_cpu_us": ob["c16"]["relay"]["cpu_us"],
    }


def _run(regress_us: float) -> dict[str, float]:
    bench = _GuardBench(regress_us)
    try:
        return asyncio.run(_measure(bench))
    finally:
        bench.close()


def check(figures: dict[str, float]) -> list[tuple[str, float, float, float, bool]]:
    """(figure, ratio, limit, ratio when the limit was set, holds) for every limit."""
    return [
        (name, figures[name], limit, then, figures[name] <= limit)
        for name, (limit, then) in LIMITS.items()
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.benchmarks.guard")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument(
        "--regress-us",
        type=float,
        default=0.0,
        help="burn this many µs of CPU per request in the gateway (to see it fail)",
    )
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    figures = _run(args.regress_us)
    if not all(r[4] for r in check(figures)):  # once more: the lower of two runs counts
        again = _run(args.regress_us)
        figures = {k: min(v, again[k]) for k, v in figures.items()}
    rows = check(figures)
    print("| figure (gateway ÷ floor, CPU) | ratio | limit | when set | holds |")
    print("| --- | ---: | ---: | ---: | :---: |")
    for name, ratio, limit, then, holds in rows:
        print(f"| {name} | {ratio:.2f} | {limit:.2f} | {then:.2f} | {'yes' if holds else 'NO'} |")
    print(
        f"\ngateway {figures['_gateway_c16_cpu_us']:.0f} µs/request (floor "
        f"{figures['_floor_c16_cpu_us']:.0f}); pass-through "
        f"{figures['_passthrough_c16_cpu_us']:.0f} µs/request (relay "
        f"{figures['_relay_c16_cpu_us']:.0f}); c16; {time.perf_counter() - t0:.0f} s"
    )
    if args.json:
        Path(args.json).write_text(jsonutil.dumps(figures))
    failed = [r[0] for r in rows if not r[4]]
    if failed:
        print("cost guard FAILED: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
