"""A real OpenID Connect provider for the sign-in tests: tests/clients/oidc_provider.mjs
(panva's oidc-provider, installed with ``npm ci`` in tests/clients) on 127.0.0.1, with one
confidential client ``gateway`` whose redirect URI is the gateway's callback, and a test
interaction that signs in the current test user (:meth:`Provider.set_user`) without a form.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlencode

import pytest

from tests.node import CLIENTS

CLIENT_ID = "gateway"
SECRET = "gateway-secret-at-the-provider"


def oidc_provider_ready() -> None:
    """Skip (fail under CI) unless node and oidc-provider are installed."""
    if shutil.which("node") and (CLIENTS / "node_modules" / "oidc-provider").is_dir():
        return
    message = "oidc-provider not installed: (cd tests/clients && npm ci)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


class Provider:
    def __init__(self, issuer: str) -> None:
        self.issuer = issuer

    def set_user(
        self, sub: str, email: str = "", verified: bool = True, groups: tuple[str, ...] = ()
    ) -> None:
        """The account the next login at the provider signs in (``deny``: access_denied)."""
        q = urlencode(
            {
                "sub": sub,
                "email": email,
                "verified": str(verified).lower(),
                "groups": ",".join(groups),
            }
        )
        req = urllib.request.Request(f"{self.issuer}/_test/user?{q}", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.read() == b"ok"


@contextmanager
def oidc_provider(redirect_uri: str, alg: str = "RS256") -> Iterator[Provider]:
    oidc_provider_ready()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        ["node", str(CLIENTS / "oidc_provider.mjs"), redirect_uri, SECRET, alg],
        stdout=subprocess.PIPE,
        stderr=log,  # the library warns about the Node.js release it runs on
        cwd=CLIENTS,
    )
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        line = proc.stdout.readline() if ready else b""
        if not line.startswith(b"{"):
            proc.kill()
            log.seek(0)
            raise RuntimeError(f"oidc provider did not start: {line!r} {log.read()[-2000:]!r}")
        yield Provider(json.loads(line)["issuer"])
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        proc.stdout.close()
        log.close()
