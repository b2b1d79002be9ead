"""Session affinity against round-robin, on real llama.cpp replicas: time to first token and the
engines' own prompt-cache figures.

    python -m tests.benchmarks.affinity [--tiny] [--json out.json] [--replicas N]

Each policy gets its own engines, fresh, all started at once: ``--replicas`` llama.cpp
servers (``python -m gateway.demo.llama`` serving the generated tiny model with 2 slots;
llama-server's defaults: prompt caching on, a host-memory prompt cache of 8 GiB
(``--cache-ram-mib``); ``/metrics`` switched on) behind one gateway with ``base_urls`` and
``balance = "affinity"`` or ``"round_robin"``. The same conversations run against each,
request by request, the policies taking turns (which goes first alternates), so load from
elsewhere on the machine hurts both alike:

* several Claude Code-like sessions (7; 3 in ``--tiny``), each named by Claude Code's
  ``x-claude-code-session-id`` header, their turns interleaved: turn 0 of every session, then
  turn 1 of every session, and so on, one request at a time (so a time to first token is the
  engine's prefill and the gateway, never a queue behind another session's request; with more
  sessions than the engines have slots, each turn finds its slot taken by other sessions).
  The number of sessions is no multiple of the replicas' (one more is added if it would be):
  with a multiple, round-robin over a fixed interleaving sends each session to the same
  replica every turn, which is affinity by accident (a first run with 8 sessions on 2
  replicas measured exactly the same tokens under both policies);
* a prompt of Claude Code's shape: a system prompt and tool text every session shares
  (``common`` tokens, 12,000), a session's own context (``own``, 18,000: the files it read),
  then per turn the previous answer and a tool result (``growth``, 2,000), so the prompt grows
  each turn, as a coding session's does: 30,000 tokens at the first turn, 40,000 at the sixth.
  Claude Code's are 20-80k; the tiny model was trained for 131,072, the engines get that as
  n_ctx, shared by their 2 slots, so the last turn must fit in 65,536.

Figures, per policy: time to first token (client-side: from the send to the first
``content_block_delta`` of the stream), p50 and p95 over every turn and over the turns after the
first; the engines' own prompt tokens computed and read from their cache
(``llamacpp:prompt_tokens_total`` and ``llamacpp:prompt_tokens_cached_total`` on each engine's
``/metrics``, read before and after); the requests each replica served (the gateway's
``llm_gateway_upstream_replica_requests_total``); client errors. Ratios round-robin / affinity.

Every process started here is ended here, by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.procs import start_gateway

POLICIES = ("affinity", "round_robin")
# one user session's words: code-ish vocabulary, so the BPE makes ordinary-length tokens
_WORDS = (
    "def",
    "return",
    "self",
    "value",
    "import",
    "class",
    "path",
    "config",
    "request",
    "stream",
    "token",
    "replica",
    "session",
    "cache",
    "engine",
    "prompt",
    "reply",
    "error",
    "test",
    "upstream",
    "gateway",
    "async",
    "await",
    "None",
    "True",
    "False",
    "for",
    "in",
    "if",
    "else",
    "with",
    "open",
    "read",
    "write",
    "json",
    "dict",
    "list",
)

# per mode: engines' n_ctx (shared by their 2 slots), sessions, turns, the prompt's parts in tokens
MODES: dict[str, dict[str, int]] = {
    # Claude Code's prompt is 20-80k tokens; a slot holds n_ctx / 2 = 65,536 here (the tiny
    # model's trained context is 131,072), and the last turn's prompt must fit in one slot
    "full": {
        "ctx": 131072,
        "sessions": 7,
        "turns": 6,
        "common": 12000,
        "own": 18000,
        "growth": 2000,
    },
    "tiny": {"ctx": 16384, "sessions": 3, "turns": 3, "common": 1000, "own": 1000, "growth": 200},
}


def _text(rnd: random.Random, tokens: int) -> str:
    """About ``tokens`` tokens of text (the tiny model's BPE: about 1 token per word here)."""
    return " ".join(rnd.choice(_WORDS) for _ in range(tokens))


@dataclass
class Session:
    sid: str
    system: str
    messages: list[dict[str, Any]] = field(default_factory=list)


def _sessions(mode: dict[str, int]) -> list[Session]:
    common = _text(random.Random(0), mode["common"])
    out = []
    for s in range(mode["sessions"]):
        rnd = random.Random(1000 + s)
        first = f"Session {s}. Context:\n" + _text(rnd, mode["own"]) + "\nFix the failing test."
        out.append(
            Session(
                f"00000000-0000-4000-8000-{s:012d}", common, [{"role": "user", "content": first}]
            )
        )
    return out


def _tool_result(s: int, turn: int, tokens: int) -> str:
    return f"Tool result {turn}:\n" + _text(random.Random(s * 100 + turn), tokens)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _turn(http: Any, url: str, session: Session) -> tuple[float, str]:
    """One streamed turn; -> (time to first token in s, the answer's text)."""
    body = {
        "model": "m",
        "max_tokens": 64,
        "system": session.system,
        "stream": True,
        "messages": session.messages,
    }
    headers = {
        "x-claude-code-session-id": session.sid,
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
    }
    sent = time.perf_counter()
    ttft: float | None = None
    text: list[str] = []
    event = b""
    async with http.post(url, data=json.dumps(body), headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"status {resp.status}: {(await resp.read())[:300]!r}")
        async for line in resp.content:
            if line.startswith(b"event: "):
                event = line[7:].strip()
                if event == b"content_block_delta" and ttft is None:
                    ttft = time.perf_counter() - sent
                if event == b"error":
                    raise RuntimeError("error event in the stream")
            elif line.startswith(b"data: ") and event == b"content_block_delta":
                delta = json.loads(line[6:])["delta"]
                if delta.get("type") == "text_delta":
                    text.append(delta["text"])
    if ttft is None or event != b"message_stop":
        raise RuntimeError("the stream ended without a delta or without message_stop")
    return ttft, "".join(text)


async def _conversations(urls: dict[str, str], mode: dict[str, int]) -> dict[str, Any]:
    """Every session's turns against every fleet (policy -> its gateway's messages URL).

    Interleaved: turn 0 of each session, then turn 1 of each, ..., one request at a time, so a
    time to first token is the engine's prefill, not a queue behind another request; and each
    turn is sent to the policies in turn (which goes first alternates), so a noisy neighbour
    on the machine hurts both alike.
    """
    import aiohttp

    policies = list(urls)
    sessions = {p: _sessions(mode) for p in policies}
    ttfts: dict[str, list[tuple[int, float]]] = {p: [] for p in policies}  # (turn, s)
    spent = dict.fromkeys(policies, 0.0)  # seconds in requests
    errors: dict[str, list[str]] = {p: [] for p in policies}
    live = {p: set(range(mode["sessions"])) for p in policies}
    timeout = aiohttp.ClientTimeout(total=600)
    step = 0
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for turn in range(mode["turns"]):
            for s in range(mode["sessions"]):
                step += 1
                for policy in policies[step % 2 :] + policies[: step % 2]:
                    if s not in live[policy]:
                        continue
                    session = sessions[policy][s]
                    started = time.perf_counter()
                    try:
                        ttft, answer = await _turn(http, urls[policy], session)
                    except Exception as exc:  # counted; the session stops (history gone)
                        errors[policy].append(f"session {s} turn {turn}: {exc}")
                        live[policy].discard(s)
                        continue
                    finally:
                        spent[policy] += time.perf_counter() - started
                    ttfts[policy].append((turn, ttft))
                    session.messages += [
                        {"role": "assistant", "content": answer or "ok"},
                        {"role": "user", "content": _tool_result(s, turn, mode["growth"])},
                    ]
    return {p: _ttft_figures(ttfts[p], errors[p], spent[p]) for p in policies}


def _ttft_figures(
    ttfts: list[tuple[int, float]], errors: list[str], spent: float
) -> dict[str, Any]:
    every = [t for _, t in ttfts]
    later = [t for turn, t in ttfts if turn > 0]
    first = [t for turn, t in ttfts if turn == 0]
    ms = 1000.0
    nan = float("nan")
    return {
        "requests": len(ttfts),
        "errors": len(errors),
        "error_samples": errors[:3],
        "elapsed_s": spent,
        "ttft_p50_ms": statistics.median(every) * ms if every else nan,
        "ttft_p95_ms": _percentile(every, 0.95) * ms if every else nan,
        "ttft_later_p50_ms": statistics.median(later) * ms if later else nan,
        "ttft_later_p95_ms": _percentile(later, 0.95) * ms if later else nan,
        "ttft_first_p50_ms": statistics.median(first) * ms if first else nan,
    }


def _prom(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def _engine_tokens(root: str) -> tuple[float, float]:
    """(prompt tokens computed, prompt tokens read from the cache) so far, from /metrics."""
    text = _get(f"{root}/metrics").replace("llamacpp:", "llamacpp_")
    return _prom(text, "llamacpp_prompt_tokens_total"), _prom(
        text, "llamacpp_prompt_tokens_cached_total"
    )


class Fleet:
    """One policy's engines (fresh: empty caches) and the gateway in front of them."""

    def __init__(
        self,
        policy: str,
        mode: dict[str, int],
        replicas: int,
        model: str,
        workdir: Path,
        cache_ram_mib: int | None,
    ) -> None:
        from gateway.demo.llama import LlamaServer

        extra = ["endpoint_metrics=true"]
        if cache_ram_mib is not None:
            extra.append(f"cache_ram_mib={cache_ram_mib}")
        self.policy = policy
        self.workdir = workdir
        self.engines = [
            LlamaServer(
                model, ctx_size=mode["ctx"], parallel=2, threads=1, alias="demo", extra_args=extra
            )
            for _ in range(replicas)
        ]
        self.gateway: Any = None
        self.base = ""
        self._before: list[tuple[float, float]] = []

    def start(self) -> str:
        for engine in self.engines:
            engine.start(timeout=120)
        urls = ", ".join(f'"{e.base_url}"' for e in self.engines)
        self.gateway, self.base = start_gateway(
            f"""
[server]
host = "127.0.0.1"
prefix = "/llm"
log_level = "warning"

[upstreams.fleet]
base_urls = [{urls}]
kind = "llamacpp"
balance = "{self.policy}"

[[models]]
name = "m"
upstream = "fleet"
upstream_model = "demo"
""",
            self.workdir,
        )
        self._before = [_engine_tokens(str(e.root_url)) for e in self.engines]
        return f"{self.base}/llm/v1/messages"

    def figures(self) -> dict[str, Any]:
        """The engines' prompt tokens since start(), and the requests each replica served."""
        after = [_engine_tokens(str(e.root_url)) for e in self.engines]
        computed = sum(a[0] - b[0] for a, b in zip(after, self._before, strict=True))
        cached = sum(a[1] - b[1] for a, b in zip(after, self._before, strict=True))
        metrics = _get(f"{self.base}/metrics")
        served = [
            _prom(
                metrics,
                "llm_gateway_upstream_replica_requests_total",
                replica=str(e.root_url).split("://")[1],
                outcome="ok",
            )
            for e in self.engines
        ]
        return {
            "prompt_tokens_computed": computed,
            "prompt_tokens_cached": cached,
            "cache_hit_share": cached / (computed + cached) if computed + cached else 0.0,
            "requests_per_replica": served,
        }

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        for engine in self.engines:
            engine.stop()


_ROWS = (
    ("TTFT p50 ms, every turn", "ttft_p50_ms"),
    ("TTFT p95 ms, every turn", "ttft_p95_ms"),
    ("TTFT p50 ms, turns after the first", "ttft_later_p50_ms"),
    ("TTFT p95 ms, turns after the first", "ttft_later_p95_ms"),
    ("TTFT p50 ms, first turns", "ttft_first_p50_ms"),
    ("prompt tokens the engines computed", "prompt_tokens_computed"),
    ("prompt tokens read from the engines' caches", "prompt_tokens_cached"),
    ("cache-hit share of prompt tokens", "cache_hit_share"),
    ("time in requests s", "elapsed_s"),
)


def report(result: dict[str, Any]) -> str:
    a, r = result["affinity"], result["round_robin"]
    lines = [
        "| figure | affinity | round-robin | round-robin ÷ affinity |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, key in _ROWS:
        ratio = r[key] / a[key] if a[key] else float("nan")
        fmt = "{:.2f}" if key == "cache_hit_share" or key.endswith("_s") else "{:,.0f}"
        lines.append(f"| {label} | {fmt.format(a[key])} | {fmt.format(r[key])} | {ratio:.2f} |")
    lines.append(
        "| requests per replica | "
        + " / ".join(f"{n:.0f}" for n in a["requests_per_replica"])
        + " | "
        + " / ".join(f"{n:.0f}" for n in r["requests_per_replica"])
        + " | |"
    )
    lines.append(f"| client errors | {a['errors']} | {r['errors']} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.affinity", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--tiny", action="store_true", help="seconds: what the smoke test runs")
    ap.add_argument("--json", help="also write every figure to this file")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument(
        "--cache-ram-mib",
        type=int,
        default=None,
        help="the engines' host-memory prompt cache (llama-server's --cache-ram; "
        "default: its own, 8192); 0: off, as engines without one",
    )
    args = ap.parse_args(argv)
    from gateway.demo.tinymodel import ensure_model

    mode = dict(MODES["tiny" if args.tiny else "full"])
    if mode["sessions"] % args.replicas == 0:  # see the module docstring
        mode["sessions"] += 1
    # a SIGTERM unwinds like an interrupt, so the finally blocks end every process started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    model, _ = ensure_model()
    result: dict[str, Any] = {
        "mode": "tiny" if args.tiny else "full",
        "replicas": args.replicas,
        "settings": mode,
        "cpus": os.cpu_count(),
        "cache_ram_mib": args.cache_ram_mib,
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-affinity-") as tmp:
        fleets = [
            Fleet(p, mode, args.replicas, model, Path(tmp) / p, args.cache_ram_mib)
            for p in POLICIES
        ]
        try:
            urls = {}
            for fleet in fleets:
                fleet.workdir.mkdir()
                urls[fleet.policy] = fleet.start()
            result.update(asyncio.run(_conversations(urls, mode)))
            for fleet in fleets:
                result[fleet.policy].update(fleet.figures())
        finally:
            for fleet in fleets:
                fleet.stop()
    for policy in POLICIES:
        print(
            f"{policy}: {result[policy]['requests']} turns, "
            f"{result[policy]['errors']} errors, {result[policy]['elapsed_s']:.1f} s",
            flush=True,
        )
    a, r = result["affinity"], result["round_robin"]
    result["ratios"] = {key: (r[key] / a[key] if a[key] else None) for _, key in _ROWS}
    print()
    print(report(result))
    print()
    print(
        f"mode {result['mode']}, {args.replicas} replicas, {mode['sessions']} sessions x "
        f"{mode['turns']} turns, prompt {mode['common']} shared + {mode['own']} own tokens "
        f"+ {mode['growth']} a turn, engines n_ctx {mode['ctx']} (2 slots), cache_ram_mib "
        f"{'default' if args.cache_ram_mib is None else args.cache_ram_mib}, "
        f"cpus {os.cpu_count()}, {time.perf_counter() - started:.0f} s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if not (a["errors"] or r["errors"]) else 1


if __name__ == "__main__":
    sys.exit(main())
