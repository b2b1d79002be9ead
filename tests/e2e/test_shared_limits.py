"""One budget across gateway processes: the clients' counters in a real redis-server.

Two processes take from one meter at once through the real RedisCounters and grant exactly
its limit between them (each with its own LocalStore would grant it twice). A gateway with
``[limits] redis_url_env`` says at start that its counters are shared and connects; one whose
Redis is down still starts, counts and logs the failure, and never writes the URL's password.

Two gateway processes sharing one redis-server answer one client's requests_per_minute
together: its limit in 200s across both, the rest 429; with Redis down, ``on_store_error``
decides (open: every request passes uncounted; closed: 529).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.conftest import stub_config
from tests.logs import log_lines, matching, wait_for_line
from tests.procs import REPO, free_port, get, metric, post
from tests.redis_server import running_redis

pytestmark = pytest.mark.e2e


def test_two_processes_grant_one_limit_between_them() -> None:
    limit, takes = 50, 60
    with running_redis() as server:
        start_at = f"{time.time() + 1.5:.3f}"
        args = [server.url, "team:rpm", str(limit), str(takes), start_at]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.counters_driver", *args],
                cwd=REPO,
                stdout=subprocess.PIPE,
            )
            for _ in range(2)
        ]
        outs = []
        for p in procs:
            out, _ = p.communicate(timeout=60)
            assert p.returncode == 0
            outs.append(json.loads(out))
    assert [o["failed"] for o in outs] == [0, 0]
    assert sum(o["granted"] for o in outs) == limit  # not 2 x 50
    assert sum(o["refused"] for o in outs) == 2 * takes - limit
    assert all(o["granted"] > 0 for o in outs), outs  # both took part


def _config(env_name: str) -> str:
    port = free_port()
    return stub_config(f"http://127.0.0.1:{port}/v1", models=("ok",)) + (
        f'\n[limits]\nredis_url_env = "{env_name}"\non_store_error = "closed"\n'
    )


def test_a_gateway_shares_its_counters_when_redis_url_is_set(gateway_factory) -> None:
    with running_redis() as server:
        proc, url = gateway_factory(_config("TEST_REDIS_URL"), env={"TEST_REDIS_URL": server.url})
        line = wait_for_line(proc.output, lambda ln: ln.get("event") == "limits_counters")
        assert line["store"] == "redis"

        # the start-up connection is made: the gateway is one of the server's clients
        def clients() -> int:
            info = subprocess.run(
                ["redis-cli", "-p", str(server.port), "CLIENT", "LIST"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            return info.stdout.count("\n")

        deadline = time.monotonic() + 10
        while clients() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert clients() >= 2  # redis-cli's own and the gateway's
        assert metric(url, "llm_gateway_limits_store_errors_total") == 0
        assert not matching(log_lines(proc.output()), "limits_store_error")


def test_a_gateway_without_redis_url_counts_alone(gateway_factory) -> None:
    port = free_port()
    proc, _ = gateway_factory(stub_config(f"http://127.0.0.1:{port}/v1", models=("ok",)))
    line = wait_for_line(proc.output, lambda ln: ln.get("event") == "limits_counters")
    assert line["store"] == "local"


def test_a_gateway_starts_with_redis_down_and_says_so_without_the_url(gateway_factory) -> None:
    dead = free_port()
    secret = "redis-e2e-secret"
    proc, url = gateway_factory(
        _config("TEST_REDIS_URL"), env={"TEST_REDIS_URL": f"redis://:{secret}@127.0.0.1:{dead}/0"}
    )
    line = wait_for_line(proc.output, lambda ln: ln.get("event") == "limits_store_error")
    assert (line["kind"], line["reason"], line["on_store_error"]) == (
        "connection",
        "ECONNREFUSED",
        "closed",
    )
    assert metric(url, "llm_gateway_limits_store_errors_total", kind="connection") >= 1
    assert matching(log_lines(proc.output()), "limits_counters")[0]["store"] == "redis"
    assert secret not in proc.output() and f":{dead}" not in proc.output()
    proc.stop()
    assert secret not in proc.output()


_LIMITED = """
[[clients]]
name = "team"
key_env = "TEAM_KEY"
requests_per_minute = 5
"""


def test_two_gateways_enforce_one_requests_per_minute(gateway_factory, stub_url: str) -> None:
    with running_redis() as server:
        text = stub_config(stub_url, models=("ok",)) + _LIMITED
        text += '\n[limits]\nredis_url_env = "TEST_REDIS_URL"\n'
        env = {"TEST_REDIS_URL": server.url, "TEAM_KEY": "k-team"}
        urls = [gateway_factory(text, env=env)[1] for _ in range(2)]
        body = {"model": "m-ok", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        codes = [
            post(urls[i % 2] + "/llm/v1/messages", body, {"x-api-key": "k-team"})[0]
            for i in range(8)
        ]
    assert codes.count(200) == 5, codes  # one limit for both (alone: 5 each, 8 in all)
    assert codes.count(429) == 3, codes


@pytest.mark.parametrize(("policy", "status"), [("open", 200), ("closed", 529)])
def test_redis_down_is_the_operators_choice(
    gateway_factory, stub_url: str, policy: str, status: int
) -> None:
    text = stub_config(stub_url, models=("ok",)) + _LIMITED
    text += f'\n[limits]\nredis_url_env = "TEST_REDIS_URL"\non_store_error = "{policy}"\n'
    env = {"TEST_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "TEAM_KEY": "k-team"}
    _, url = gateway_factory(text, env=env)
    body = {"model": "m-ok", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    codes = [post(url + "/llm/v1/messages", body, {"x-api-key": "k-team"})[0] for _ in range(7)]
    assert codes == [status] * 7  # past the limit of 5 when open: nothing is counted
    _, _, raw = get(url + "/metrics", {"x-api-key": "k-team"})  # keys set: /metrics asks one
    errors = [
        float(line.rsplit(" ", 1)[1])
        for line in raw.decode().splitlines()
        if line.startswith('llm_gateway_limits_store_errors_total{kind="connection"}')
    ]
    assert errors and errors[0] >= 7
