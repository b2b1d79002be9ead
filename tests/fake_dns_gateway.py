"""``python -m tests.fake_dns_gateway ARGS``: the real gateway (``python -m gateway ARGS``)
with one thing replaced, the system resolver: names resolve to the addresses a JSON file
lists (``FAKE_DNS_FILE``: ``{"name": ["127.0.0.2", ...]}``), read again at every resolution,
so a test changes the answer by rewriting the file (a name it does not list, or a file that
cannot be read, is a resolution failure, as ``getaddrinfo`` raises it). Tests may not edit
/etc/hosts, and a real name cannot be made to answer several loopback addresses that change;
everything after the answer (replicas joining and leaving, pools, probes) is the gateway's.
"""

from __future__ import annotations

import asyncio
import json
import os
import runpy
import socket
from pathlib import Path

from gateway.upstream import discovery


async def _resolve(host: str, port: int) -> list[str]:
    try:
        # in a thread, as the loop's getaddrinfo runs
        answers = json.loads(await asyncio.to_thread(Path(os.environ["FAKE_DNS_FILE"]).read_text))
    except (OSError, ValueError):
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution") from None
    if host not in answers:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return [str(a) for a in answers[host]]


def write_answers(path: Path, answers: dict[str, list[str]]) -> None:
    """Replace the file at once (the gateway never reads half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(answers))
    os.replace(tmp, path)


if __name__ == "__main__":
    discovery.resolve = _resolve
    runpy.run_module("gateway", run_name="__main__", alter_sys=True)
