"""Cross-core wake-ups per request: why CPU ratios pass instruction ratios on a VM.

    python -m tests.benchmarks.wakeups [--requests 5000] [--reps 2]   # about a minute
    python -m tests.benchmarks.wakeups --check    # CI (.ci/run): fails past LIMIT

Runs the gateway, the gateway with its write coalescing off (``tests/benchmarks/
uncoalesced.py``) and the lean floor, one at a time, pinned to core 1 with the stub upstream
and the driver on core 0 (as ``tests.benchmarks.guard``), buffered Messages requests at 1
and at 16 at once. For each: CPU per request (the server process, ns precision), wall time
per request, and the function-call interrupts core 0 received per request (``CAL`` in
``/proc/interrupts``): the kernel wakes a task on an idle CPU with one, so they count the
server's writes that found its peers asleep. On a virtual machine each costs the writer a
VM exit (13-15 µs of CPU here, against 2.3 µs for a write to an awake reader: measured with
a socket pair); see gateway/ops/coalesce.py. Needs two cores and taskset; Linux only.
Loopback only; every process started is ended by its PID.

``--check`` fails when the gateway's wake-ups per request at 16 at once pass :data:`LIMIT`
times the floor's (today 0.4-0.5: 0.32 against 0.67-0.79; without the coalescing 2.5-2.9):
counts, not times, so a lost coalescing fails it where the CPU guard's noise would hide it.
On a machine whose idle cores poll instead of halting there is nothing to count (the floor
wakes core 0 under 0.05 times a request): it says so and passes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

from tests.benchmarks import driver, guard
from tests.benchmarks import run as bench_run

LIMIT = 1.2  # gateway ÷ floor, wake-ups of core 0 per request at 16 at once


def _interrupts() -> tuple[int, int]:
    """Function-call interrupts received so far by cores 0 and 1."""
    for line in Path("/proc/interrupts").read_text().splitlines():
        parts = line.split()
        if parts and parts[0] == "CAL:":
            return int(parts[1]), int(parts[2])
    raise LookupError("no CAL line in /proc/interrupts")


class _Bench(bench_run.Bench):
    stub_args = ("--echo",)

    def start(self, name: str) -> bench_run.Proc:
        if name != "uncoalesced":
            return super().start(name)
        return self.start_gateway(name, ["-m", "tests.benchmarks.uncoalesced"])


async def _one(bench: _Bench, target: str, conc: int, count: int) -> dict[str, float]:
    server = "gateway" if target == "uncoalesced" else target
    port = bench.servers[target][1]
    _, raw = bench.request(server, "anthropic", "bench:16:0", False)
    await driver.closed_loop(bench_run.HOST, port, raw, concurrency=conc, requests=max(conc, 300))
    pid = bench.pid(target)
    assert pid is not None
    cpu0, irq0, t0 = bench_run.cpu_seconds(pid), _interrupts(), time.perf_counter()
    res = await driver.closed_loop(bench_run.HOST, port, raw, concurrency=conc, requests=count)
    wall = time.perf_counter() - t0
    cpu1, irq1 = bench_run.cpu_seconds(pid), _interrupts()
    n = len(res.results)
    return {
        "cpu_us": (cpu1 - cpu0) / n * 1e6,
        "wall_us": wall / n * 1e6,
        "wakeups_core0": (irq1[0] - irq0[0]) / n,
        "wakeups_core1": (irq1[1] - irq0[1]) / n,
        "ok": res.ok / n,
    }


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


async def _measure(bench: _Bench, requests: int, reps: int) -> dict[str, dict[str, float]]:
    targets = ["gateway", "uncoalesced", "floor"]
    for name in targets:
        bench.start(name)
    out: dict[str, dict[str, float]] = {}
    for conc, count in ((1, max(300, requests // 3)), (16, requests)):
        runs: dict[str, list[dict[str, float]]] = {t: [] for t in targets}
        for rep in range(reps):
            for target in targets[rep % 3 :] + targets[: rep % 3]:
                runs[target].append(await _one(bench, target, conc, count))
        for target, rs in runs.items():
            out[f"{target} c{conc}"] = {k: _median([r[k] for r in rs]) for k in rs[0]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.benchmarks.wakeups")
    ap.add_argument("--requests", type=int, default=5000, help="at 16 at once (a third at 1)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--check", action="store_true", help=f"exit 1 past {LIMIT}x the floor's")
    args = ap.parse_args(argv)
    try:
        _interrupts()
    except (OSError, LookupError):
        print("no per-core function-call interrupt counts here: nothing to measure")
        return 0 if args.check else 2
    if (os.cpu_count() or 1) < 2 or not bench_run._which("taskset"):
        print("needs two cores and taskset: nothing to measure")
        return 0 if args.check else 2
    assert "guard" in bench_run.MODES, guard  # the guard's mode: its stub models
    bench = _Bench("guard")
    try:
        figures = asyncio.run(_measure(bench, args.requests, args.reps))
    finally:
        bench.close()
    print("| server, concurrency | CPU µs/req | wall µs/req | wake-ups of core 0 /req |")
    print("| --- | ---: | ---: | ---: |")
    for name, f in figures.items():
        print(f"| {name} | {f['cpu_us']:.1f} | {f['wall_us']:.1f} | {f['wakeups_core0']:.2f} |")
    for conc in (1, 16):
        floor = figures[f"floor c{conc}"]["cpu_us"]
        print(
            f"c{conc}: gateway ÷ floor {figures[f'gateway c{conc}']['cpu_us'] / floor:.2f}, "
            f"uncoalesced ÷ floor {figures[f'uncoalesced c{conc}']['cpu_us'] / floor:.2f}"
        )
    if not args.check:
        return 0
    mine, floors = figures["gateway c16"]["wakeups_core0"], figures["floor c16"]["wakeups_core0"]
    if floors < 0.05:
        print("this machine's idle cores do not halt (the floor wakes core 0 < 0.05/request)")
        return 0
    ratio = mine / floors
    verdict = "ok" if ratio <= LIMIT else "FAILED"
    print(f"wake-ups at c16, gateway ÷ floor {ratio:.2f}  limit {LIMIT}: {verdict}")
    # the same run's gateway without the coalescing: what the check would say of a lost one
    lost = figures["uncoalesced c16"]["wakeups_core0"] / floors
    print(f"(without the coalescing {lost:.2f}: {'ok' if lost <= LIMIT else 'would fail'})")
    return 0 if ratio <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
