"""Message Batches survive their gateway: SIGKILL and restart, --workers 2, two replicas on
one PostgreSQL, and a database that cannot be opened.

The upstream is the scripted stub with ``delay:MS`` (each request answered after MS
milliseconds), so a batch takes a few seconds and a kill lands while requests are in flight.
Every request's user message names its custom_id, and the stub records every request it
saw: the tests count upstream calls per custom_id. The guarantees (issue 19): every request
ends with exactly one result; a request whose result was committed is never run again; one
in flight at the kill is run again once its lease lapses; under several workers or replicas
each request is claimed, and so called upstream, exactly once.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import pg
from tests.batch_client import (
    batches_toml,
    calls_per_id,
    create,
    request,
    results_of,
    wait_ended,
)
from tests.conftest import clear_stub, stub_config
from tests.logs import access_lines, log_lines, matching
from tests.procs import Proc, free_port, get, post, start_gateway

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def _db_states(db: Path, batch_id: str) -> dict[str, str]:
    """custom_id -> state (queued, running, done), read from the SQLite file read-only."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        rows = conn.execute(
            "SELECT custom_id, state FROM llm_gateway_batch_requests WHERE batch_id = ?",
            (batch_id,),
        ).fetchall()
    finally:
        conn.close()
    return dict(rows)


def _batch_pids(*procs: Proc) -> set[int]:
    """The pids of the processes that ran batch requests (their access lines)."""
    return {
        line["pid"]
        for proc in procs
        for line in access_lines(proc.output(), route="batch_request", status=200)
    }


def _check_results(base: str, batch_id: str, ids: list[str]) -> None:
    results = results_of(base, batch_id)
    assert sorted(r["custom_id"] for r in results) == sorted(ids)  # one each, no duplicates
    assert all(r["result"]["type"] == "succeeded" for r in results), results


def test_sigkill_mid_batch_then_restart_runs_only_what_was_not_committed(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]], tmp_path: Path
) -> None:
    clear_stub(stub_url)
    db = tmp_path / "batches.sqlite3"
    text = stub_config(stub_url, models=("delay:600",)) + batches_toml(db, lease=3, max_in_flight=4)
    first, url = gateway_factory(text)
    base = url + "/llm"
    ids = [f"kill-{i:02d}" for i in range(16)]
    status, made = create(base, [request(cid, "m-delay:600") for cid in ids])
    assert status == 200, made
    batch_id = made["id"]

    # wait until some results are committed and others are running, then SIGKILL
    deadline = time.monotonic() + 15
    while True:
        states = _db_states(db, batch_id)
        done = {cid for cid, s in states.items() if s == "done"}
        running = {cid for cid, s in states.items() if s == "running"}
        if len(done) >= 4 and running:
            first.signal(signal.SIGKILL)
            break
        assert time.monotonic() < deadline, states
        time.sleep(0.05)
    assert first.wait(10) == -signal.SIGKILL
    assert len(done) < len(ids), "the batch ended before the kill: make it slower"

    second, url2 = gateway_factory(text)  # the same database file, a new process and port
    base2 = url2 + "/llm"
    ended = wait_ended(base2, batch_id, timeout=30)
    assert ended["request_counts"] == {
        "processing": 0,
        "succeeded": 16,
        "errored": 0,
        "canceled": 0,
        "expired": 0,
    }
    _check_results(base2, batch_id, ids)

    calls = calls_per_id(stub_url, ids)
    assert all(calls[cid] == 1 for cid in done), calls  # committed: never run again
    assert all(1 <= n <= 2 for n in calls.values()), calls
    again = {cid for cid, n in calls.items() if n == 2}
    assert again, f"nothing in flight at the kill was run again: {calls}"
    assert again <= set(ids) - done
    # those run twice were in flight at the kill (running at our last look, or claimed
    # between it and the SIGKILL, never committed by the first process)
    assert again & running or not running, (again, running)
    assert _batch_pids(second) == {second.pid}  # the restarted process finished the batch


