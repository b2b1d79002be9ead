"""Peak memory of the gateway under the two loads of issue 31 (what requests in flight hold).

    python -m tests.benchmarks.memory replay [--count 150] [--every 0.1] [--hold 20]
    python -m tests.benchmarks.memory batch [--count 100000]

``replay``: ``--count`` Messages requests, one every ``--every`` seconds, each replaying one
thinking signature that seals 4 MiB of a looping model's reasoning (the gateway restores it),
against an upstream that reads the request and answers only after ``--hold`` seconds: every
request is in flight at once. ``batch``: one Message Batches create of ``--count`` small
requests (``--text-bytes`` of user message each; SQLite in a temporary directory).

Reported: the gateway's peak RSS (``VmHWM``), the highest sum of the RSS of the gateway and
its child processes seen by a 20 ms sampler (a container's memory limit counts them all),
the RSS 20 s after the load, and the statuses. Defaults are the shipped ones unless
``--server`` adds ``[server]`` lines. Loopback only; every process started here is stopped
here by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.messages.from_chat import signatures
from tests.procs import free_port, metric, post, start_gateway

MIB = 2**20
KEY = "memory-benchmark-signing-key-0123456789"
LOOP = "Wait, let me reconsider. The user wants the sum of the list. Let me check again.\n"
_REPLY = {
    "id": "c1",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


def _kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the decoder child, the PDF workers, the forkserver)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                raw = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents.setdefault(int(raw[raw.rindex(")") + 2 :].split()[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, ()))
    return out


class Sampler:
    """The highest summed RSS of a process tree, sampled every 20 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def now_kb(self) -> int:
        return sum(_kb(p, "VmRSS") for p in _tree(self.pid))

    def _run(self) -> None:
        tick = 0
        kids = _tree(self.pid)
        while not self._stop.wait(0.02):
            tick += 1
            if tick % 25 == 0:
                kids = _tree(self.pid)
            self.peak_kb = max(self.peak_kb, sum(_kb(p, "VmRSS") for p in kids))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


async def _slow_upstream(hold: float) -> tuple[web.AppRunner, int]:
    async def chat(request: web.Request) -> web.Response:
        while await request.content.readany():  # read and drop it: only the gateway counts
            pass
        await asyncio.sleep(hold)
        return web.json_response(_REPLY)

    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


def _config(upstream: str, extra: str, database: str) -> str:
    return f"""
[server]
host = "127.0.0.1"
prefix = "/llm"
log_level = "warning"
signing_key_env = "GW_MEMORY_KEY"
{extra}

[upstreams.slow]
base_url = "{upstream}"
header_timeout = 600
idle_timeout = 600

[[models]]
name = "m"
upstream = "slow"
upstream_model = "m"

[batches]
database = "sqlite:///{database}"
"""


def replay_body() -> bytes:
    reasoning = LOOP * (4 * MIB // len(LOOP))
    signature = signatures.seal(KEY.encode(), reasoning)
    return json.dumps(
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [
                {"role": "user", "content": "sum this list"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "", "signature": signature},
                        {"type": "text", "text": "ok"},
                    ],
                },
                {"role": "user", "content": "go on"},
            ],
        }
    ).encode()


def batch_body(count: int, text_bytes: int) -> bytes:
    text = ("Summarise this document in one sentence. " * (text_bytes // 41 + 1))[:text_bytes]
    return json.dumps(
        {
            "requests": [
                {
                    "custom_id": f"req-{i:06d}",
                    "params": {
                        "model": "m",
                        "max_tokens": 64,
                        "messages": [{"role": "user", "content": f"{i}: {text}"}],
                    },
                }
                for i in range(count)
            ]
        }
    ).encode()


async def _replays(url: str, body: bytes, count: int, every: float) -> Counter[int]:
    statuses: Counter[int] = Counter()

    async def one() -> None:
        status, _, _ = await asyncio.to_thread(post, url + "/llm/v1/messages", body, timeout=600)
        statuses[status] += 1

    tasks = []
    for _ in range(count):
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(every)
    await asyncio.gather(*tasks)
    return statuses


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    runner, port = await _slow_upstream(args.hold)
    tmp = Path(tempfile.mkdtemp(prefix="gw-memory-"))
    config = _config(
        f"http://127.0.0.1:{port}/v1", "\n".join(args.server), str(tmp / "batches.sqlite3")
    )
    proc, url = start_gateway(config, tmp, env={"GW_MEMORY_KEY": KEY})
    report: dict[str, Any] = {"load": args.load}
    try:
        sampler = Sampler(proc.pid)
        report["idle_mib"] = round(sampler.now_kb() / 1024)
        t0 = time.monotonic()
        if args.load == "replay":
            body = replay_body()
            report["body_kib"] = len(body) // 1024
            asyncio.get_running_loop().set_default_executor(
                __import__("concurrent.futures").futures.ThreadPoolExecutor(args.count + 4)
            )
            report["statuses"] = dict(await _replays(url, body, args.count, args.every))
        else:
            body = batch_body(args.count, args.text_bytes)
            report["body_mib"] = round(len(body) / MIB, 1)
            status, _, reply = await asyncio.to_thread(
                post, url + "/llm/v1/messages/batches", body, timeout=600
            )
            report["statuses"] = {status: 1}
            if status != 200:
                report["reply"] = reply[:300].decode(errors="replace")
        report["load_s"] = round(time.monotonic() - t0, 1)
        report["peak_tree_mib"] = round(sampler.peak_kb / 1024)
        report["peak_gateway_mib"] = round(_kb(proc.pid, "VmHWM") / 1024)
        report["budget_held_after"] = metric(url, "llm_gateway_memory_budget_held_bytes")
        report["sheds"] = metric(url, "llm_gateway_memory_budget_sheds_total")
        await asyncio.sleep(args.after)
        report[f"rss_{args.after:.0f}s_after_mib"] = round(sampler.now_kb() / 1024)
        sampler.stop()
    finally:
        proc.stop()
        await runner.cleanup()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("load", choices=("replay", "batch"))
    parser.add_argument("--count", type=int)
    parser.add_argument("--every", type=float, default=0.1)
    parser.add_argument("--hold", type=float, default=20.0)
    parser.add_argument("--after", type=float, default=20.0)
    parser.add_argument(
        "--text-bytes",
        type=int,
        default=1000,
        help="batch: the characters of each request's user message",
    )
    parser.add_argument(
        "--server",
        action="append",
        default=[],
        help="a [server] line, e.g. 'memory_budget_mb = 256'",
    )
    args = parser.parse_args(argv)
    if args.count is None:
        args.count = 150 if args.load == "replay" else 100_000
    print(json.dumps(asyncio.run(main_async(args))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
