"""The telemetry tests' collector (tests/otlp_collector.py) stops without leaving a socket open.

A gateway under test keeps exporting while the collector stops. A connection it opens in
that moment used to outlive the collector's event loop, and the garbage collector's
``ResourceWarning`` failed whichever test was running later (CI, tests/e2e/test_tenancy_http.py).
Here three clients post as fast as they can while the collector stops, over and over.
"""

from __future__ import annotations

import gc
import http.client
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.otlp_collector import Collector


@pytest.fixture
def unraisable() -> Iterator[list[str]]:
    """What ``__del__`` methods raised (a ResourceWarning is an error in this suite)."""
    seen: list[str] = []
    previous = sys.unraisablehook

    def hook(info: Any) -> None:
        seen.append(f"{info.exc_type.__name__}: {info.exc_value}")

    sys.unraisablehook = hook
    try:
        yield seen
    finally:
        sys.unraisablehook = previous


def _post_until(port: int, stop: threading.Event) -> None:
    while not stop.is_set():
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            for _ in range(3):
                connection.request(
                    "POST", "/v1/traces", b"{}", {"Content-Type": "application/json"}
                )
                connection.getresponse().read()
        except (OSError, http.client.HTTPException):
            time.sleep(0.001)
        finally:
            connection.close()


def test_stopping_while_clients_connect_leaves_no_socket_open(unraisable: list[str]) -> None:
    received = 0
    for _ in range(20):
        collector = Collector()
        collector.start()
        stop = threading.Event()
        clients = [
            threading.Thread(target=_post_until, args=(collector.port, stop)) for _ in range(3)
        ]
        for c in clients:
            c.start()
        time.sleep(0.03)
        collector.stop()
        stop.set()
        for c in clients:
            c.join(10)
        received += len(collector.received)
        del collector
        gc.collect()
    assert received > 0  # the clients did reach it
    assert unraisable == []
