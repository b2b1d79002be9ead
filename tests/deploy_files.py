"""The deployment files under deploy/ and the readers the deploy tests share
(tests/deploy/test_deploy.py, test_kubernetes.py, test_container_state.py): their paths, the
fixed values they agree on, a config's environment variable names, the Dockerfile's
instructions.

A tool that is missing skips a test locally and fails it under CI (:func:`need`).
"""

from __future__ import annotations

import os
import re
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gateway.ops import config
from tests import certs
from tests.procs import REPO

DEPLOY = REPO / "deploy"
EXAMPLE = DEPLOY / "gateway.example.toml"
UNIT = DEPLOY / "systemd" / "llm-gateway.service"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = DEPLOY / "Dockerfile.dockerignore"
CONSTRAINTS = DEPLOY / "constraints.txt"
COMPOSE = DEPLOY / "compose.yaml"
PROMETHEUS = DEPLOY / "prometheus.yml"
K8S = DEPLOY / "kubernetes"

K8S_VERSION = "1.30.0"
# The drain finishes streams within shutdown_grace, then waits up to this long for the ends.
DRAIN_TAIL_S = 2.0
UNIT_BINARY = "/opt/llm-gateway/bin/llm-gateway"
UNIT_CONFIG = "/etc/llm-gateway/gateway.toml"


def need(ok: object, why: str) -> None:
    """A missing tool: skip locally, fail under CI (where .ci/run must have installed it)."""
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"{why} (CI must install it)")
        pytest.skip(why)


def env_names(data: dict[str, Any]) -> set[str]:
    """Every environment variable a config names (the *_env keys)."""
    tables = [
        data.get("server", {}),
        *data.get("upstreams", {}).values(),
        data.get("batches", {}),
        *data.get("clients", []),
        data.get("limits", {}),
        data.get("auth", {}),
        data.get("telemetry", {}),
    ]
    return {v for t in tables for k, v in t.items() if k.endswith("_env")}


def parse_with_env(text: str, src: str) -> config.Config:
    """The config ``text`` loaded as the gateway would, every variable it names set."""
    data = tomllib.loads(text)
    env = {name: "test-secret" for name in env_names(data)}
    if name := data.get("batches", {}).get("database_env"):  # a URL, not a key
        env[name] = "postgresql://gateway:test-secret@db.internal:5432/gateway"
    if name := data.get("limits", {}).get("redis_url_env"):
        env[name] = "redis://127.0.0.1:6379/0"
    if name := data.get("telemetry", {}).get("headers_env"):  # name=value pairs
        env[name] = "authorization=Bearer test-secret"
    for i, client in enumerate(data.get("clients", [])):  # each client's key is its own
        if name := client.get("key_env"):
            env[name] = f"client-key-{i}"
    server = data.get("server", {})
    if server.get("tls_cert_file"):  # the files are read at load: a throwaway pair there
        with tempfile.TemporaryDirectory(prefix="deploy-tls-") as folder:
            certs.make_ca(Path(folder))
            leaf = certs.make_leaf(Path(folder))
            server.update(tls_cert_file=str(leaf.cert), tls_key_file=str(leaf.key))
            return config.parse(data, src, env)
    return config.parse(data, src, env)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def final_stage() -> list[tuple[str, str]]:
    """The Dockerfile's last stage (the image), from its FROM on."""
    ins = instructions(DOCKERFILE.read_text())
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    return ins[last_from:]


def image_state_directory() -> str:
    """The image's STATE_DIRECTORY (its one ENV naming it)."""
    envs = [a for w, a in final_stage() if w == "ENV"]
    found = [m[1] for a in envs for m in [re.search(r"\bSTATE_DIRECTORY=(\S+)", a)] if m]
    assert len(found) == 1, envs
    return found[0]
