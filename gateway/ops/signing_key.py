"""The thinking-signature key when ``server.signing_key_env`` is unset (read by config.py).

Thinking signatures carry the reasoning sealed under this key and clients replay them on
every later turn, so the key must outlive a restart and be the same on every worker: it is
made once and kept in the gateway's state directory (systemd's ``$STATE_DIRECTORY``, else
``$XDG_STATE_HOME/llm-gateway``, else ``~/.local/state/llm-gateway``), file mode 0600,
created atomically so that workers starting together agree on one.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping

__all__ = ["SHARED_KEY_ENV", "SIGNING_KEY_FILE", "default_signing_key", "state_dir"]

SIGNING_KEY_FILE = "signing.key"
# Set by the --workers supervisor in its workers' environment when no key file can be
# kept, so that all workers still seal and open thinking signatures with one key.
SHARED_KEY_ENV = "LLM_GATEWAY_SHARED_SIGNING_KEY"


def state_dir(env: Mapping[str, str]) -> str | None:
    """Where the gateway keeps its own state: systemd's StateDirectory, else XDG's."""
    if env.get("STATE_DIRECTORY"):
        return env["STATE_DIRECTORY"].split(":")[0]
    base = env.get("XDG_STATE_HOME") or (
        os.path.join(env["HOME"], ".local", "state") if env.get("HOME") else None
    )
    return os.path.join(base, "llm-gateway") if base else None


def default_signing_key(env: Mapping[str, str]) -> tuple[bytes, str]:
    """The thinking-signature key when ``server.signing_key_env`` is unset: (key, source).

    Thinking signatures carry the reasoning sealed under this key, and clients replay
    them on every later turn, so it must outlive a restart and be one across workers: a
    random key is made once and kept in the state directory (mode 0600). Where nothing can
    be kept (a read-only file system), the supervisor's shared key, else a key for this
    process alone (replayed signatures then stop opening at the next restart).
    """
    folder = state_dir(env)
    if folder is not None:
        path = os.path.join(folder, SIGNING_KEY_FILE)
        try:
            return _read_or_create_key(folder, path), "file"
        except (OSError, ValueError):
            pass
    shared = env.get(SHARED_KEY_ENV)
    if shared:
        try:
            return bytes.fromhex(shared), "random"
        except ValueError:
            pass
    return secrets.token_bytes(32), "random"


def _read_or_create_key(folder: str, path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            key = fh.read()
    except FileNotFoundError:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, secrets.token_bytes(32))
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # atomic, and never replaces a key another worker made
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        with open(path, "rb") as fh:
            key = fh.read()
    if len(key) < 32:
        raise ValueError("signing key file too short")
    return key
