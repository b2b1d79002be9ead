"""The gateway with a deliberate CPU regression, to see the CI guard fail.

    python -m tests.benchmarks.regressed SPIN_US [gateway arguments...]

Adds a middleware that burns ``SPIN_US`` microseconds of CPU on every request before the
gateway's own handling: what a careless change to the request path would cost. Used only by
``python -m tests.benchmarks.guard --regress-us N``; nothing in the gateway knows of it.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from aiohttp import web

import gateway.app
from gateway.__main__ import main


def _with_spin(build: Any, spin_s: float) -> Any:
    def build_app(*args: Any, **kwargs: Any) -> web.Application:
        app = build(*args, **kwargs)

        @web.middleware
        async def spin(request: web.Request, handler: Any) -> web.StreamResponse:
            end = time.thread_time() + spin_s
            while time.thread_time() < end:
                pass
            return await handler(request)  # type: ignore[no-any-return]

        app.middlewares.insert(0, spin)
        return app

    return build_app


if __name__ == "__main__":
    spin_us = float(sys.argv.pop(1))
    gateway.app.build_app = _with_spin(gateway.app.build_app, spin_us / 1e6)  # type: ignore[assignment]
    sys.exit(main())
