"""Throwaway certificates made with the ``openssl`` command: a CA, and leaves it signs.

Used by the TLS tests of the gateway's listener and of Redis: the CA is what a client
trusts (``ca.pem``), a leaf and its key are what a server serves.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

SAN = "IP:127.0.0.1,DNS:localhost"


@dataclass(frozen=True)
class Leaf:
    cert: Path  # PEM, the leaf only
    key: Path  # PEM, unencrypted


def openssl(folder: Path, *args: str) -> str:
    run = subprocess.run(
        ["openssl", *args], cwd=folder, check=True, capture_output=True, text=True, timeout=60
    )
    return run.stdout


_NEW_KEY = ("-newkey", "rsa:2048", "-nodes")


def make_ca(folder: Path, name: str = "ca") -> Path:
    """A self-signed CA in ``folder`` (``{name}.pem``, ``{name}.key``); -> its certificate."""
    folder.mkdir(parents=True, exist_ok=True)
    openssl(
        folder, "req", "-x509", *_NEW_KEY, "-days", "2", "-subj", f"/CN=test-{name}",
        "-keyout", f"{name}.key", "-out", f"{name}.pem",
    )  # fmt: skip
    return folder / f"{name}.pem"


def make_leaf(folder: Path, name: str = "server", *, ca: str = "ca", san: str = SAN) -> Leaf:
    """A leaf for ``san`` signed by the CA ``ca`` of ``folder`` (``{name}.pem``/``.key``)."""
    openssl(
        folder, "req", *_NEW_KEY, "-subj", "/CN=127.0.0.1",
        "-keyout", f"{name}.key", "-out", f"{name}.csr",
    )  # fmt: skip
    (folder / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    openssl(
        folder, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem",
    )  # fmt: skip
    return Leaf(folder / f"{name}.pem", folder / f"{name}.key")


def fingerprint(cert: Path) -> str:
    """The leaf's SHA-256 as ``openssl x509 -fingerprint -sha256`` writes it (colons)."""
    out = openssl(cert.parent, "x509", "-noout", "-fingerprint", "-sha256", "-in", str(cert))
    return out.strip().split("=", 1)[1]
