"""Shared fixtures: the scripted stub upstream and real gateway processes."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.ops.metric_kinds import check_writers
from tests import pg, sdk
from tests.procs import REPO, Proc, free_port, start_gateway, wait_http


@pytest.fixture(autouse=True)
def _close_sdk_clients() -> Iterator[None]:
    yield
    sdk.close_all()


# one-writer metric children (gateway/ops/metric_kinds.py) made in this process tell a write
# from a second thread: the test that made one fails
_METRIC_STRAYS = check_writers()


@pytest.fixture(autouse=True)
def _metrics_written_from_one_thread() -> Iterator[None]:
    yield
    strays = list(_METRIC_STRAYS)
    _METRIC_STRAYS.clear()
    assert not strays, f"one-writer metrics written from a second thread: {strays}"


@pytest.fixture(scope="session")
def stub_url() -> Iterator[str]:
    """A scripted OpenAI-compatible upstream process; yields its /v1 base URL."""
    port = free_port()
    proc = Proc([sys.executable, str(REPO / "tests" / "stub_upstream.py"), str(port)])
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc=proc.popen)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.stop()


STUB_MODELS = (
    "ok",
    "reasoning",
    "tools",
    "length",
    "status:500:traceback",
    "status:503",
    "status:429",
    "status:400:context",
    "status:400",
    "status:404",
    "hang-headers",
    "hang-mid",
    "cut-mid",
    "malformed",
    "inband-error",
    "eof-no-finish",
    "slow:50",
)


def stub_config(
    stub_url: str,
    *,
    extra_server: str = "",
    extra_upstream: str = "",
    models: tuple[str, ...] = STUB_MODELS,
) -> str:
    """A gateway config routing alias ``m-<scenario>`` to each stub scenario."""
    text = f"""
[server]
host = "127.0.0.1"
port = 8080
prefix = "/llm"
{extra_server}

[upstreams.stub]
base_url = "{stub_url}"
connect_timeout = 2
header_timeout = 3
idle_timeout = 3
{extra_upstream}
"""
    for name in models:
        text += f'\n[[models]]\nname = "m-{name}"\nupstream = "stub"\nupstream_model = "{name}"\n'
    return text


def stub_requests(stub_url: str) -> list[dict[str, Any]]:
    """Every request the stub has seen (method, path, headers, body, raw, peer), oldest first."""
    with urllib.request.urlopen(stub_url.removesuffix("/v1") + "/_requests", timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def clear_stub(stub_url: str) -> None:
    """Forget the requests the stub has seen (it is shared by the whole session)."""
    req = urllib.request.Request(stub_url.removesuffix("/v1") + "/_requests", method="DELETE")
    with urllib.request.urlopen(req, timeout=5) as resp:
        resp.read()


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[Callable[..., tuple[Proc, str]]]:
    """Start real gateway processes from config text; all are stopped at teardown."""
    started: list[Proc] = []

    def start(config_text: str, **kwargs: object) -> tuple[Proc, str]:
        proc, url = start_gateway(config_text, tmp_path, **kwargs)  # type: ignore[arg-type]
        started.append(proc)
        return proc, url

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(scope="module")
def stub_gateway(
    stub_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Proc, str]]:
    """A gateway in front of the stub, shared by a module's tests: (process, base URL with the
    /llm prefix). Its tests only send requests and read replies (a log line by its request
    id); one that kills it, reads its metrics or needs another config uses gateway_factory."""
    proc, url = start_gateway(stub_config(stub_url), tmp_path_factory.mktemp("stub-gateway"))
    try:
        yield proc, url + "/llm"
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pg.PgServer]:
    """A real throwaway PostgreSQL server (tests/pg.py) for the session; skipped with the
    reason where Debian's binaries or psycopg are absent (a failure in CI)."""
    with pg.running_server() as server:
        yield server


@pytest.fixture(scope="session")
def pg_url(pg_server: pg.PgServer) -> str:
    """A ``postgresql://user:password@127.0.0.1:port/db`` URL of a database of its own."""
    return pg_server.create_db("gateway_test")


from tests.fixtures_llama import *  # noqa: E402,F403  (real llama.cpp upstream fixtures)


def llama_config(base_url: str, *, name: str = "demo", extra_server: str = "") -> str:
    return f"""
[server]
host = "127.0.0.1"
port = 8080
prefix = "/llm"
{extra_server}

[upstreams.llama]
base_url = "{base_url}"
kind = "llamacpp"

[[models]]
name = "{name}"
upstream = "llama"
upstream_model = "demo"
context_window = 1024
"""


@pytest.fixture
def llama_gateway(
    llama_server: str, gateway_factory: Callable[..., tuple[Proc, str]]
) -> tuple[Proc, str]:
    """A gateway process routed to the real llama.cpp server; (process, base URL with /llm)."""
    proc, url = gateway_factory(llama_config(llama_server))
    return proc, url + "/llm"
