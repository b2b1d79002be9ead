"""User-space instructions a request costs, counted by callgrind: the repeatable figure.

    python -m tests.benchmarks.instructions [--targets gateway,floor,relay] [--requests 300]
        [--warmup 100] [--concurrency 1] [--api anthropic|openai|both] [--stream]
    python -m tests.benchmarks.instructions --check [--regress-us N]   # CI: .ci/run

CPU time on a shared 2-core machine moves by about ±15% between runs; the instructions a
process executes do not (repeat runs agree within about 0.5%). Each target is started under
``valgrind --tool=callgrind`` with instrumentation off, warmed up, counted over ``--requests``
requests (``callgrind_control -i on`` / ``off``), and stopped; the figure is the instructions
counted divided by the requests. Batches are off in the gateway's config here (its scheduler
sleeps between polls, and a timer firing inside the window would be counted).

Used to measure each cut on the request path before and after (docs/performance.md), and by
CI (``--check``): the ratios gateway ÷ lean floor (buffered Messages) and pass-through ÷ bare
relay must stay within :data:`LIMITS`; being counts, not times, they catch a smaller step
than the CPU guard (tests/benchmarks/guard.py) can on a noisy machine. ``--regress-us N``
shows it failing. Needs valgrind (Debian's package). Loopback only; every process started is
ended by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.benchmarks import driver
from tests.benchmarks import run as bench_run
from tests.procs import wait_http

HOST = bench_run.HOST
_EXTRA: list[str] = os.environ.get("CALLGRIND_EXTRA", "").split()
_TOTALS = re.compile(rb"^(?:totals|summary): (\d+)", re.M)

# ratio -> (limit, today's ratio when the limit was set): what ``--check`` fails past. The
# instructions a request costs move by under 1% between runs (the CPU guard's ratios by
# about 15%), so the limits sit about 15% above today's: a step of 1.2x is caught.
LIMITS: dict[str, tuple[float, float]] = {
    "gateway ÷ floor": (1.45, 1.25),
    "pass-through ÷ relay": (0.97, 0.84),
}


def _valgrind_args(out: Path) -> list[str]:
    return [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        "--dump-instr=no",
        *_EXTRA,
    ]


class _Target:
    def __init__(self, bench: bench_run.Bench, name: str, regress_us: float = 0.0) -> None:
        self.name = name
        self.port = bench_run.free_port()
        self.out = bench.tmp / f"callgrind.{name}.out"
        if name == "gateway":
            # with regress_us: the gateway with a middleware burning that much CPU per
            # request (tests/benchmarks/regressed.py), to see --check fail
            module = ["tests.benchmarks.regressed", str(regress_us)] if regress_us else ["gateway"]
            args = [sys.executable, "-m", *module, "--config", str(bench.cfg)]
            args += ["--port", str(self.port)]
            env = {
                "BENCH_GATEWAY_KEYS": bench_run.API_KEY,
                "XDG_STATE_HOME": str(bench.tmp / "state"),
            }
        else:
            floor = {"floor": "lean_floor", "relay": "bare_relay"}[name]
            args = [sys.executable, "-m", f"tests.benchmarks.{floor}", str(self.port)]
            args.append(bench.stub_url)
            env = {}
        self.log = open(bench.tmp / f"{name}.callgrind.log", "wb")  # closed in stop()
        self.popen = subprocess.Popen(
            _valgrind_args(self.out) + args,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=str(bench_run.REPO),
            env={**os.environ, **env},
        )
        wait_http(f"http://{HOST}:{self.port}/health", timeout=240, proc=self.popen)

    def control(self, *flags: str) -> None:
        subprocess.run(
            ["callgrind_control", *flags, str(self.popen.pid)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )

    def stop(self) -> int:
        """Ends the process and returns the instructions counted."""
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(120)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        self.log.close()
        if not self.out.exists():
            return 0
        return max((int(m) for m in _TOTALS.findall(self.out.read_bytes())), default=0)


def _request(bench: bench_run.Bench, target: str, api: str, stream: bool) -> bytes:
    model = _MODEL[0]
    bench.servers[target] = (None, _PORTS[target])  # type: ignore[assignment]
    return bench.request(target, api, model, stream)[1]


_PORTS: dict[str, int] = {}
_MODEL = ["bench:16:0"]  # the stub's reply shape (tests/benchmarks/stub_fast.py): --model


async def _count(
    bench: bench_run.Bench,
    name: str,
    apis: list[str],
    *,
    requests: int,
    warmup: int,
    concurrency: int,
    stream: bool,
    regress_us: float = 0.0,
) -> dict[str, float]:
    figures: dict[str, float] = {}
    for api in apis:
        if (name == "floor" and api == "openai") or (name == "relay" and api == "anthropic"):
            continue
        target = _Target(bench, name, regress_us)
        _PORTS[name] = target.port
        try:
            raw = _request(bench, name, api, stream)
            await driver.closed_loop(
                HOST, target.port, raw, concurrency=concurrency, requests=warmup
            )
            target.control("-i", "on")
            res = await driver.closed_loop(
                HOST, target.port, raw, concurrency=concurrency, requests=requests
            )
            target.control("-i", "off")
            if res.ok != requests:
                raise RuntimeError(f"{name}: {res.ok} of {requests} requests complete")
        finally:
            total = target.stop()
        figures[f"{name} {api}{' stream' if stream else ''}"] = total / requests
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", default="gateway,floor,relay")
    ap.add_argument("--api", default="both", choices=["anthropic", "openai", "both"])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--model", default="bench:16:0", help="bench:N:MS, N chunks MS ms apart")
    ap.add_argument(
        "--check",
        action="store_true",
        help="all three targets, both APIs; exit 1 when a ratio passes its limit (LIMITS)",
    )
    ap.add_argument(
        "--regress-us",
        type=float,
        default=0.0,
        help="the gateway burns this much CPU per request (under valgrind: ~50x fewer "
        "instructions than natively), to see --check fail",
    )
    args = ap.parse_args(argv)
    _MODEL[0] = args.model
    if args.check:
        args.model = _MODEL[0] = "bench:16:0"
        args.targets, args.api, args.stream = "gateway,floor,relay", "both", False
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    apis = ["anthropic", "openai"] if args.api == "both" else [args.api]
    bench = bench_run.Bench("tiny", echo=True)
    # batches off: the scheduler's poll timer must not land in the counted window
    bench.cfg.write_text(bench.cfg.read_text() + "\n[batches]\nenabled = false\n")
    figures: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        for name in args.targets.split(","):
            figures.update(
                asyncio.run(
                    _count(
                        bench,
                        name,
                        apis,
                        requests=args.requests,
                        warmup=args.warmup,
                        concurrency=args.concurrency,
                        stream=args.stream,
                        regress_us=args.regress_us,
                    )
                )
            )
    finally:
        bench.close()
    for key, value in figures.items():
        print(f"{key:32} {value / 1000:9.1f} K instructions/request")
    ratios: dict[str, float] = {}
    floor = figures.get("floor anthropic" + (" stream" if args.stream else ""))
    gw = figures.get("gateway anthropic" + (" stream" if args.stream else ""))
    if floor and gw:
        ratios["gateway ÷ floor"] = gw / floor
    relay, pt = figures.get("relay openai"), figures.get("gateway openai")
    if relay and pt:
        ratios["pass-through ÷ relay"] = pt / relay
    failed = False
    for key, ratio in ratios.items():
        limit, then = LIMITS[key]
        over = args.check and ratio > limit
        failed |= over
        verdict = f"  limit {limit:.2f} (today {then:.2f}): {'OVER' if over else 'ok'}"
        print(f"{key:32} {ratio:9.2f}{verdict if args.check else ''}")
    print(f"({time.perf_counter() - t0:.0f} s; callgrind's files in {bench.tmp})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