def test_two_workers_share_one_sqlite_file_and_claim_each_request_once(
    stub_url: str, tmp_path: Path
) -> None:
    clear_stub(stub_url)
    port = free_port()
    text = stub_config(stub_url, models=("delay:300",)).replace(
        "port = 8080", f"port = {port}"
    ) + batches_toml(tmp_path / "batches.sqlite3", max_in_flight=2)
    proc, url = start_gateway(text, tmp_path, extra_args=("--workers", "2"))
    try:
        base = url + "/llm"
        ids = [f"w-{i:02d}" for i in range(16)]
        status, made = create(base, [request(cid, "m-delay:300") for cid in ids])
        assert status == 200, made
        wait_ended(base, made["id"], timeout=30)
        _check_results(base, made["id"], ids)
        assert calls_per_id(stub_url, ids) == dict.fromkeys(ids, 1)
        # both workers ran some (each takes at most two at a time)
        assert len(_batch_pids(proc)) == 2, proc.output()[-3000:]
    finally:
        proc.stop()


def test_two_replicas_share_one_postgresql_database(
    stub_url: str, pg_server: pg.PgServer, gateway_factory: Callable[..., tuple[Proc, str]]
) -> None:
    clear_stub(stub_url)
    url = pg_server.create_db("batches_replicas")
    text = stub_config(stub_url, models=("delay:300",)) + batches_toml(url, max_in_flight=2)
    one, url_one = gateway_factory(text)
    two, url_two = gateway_factory(text)
    ids = [f"pg-{i:02d}" for i in range(16)]
    status, made = create(url_one + "/llm", [request(cid, "m-delay:300") for cid in ids])
    assert status == 200, made
    ended = wait_ended(url_two + "/llm", made["id"], timeout=30)
    assert ended["request_counts"]["succeeded"] == 16
    assert ended["results_url"].startswith(url_two + "/llm/")
    _check_results(url_two + "/llm", made["id"], ids)
    assert calls_per_id(stub_url, ids) == dict.fromkeys(ids, 1)
    assert _batch_pids(one) == {one.pid} and _batch_pids(two) == {two.pid}
    assert pg.PASSWORD not in one.output() + two.output()


def _refused_start(text: str, tmp_path: Path) -> tuple[int, str]:
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(text)
    proc = Proc([sys.executable, "-m", "gateway", "--config", str(cfg), "--port", str(free_port())])
    try:
        code = proc.wait(20)
    finally:
        proc.stop()
    return code, proc.output()


@pytest.mark.parametrize("where", ["parent is a file", "parent cannot be made", "corrupt file"])
def test_a_database_that_cannot_be_opened_stops_the_start(
    stub_url: str, tmp_path: Path, where: str
) -> None:
    if where == "parent is a file":
        (tmp_path / "plain-file").write_text("not a folder")
        db = tmp_path / "plain-file" / "batches.sqlite3"
    elif where == "parent cannot be made":
        db = Path("/proc/llm-gateway-no-such-dir/batches.sqlite3")
    else:
        db = tmp_path / "batches.sqlite3"
        db.write_bytes(b"this is not a SQLite database\n" * 400)
    code, output = _refused_start(
        stub_config(stub_url, models=("ok",)) + batches_toml(db), tmp_path
    )
    assert code == 1, output
    failed = matching(log_lines(output), "batch_store_failed")
    assert len(failed) == 1, output
    assert failed[0]["level"] == "error"
    assert str(db) in failed[0]["detail"] or str(db.parent) in failed[0]["detail"], failed
    assert '"listening"' not in output and "Traceback" not in output, output
    if where == "corrupt file":
        assert db.read_bytes() == b"this is not a SQLite database\n" * 400  # left as it was


def test_a_postgresql_database_that_goes_away_is_a_500_on_batch_routes_only(
    stub_url: str, pg_server: pg.PgServer, gateway_factory: Callable[..., tuple[Proc, str]]
) -> None:
    """The database is dropped under a running gateway (its connections terminated): the
    batch routes answer a 500 ``api_error`` that names no URL or password, and the
    interactive routes answer as before."""
    import psycopg

    name = "batches_goes_away"
    url = pg_server.create_db(name)
    text = stub_config(stub_url, models=("ok",)) + batches_toml(url)
    proc, gw = gateway_factory(text)
    base = gw + "/llm"
    status, made = create(base, [request("before", "m-ok")])
    assert status == 200, made
    wait_ended(base, made["id"])
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
    for method, path, body in (
        ("GET", "", None),
        ("GET", f"/{made['id']}", None),
        ("POST", "", {"requests": [request("after", "m-ok")]}),
        ("GET", f"/{made['id']}/results", None),
    ):
        url_ = f"{base}/v1/messages/batches{path}"
        status, _, raw = post(url_, body) if method == "POST" else get(url_)
        reply = json.loads(raw)
        assert status == 500, (path, raw)
        assert reply["type"] == "error" and reply["error"]["type"] == "api_error", reply
        assert pg.PASSWORD not in raw.decode() and "postgresql" not in raw.decode(), raw
    status, _, raw = post(
        f"{base}/v1/messages",
        {"model": "m-ok", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert status == 200, raw
    assert json.loads(raw)["content"] == [{"type": "text", "text": "Hello from the stub."}]
    assert proc.popen.poll() is None
    assert pg.PASSWORD not in proc.output()


def _batch_running(
    stub_url: str,
    gateway_factory: Callable[..., tuple[Proc, str]],
    db: Path,
    model: str,
    ids: list[str],
    **batches: float,
) -> tuple[str, Proc, str, str]:
    """A gateway on ``db`` running a batch of ``ids`` on the stub's ``model`` scenario, two of
    them in flight: (config text, gateway, its base URL, batch id)."""
    text = stub_config(stub_url, models=(model,)) + batches_toml(db, max_in_flight=2, **batches)
    proc, url = gateway_factory(text)
    status, made = create(url + "/llm", [request(cid, "m-" + model) for cid in ids])
    assert status == 200, made
    batch_id = made["id"]
    deadline = time.monotonic() + 10
    while sorted(_db_states(db, batch_id).values()).count("running") < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return text, proc, url, batch_id


def test_sigkill_while_canceling_then_restart_ends_the_batch_without_rerunning(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]], tmp_path: Path
) -> None:
    """A batch is canceled while requests run, and its gateway is SIGKILLed before they
    finish: after a restart the requests it had in flight are not run again (a canceling
    batch is never claimed from), they count ``canceled`` once their leases lapse, and the
    batch ends. (expire_after = 60 makes the store's sweep, which ends it, run every 6 s.)"""
    clear_stub(stub_url)
    db = tmp_path / "batches.sqlite3"
    ids = [f"cx-{i}" for i in range(6)]
    text, first, url, batch_id = _batch_running(
        stub_url, gateway_factory, db, "delay:2000", ids, lease=2, expire_after=60
    )
    status, _, raw = post(f"{url}/llm/v1/messages/batches/{batch_id}/cancel", b"")
    canceling = json.loads(raw)
    assert status == 200 and canceling["processing_status"] == "canceling", canceling
    first.signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    in_flight = {cid for cid, s in _db_states(db, batch_id).items() if s == "running"}
    assert len(in_flight) == 2, _db_states(db, batch_id)

    _, url2 = gateway_factory(text)
    ended = wait_ended(url2 + "/llm", batch_id, timeout=20)
    assert ended["request_counts"] == {
        "processing": 0,
        "succeeded": 0,
        "errored": 0,
        "canceled": 6,
        "expired": 0,
    }
    results = results_of(url2 + "/llm", batch_id)
    assert sorted(r["custom_id"] for r in results) == ids
    assert all(r["result"] == {"type": "canceled"} for r in results), results
    calls = calls_per_id(stub_url, ids)
    assert calls == {cid: int(cid in in_flight) for cid in ids}, calls


def test_sigterm_hands_requests_in_flight_back_at_once(
    stub_url: str, gateway_factory: Callable[..., tuple[Proc, str]], tmp_path: Path
) -> None:
    """A clean stop (SIGTERM) cancels the batch requests it runs and hands them back: with a
    30 s lease, a restarted gateway runs them again at once instead of waiting it out."""
    clear_stub(stub_url)
    db = tmp_path / "batches.sqlite3"
    ids = [f"term-{i}" for i in range(4)]
    text, first, _, batch_id = _batch_running(
        stub_url, gateway_factory, db, "delay:1000", ids, lease=30
    )
    in_flight = {cid for cid, s in _db_states(db, batch_id).items() if s == "running"}
    first.signal(signal.SIGTERM)
    assert first.wait(10) == 0, first.output()[-2000:]
    assert set(_db_states(db, batch_id).values()) == {"queued"}  # nothing left leased

    _, url2 = gateway_factory(text)
    started = time.monotonic()
    wait_ended(url2 + "/llm", batch_id, timeout=25)
    assert time.monotonic() - started < 25  # two rounds of 1 s, not the 30 s lease
    _check_results(url2 + "/llm", batch_id, ids)
    assert calls_per_id(stub_url, ids) == {cid: 1 + (cid in in_flight) for cid in ids}
