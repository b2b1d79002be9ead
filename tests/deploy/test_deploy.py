"""The deployment files under deploy/, each checked without a Docker engine or a cluster.

- The example config is accepted by the real loader, as it is and with its commented knob lines
  switched on, and shows every knob of gateway/ops/config_schema.py's schema (derived from its
  dataclasses) with its default (docs/configuration.md is generated from the same schema and
  tested current in tests/unit/ops/test_config_doc.py).
- The systemd unit passes ``systemd-analyze verify`` and ``systemd-analyze security
  --offline=yes`` holds its exposure score at or below ``SYSTEMD_EXPOSURE_MAX``.
- The Dockerfile passes hadolint and has the lines that matter (multi-stage on a base pinned by
  digest, pip install with deploy/constraints.txt, non-root user, exec-form entrypoint,
  HEALTHCHECK on /health that works against a real gateway); the constraints file pins every
  runtime dependency and what it requires, within pyproject's floors.
- The compose stack agrees with itself and with the gateway's config; its images name versions,
  the inference servers' by digest.
- The Kubernetes manifests, built as ``kubectl apply -k`` would: ``test_kubernetes.py``.

Tools (systemd-analyze, hadolint, kubernetes-validate) that are missing skip the test locally
and fail it under CI (the ``CI`` environment variable is set there).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import fields
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from gateway.ops import config, config_schema
from tests.deploy_files import (
    COMPOSE,
    CONSTRAINTS,
    DOCKERFILE,
    DOCKERIGNORE,
    DRAIN_TAIL_S,
    EXAMPLE,
    K8S,
    PROMETHEUS,
    UNIT,
    UNIT_BINARY,
    UNIT_CONFIG,
    env_names,
    final_stage,
    image_state_directory,
    instructions,
    need,
    parse_with_env,
)
from tests.procs import REPO, Proc, free_port, wait_http

try:
    import yaml
except ImportError:  # PyYAML comes with the test extra; CI must not skip for want of it
    if os.environ.get("CI"):
        raise
    pytest.skip("PyYAML is not installed", allow_module_level=True)

# `systemd-analyze security --offline=yes` on systemd 252 scores the unit 1.2; what remains is
# network access (the gateway's job), AF_UNIX, the host's root directory and @resources.
SYSTEMD_EXPOSURE_MAX = 1.5


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    need(path, f"{name} is not installed")
    assert path
    return path


# ---------------------------------------------------------------- (a) the config knobs


def _schema_knobs() -> set[str]:
    return set(config_schema.schema())


def _toml_literal(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else repr(value)


# a commented-out knob: "# key = value" (prose comments never have this shape)
_COMMENTED_KNOB = re.compile(r"^#\s?([A-Za-z_][A-Za-z0-9_]*\s*=\s*\S.*)$")
# a commented-out optional table: "# [web_search]"
_COMMENTED_TABLE = re.compile(r"^#\s?(\[\[?[a-z_]+\]\]?)\s*$")


def _switch_on(text: str) -> str:
    return "\n".join(
        m.group(1) if (m := _COMMENTED_KNOB.match(line) or _COMMENTED_TABLE.match(line)) else line
        for line in text.splitlines()
    )


def _knobs_in(data: dict[str, Any]) -> set[str]:
    knobs = {f"server.{k}" for k in data.get("server", {})}
    for table in data.get("upstreams", {}).values():
        knobs |= {f"upstreams.<name>.{k}" for k in table}
    for table in data.get("models", []):
        knobs |= {f"models[].{k}" for k in table}
    knobs |= {f"batches.{k}" for k in data.get("batches", {})}
    knobs |= {f"web_search.{k}" for k in data.get("web_search", {})}
    knobs |= {f"web_fetch.{k}" for k in data.get("web_fetch", {})}
    for table in data.get("clients", []):
        knobs |= {f"clients[].{k}" for k in table}
    knobs |= {f"limits.{k}" for k in data.get("limits", {})}
    knobs |= {f"auth.{k}" for k in data.get("auth", {})}
    knobs |= {f"telemetry.{k}" for k in data.get("telemetry", {})}
    return knobs


def _own_env(tmp_path: Path) -> dict[str, str]:
    """The test's environment without GATEWAY_* and with a state directory of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(PYTHONPATH=str(REPO), STATE_DIRECTORY=str(tmp_path / "state"))
    return env


def test_example_config_passes_check_config_as_it_is(tmp_path: Path) -> None:
    env = _own_env(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "gateway", "--check-config", "--config", str(EXAMPLE)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0, run.stderr
    assert "config ok" in run.stdout
    assert (tmp_path / "state" / "batches.sqlite3").is_file()  # it opened the batch store


def test_example_config_with_every_commented_knob_switched_on_loads() -> None:
    text = _switch_on(EXAMPLE.read_text())
    data = tomllib.loads(text)
    assert env_names(data) == {
        "GATEWAY_API_KEYS",
        "GATEWAY_SIGNING_KEY",
        "GATEWAY_PREVIOUS_SIGNING_KEYS",
        "VLLM_API_KEY",
        "GATEWAY_BATCHES_DATABASE",
        "GATEWAY_ADMIN_KEYS",
        "ALICE_KEY",
        "GATEWAY_REDIS_URL",
        "GATEWAY_OIDC_SECRET",
        "OTEL_COLLECTOR_HEADERS",
    }
    cfg = parse_with_env(text, str(EXAMPLE))
    assert cfg.server.api_keys == ("test-secret",)
    assert cfg.upstreams["local-vllm"].api_key == "test-secret"


def test_example_config_shows_every_knob_of_the_schema() -> None:
    shown = _knobs_in(tomllib.loads(_switch_on(EXAMPLE.read_text())))
    schema = _schema_knobs()
    assert not schema - shown, f"knobs missing from {EXAMPLE.name}: {sorted(schema - shown)}"
    assert not shown - schema, (
        f"knobs unknown to gateway/ops/config_schema.py: {sorted(shown - schema)}"
    )


def test_example_config_comments_every_knob() -> None:
    """The first time each knob appears, a comment line stands right above it."""
    section, seen, uncommented = "", set(), []
    lines = EXAMPLE.read_text().splitlines()
    for i, line in enumerate(lines):
        if _COMMENTED_TABLE.match(line):
            line = line.lstrip("# ")
        if line.startswith("["):
            section = (
                "models[]"
                if line.startswith("[[models]]")
                else "upstreams.<name>"
                if line.startswith("[upstreams.")
                else "batches"
                if line.startswith("[batches]")
                else "web_search"
                if line.startswith("[web_search]")
                else "web_fetch"
                if line.startswith("[web_fetch]")
                else "clients[]"
                if line.startswith("[[clients]]")
                else "limits"
                if line.startswith("[limits]")
                else "auth"
                if line.startswith("[auth]")
                else "telemetry"
                if line.startswith("[telemetry]")
                else "server"
            )
            continue
        m = re.match(r"^(?:#\s?)?([A-Za-z_][A-Za-z0-9_]*)\s*=", line)
        if not m or not section:
            continue
        knob = f"{section}.{m.group(1)}"
        if knob in seen:
            continue
        seen.add(knob)
        above = lines[i - 1]
        if not above.startswith("#") or _COMMENTED_KNOB.match(above):
            uncommented.append(knob)
    assert seen == _schema_knobs()
    assert not uncommented, f"knobs without a comment above them: {uncommented}"


# Example values that illustrate a setting instead of showing the default (their comments say
# so); the *_env names, required keys and defaults written in words are not compared either.
ILLUSTRATED = {
    "server.metrics_port",
    "upstreams.<name>.kind",
    "models[].max_concurrency",
    "models[].created_at",
    "models[].context_window",
    "models[].claude_code_tier",
    "web_fetch.enabled",  # shown switched on
}


def _first_values(data: dict[str, Any]) -> dict[str, Any]:
    """Each knob's value where the example first shows it."""
    tables = [("server", data.get("server", {}))]
    tables += [("upstreams.<name>", t) for t in data.get("upstreams", {}).values()]
    tables += [("models[]", t) for t in data.get("models", [])]
    tables += [("batches", data.get("batches", {}))]
    tables += [("web_search", data.get("web_search", {}))]
    tables += [("web_fetch", data.get("web_fetch", {}))]
    tables += [("clients[]", t) for t in data.get("clients", [])]
    tables += [("limits", data.get("limits", {}))]
    tables += [("auth", data.get("auth", {}))]
    tables += [("telemetry", data.get("telemetry", {}))]
    shown: dict[str, Any] = {}
    for prefix, table in tables:
        for key, value in table.items():
            shown.setdefault(f"{prefix}.{key}", value)
    return shown


def test_example_config_shows_the_real_defaults() -> None:
    """Every value the example shows (commented lines too) is the dataclass field's default."""
    shown = _first_values(tomllib.loads(_switch_on(EXAMPLE.read_text())))
    compared = 0
    for name, knob in config_schema.schema().items():
        if knob.required or knob.default is None or knob.shown or name in ILLUSTRATED:
            continue
        assert shown[name] == knob.default, f"{name}: {shown[name]!r}, default {knob.default!r}"
        assert type(shown[name]) is type(knob.default), f"{name}: write {knob.default!r}"
        compared += 1
    assert compared >= 20  # the check ran


def test_schema_is_derived_from_the_dataclasses() -> None:
    """Types, required and defaults come from the fields; non-key fields are left out."""
    schema = config_schema.schema()
    ping = schema["server.ping_interval"]
    assert (
        ping.name,
        ping.types,
        ping.required,
        ping.default,
        ping.gt,
        ping.ge,
        ping.le,
        ping.shown,
    ) == ("ping_interval", (int, float), False, 10.0, 0, None, None, None)
    assert schema["server.port"].allowed() == "0..65535"
    assert schema["upstreams.<name>.balance"].choices == ("affinity", "round_robin", "least_busy")
    assert schema["server.api_keys_env"].types == (str,)
    assert not schema["upstreams.<name>.base_url"].required  # or base_urls: one of them
    assert schema["models[].upstream"].types == (str,)
    assert "upstreams.<name>.name" not in schema
    assert not {"server.api_keys", "server.signing_key", "upstreams.<name>.api_key"} & set(schema)
    for table, cls in config_schema.TABLES.items():
        defaults = {f.name: f.default for f in fields(cls)}
        for name, knob in config_schema.knobs(cls).items():
            assert knob.required or knob.default == defaults[name], f"{table}.{name}"


# ---------------------------------------------------------------- (b) systemd


def _unit_entries(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) in order; keys may repeat, as systemd allows."""
    section, out = "", []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.append((section, key.strip(), value.strip()))
    return out


def _unit_value(key: str) -> str:
    values = [v for _, k, v in _unit_entries(UNIT.read_text()) if k == key]
    assert values, f"{key}= missing from {UNIT.name}"
    return values[-1]


def _seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|sec|min|m)?", value)
    assert m, value
    return float(m.group(1)) * (60 if m.group(2) in ("min", "m") else 1)


def _testable_unit(tmp_path: Path, text: str | None = None) -> Path:
    """A copy whose binary exists here (verify checks that ExecStart is executable)."""
    text = UNIT.read_text() if text is None else text
    text = text.replace(UNIT_BINARY, f"{sys.executable} -m gateway")
    path = tmp_path / UNIT.name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("key", "want"),
    [
        ("ExecStart", f"{UNIT_BINARY} --config {UNIT_CONFIG}"),
        ("ExecReload", "/bin/kill -HUP $MAINPID"),  # SIGHUP: the clients re-read
        ("DynamicUser", "yes"),
        ("Restart", "on-failure"),
        ("RestartPreventExitStatus", "2"),
        ("KillSignal", "SIGTERM"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("CapabilityBoundingSet", ""),
        ("AmbientCapabilities", ""),
        ("WantedBy", "multi-user.target"),
    ],
)
def test_unit_setting(key: str, want: str) -> None:
    assert _unit_value(key) == want


def test_unit_stop_timeout_outlasts_the_drain() -> None:
    grace = tomllib.loads(EXAMPLE.read_text())["server"]["shutdown_grace"]
    assert _seconds(_unit_value("TimeoutStopSec")) > grace + DRAIN_TAIL_S


def test_unit_command_lines_are_accepted_by_the_cli(tmp_path: Path) -> None:
    """ExecStartPre (--check-config) runs as written, against the example config."""
    argv = shlex.split(_unit_value("ExecStartPre"))
    assert argv[0] == UNIT_BINARY
    argv = [
        sys.executable,
        "-m",
        "gateway",
        *(str(EXAMPLE) if a == UNIT_CONFIG else a for a in argv[1:]),
    ]
    env = _own_env(tmp_path)
    run = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize(
    ("mutation", "clean"),
    [
        (None, True),
        (("ProtectHome=yes", "ProtectHome=maybe"), False),
        (("Type=notify", "Tipe=notify"), False),
    ],
)
def test_unit_systemd_analyze_verify(
    tmp_path: Path, mutation: tuple[str, str] | None, clean: bool
) -> None:
    """verify exits 0 even for ignored lines, so its output must be empty too."""
    tool = _tool("systemd-analyze")
    text = UNIT.read_text()
    if mutation:
        assert mutation[0] in text
        text = text.replace(*mutation)
    run = subprocess.run(
        [tool, "verify", str(_testable_unit(tmp_path, text))],
        capture_output=True,
        text=True,
        timeout=30,
    )
    output = (run.stdout + run.stderr).strip()
    if clean:
        assert run.returncode == 0 and not output, output
    else:
        assert run.returncode != 0 or output


def test_unit_security_exposure_is_held(tmp_path: Path) -> None:
    tool = _tool("systemd-analyze")
    run = subprocess.run(
        [tool, "security", "--offline=yes", "--no-pager", str(_testable_unit(tmp_path))],
        capture_output=True,
        text=True,
        timeout=30,
    )
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", run.stdout)
    assert m, run.stdout + run.stderr
    assert float(m.group(1)) <= SYSTEMD_EXPOSURE_MAX, run.stdout


# ---------------------------------------------------------------- (c) Dockerfile


def _one(stage: list[tuple[str, str]], word: str) -> str:
    found = [args for w, args in stage if w == word]
    assert len(found) == 1, f"{word}: {found}"
    return found[0]


def test_dockerfile_is_multi_stage_on_slim_python_311() -> None:
    ins = instructions(DOCKERFILE.read_text())
    froms = [args for word, args in ins if word == "FROM"]
    assert len(froms) >= 2
    assert re.search(r"\bAS build$", froms[0], flags=re.I), froms[0]
    args = dict(a.split("=", 1) for w, a in ins if w == "ARG" and "=" in a)
    for image in froms:
        base = image.split()[0]
        base = args.get(base.strip("${}"), base) if base.startswith("$") else base
        # by digest: a rebuild starts from the same bytes, wherever the tag has moved since
        assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?" + _DIGEST, base), base
    assert any(w == "COPY" and a.startswith("--from=build ") for w, a in final_stage())


_DIGEST = r"@sha256:[0-9a-f]{64}"
# the platform of the image (deploy/Dockerfile), for pyproject's environment markers
_IMAGE_ENV = {
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "python_version": "3.11",
    "implementation_name": "cpython",
}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def _pins() -> dict[str, str]:
    """deploy/constraints.txt as {normalized name: exact version}."""
    pins: dict[str, str] = {}
    for raw in CONSTRAINTS.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name), f"not a pin: {raw!r}"
        assert re.fullmatch(r"[0-9][0-9A-Za-z.+!]*", version), f"not an exact version: {raw!r}"
        assert _normalized(name) not in pins, f"{name} is pinned twice"
        pins[_normalized(name)] = version
    return pins


def _runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(dep) for dep in project["dependencies"]]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(_IMAGE_ENV)]


def test_dockerfile_installs_with_the_constraints_file() -> None:
    """The build stage copies deploy/constraints.txt and its one pip install obeys it."""
    ins = instructions(DOCKERFILE.read_text())
    froms = [i for i, (word, _) in enumerate(ins) if word == "FROM"]
    build = ins[froms[0] : froms[1]]
    copied = [src for w, a in build if w == "COPY" for src in a.split()[:-1]]
    assert "deploy/constraints.txt" in copied
    installs = [a for w, a in build if w == "RUN" and "pip install" in a]
    assert len(installs) == 1, installs
    argv = shlex.split(installs[0].split("&&")[0])
    given = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-c", "--constraint")]
    given += [a.split("=", 1)[1] for a in argv if a.startswith("--constraint=")]
    assert given == ["deploy/constraints.txt"], argv


def test_constraints_pin_every_runtime_dependency_within_its_floor() -> None:
    """Each dependency pyproject.toml declares is pinned to a version its range accepts."""
    pins = _pins()
    for req in _runtime_requirements():
        name = _normalized(req.name)
        assert name in pins, f"{req.name} is not pinned in {CONSTRAINTS.name}"
        assert req.specifier.contains(pins[name]), f"{req.name}=={pins[name]} is not {req}"


def test_constraints_pin_the_transitive_dependencies() -> None:
    """What the runtime dependencies require in turn (as installed here) is pinned too; a
    dependency that gained one since the file was made fails here: refresh the file."""
    pins = _pins()
    todo, seen = [r.name for r in _runtime_requirements()], set()
    while todo:
        name = _normalized(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here (a platform's own dependency); nothing to follow
        for spec in requires:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({**_IMAGE_ENV, "extra": ""}):
                todo.append(req.name)
    assert sorted(seen - set(pins)) == [], f"refresh {CONSTRAINTS.name}"


def test_dockerfile_final_stage_runs_unprivileged() -> None:
    user = _one(final_stage(), "USER").split(":")[0]
    assert user not in ("root", "0") and user.isdigit(), "a numeric non-root USER"
    # The Kubernetes pod runs with the same uid.
    deployment = yaml.safe_load((K8S / "base" / "deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]["securityContext"]
    assert pod["runAsUser"] == int(user) and pod["runAsNonRoot"] is True


def test_dockerfile_entrypoint_is_exec_form() -> None:
    assert json.loads(_one(final_stage(), "ENTRYPOINT")) == ["llm-gateway"]
    cmd = json.loads(_one(final_stage(), "CMD"))
    assert cmd[:2] == ["--config", UNIT_CONFIG] and "--host" in cmd


def _healthcheck_command() -> list[str]:
    """The HEALTHCHECK's argv: the gateway's own --health-check on the image's config."""
    args = _one(final_stage(), "HEALTHCHECK")
    _, _, cmd = args.partition("CMD ")
    argv = json.loads(cmd)  # exec form: no shell in a slim image is assumed
    assert argv[0] == "llm-gateway" and "--health-check" in argv
    assert argv[argv.index("--config") + 1] == UNIT_CONFIG
    return argv


def _run_healthcheck(argv: list[str], config_path: Path, port: int, env: dict[str, str]) -> int:
    """The HEALTHCHECK's argv run here: this interpreter, this config, the test's port."""
    args = [str(config_path) if a == UNIT_CONFIG else a for a in argv[1:]]
    run = subprocess.run(
        [sys.executable, "-m", "gateway", *args, "--port", str(port)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=10,
    )
    return run.returncode


def test_dockerfile_exposes_the_port_the_healthcheck_asks() -> None:
    """The health check reads the image's config: its port is the one EXPOSEd."""
    port = _one(final_stage(), "EXPOSE")
    assert port == "8080"
    _healthcheck_command()
    assert tomllib.loads(EXAMPLE.read_text())["server"]["port"] == int(port)


def _example_with(tmp_path: Path, **server: object) -> Path:
    """The example config with these server keys set (replaced where it sets them)."""
    data = EXAMPLE.read_text()
    for key, value in server.items():
        line = f"{key} = {_toml_literal(value)}"
        data, n = re.subn(rf"^{key} = .*$", line, data, count=1, flags=re.M)
        if not n:
            data = data.replace("[server]\n", f"[server]\n{line}\n", 1)
    path = tmp_path / f"gateway-{len(list(tmp_path.glob('gateway-*.toml')))}.toml"
    path.write_text(data)
    assert config.parse(tomllib.loads(data), str(path), {}).server  # still a valid config
    return path


@pytest.mark.parametrize("metrics_apart", [False, True], ids=["one listener", "metrics_port"])
def test_dockerfile_healthcheck_and_probes_against_a_real_gateway(
    tmp_path: Path, metrics_apart: bool
) -> None:
    """The image's CMD starts a gateway whose /health the HEALTHCHECK accepts; /ready too.
    The check asks the port the config names (here overridden with --port, as a CMD may), on
    the API listener, which serves /health whether or not /metrics has a listener apart."""
    port = free_port()
    config_path = EXAMPLE
    if metrics_apart:
        config_path = _example_with(tmp_path, metrics_port=free_port())
    cmd = json.loads(_one(final_stage(), "CMD"))
    cmd = [
        str(config_path) if a == UNIT_CONFIG else "127.0.0.1" if a == "0.0.0.0" else a for a in cmd
    ]
    env = _own_env(tmp_path)
    proc = Proc([sys.executable, "-m", "gateway", *cmd, "--port", str(port)], env=env)
    try:
        wait_http(f"http://127.0.0.1:{port}/ready", proc=proc.popen)
        check = _healthcheck_command()
        assert _run_healthcheck(check, config_path, port, env) == 0
        assert _run_healthcheck(check, config_path, free_port(), env) != 0
        # a wildcard host is asked on loopback (the image's CMD listens on 0.0.0.0)
        wildcard = _example_with(tmp_path, host="0.0.0.0") if not metrics_apart else None
        if wildcard is not None:
            assert _run_healthcheck(check, wildcard, port, env) == 0
    finally:
        assert proc.stop() == 0, proc.output()


def test_dockerfile_gives_the_gateway_a_state_directory() -> None:
    """STATE_DIRECTORY is set, made by the build for the image's user (0700), and a VOLUME."""
    stage = final_stage()
    state = image_state_directory()
    assert json.loads(_one(stage, "VOLUME")) == [state]
    user = _one(stage, "USER")
    made = [a for w, a in stage if w == "RUN" and f" {state}" in a]
    assert len(made) == 1, made
    argv = shlex.split(made[0].split("&&")[-1])
    assert argv[:2] == ["install", "-d"] and argv[-1] == state, argv
    opts = dict(zip(argv[2:-1:2], argv[3:-1:2], strict=True))
    assert f"{opts['-o']}:{opts['-g']}" == user and opts["-m"] == "0700", opts


def _dockerignore_regex(pattern: str) -> re.Pattern[str]:
    """Docker's pattern syntax: `*` and `?` stay within a path segment, `**` crosses them."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] in "*?":
            out, i = out + ("[^/]*" if pattern[i] == "*" else "[^/]"), i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern matches a path or a parent."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        rx = _dockerignore_regex(pattern.lstrip("!").strip("/"))
        if any(rx.match(p) for p in prefixes):
            ignored = not pattern.startswith("!")
    return ignored


def test_dockerignore_sends_what_the_build_copies_and_nothing_else() -> None:
    patterns = [
        ln.strip()
        for ln in DOCKERIGNORE.read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    sources = []
    for word, args in instructions(DOCKERFILE.read_text()):
        if word == "COPY" and not args.startswith("--from"):
            sources += args.split()[:-1]
    assert sources
    for src in sources:
        assert (REPO / src).exists(), src
        probe = f"{src.rstrip('/')}/config.py" if (REPO / src).is_dir() else src
        assert not _ignored(probe, patterns), f"{probe} is copied but ignored"
    for path in (
        "tests/unit/ops/test_config.py",
        ".git/HEAD",
        "tests/clients/node_modules/x.js",
        "gateway/__pycache__",
        "deploy/compose.yaml",
    ):
        assert _ignored(path, patterns), f"{path} reaches the build context"


def test_dockerfile_hadolint(tmp_path: Path) -> None:
    tool = _tool("hadolint")
    run = subprocess.run(
        [tool, "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    # The linter is alive: a shell-form entrypoint (SIGTERM would hit a shell) is reported.
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        DOCKERFILE.read_text().replace('ENTRYPOINT ["llm-gateway"]', "ENTRYPOINT llm-gateway")
    )
    run = subprocess.run(
        [tool, "--no-color", str(bad)], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert "DL3025" in run.stdout


# ---------------------------------------------------------------- (d) compose


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _compose_gateway_config() -> tuple[dict[str, Any], config.Config]:
    text = _compose()["configs"]["gateway-toml"]["content"]
    return tomllib.loads(text), parse_with_env(text, "compose.yaml")


def _image_default(image: str) -> str:
    """``${VAR:-default}`` (compose's substitution) is its default; a plain name itself."""
    found = re.fullmatch(r"\$\{\w+:-(.+)\}", image)
    return found[1] if found else image


def test_compose_images_are_pinned() -> None:
    """Every image pulled names a version; the inference servers, whose behaviour the gateway
    depends on, are pinned by digest."""
    services = _compose()["services"]
    for name, svc in services.items():
        if "build" in svc:
            continue
        ref = _image_default(svc["image"]).split("@", 1)[0]
        tag = ref.rsplit("/", 1)[-1].partition(":")[2]
        assert re.search(r"\d", tag) and "latest" not in tag, f"{name}: {svc['image']}"
    for name in ("llamacpp", "vllm"):
        assert re.search(_DIGEST + "$", _image_default(services[name]["image"])), name


def test_compose_services_and_healthchecks() -> None:
    services = _compose()["services"]
    assert {"gateway", "llamacpp", "vllm", "prometheus", "grafana"} <= set(services)
    for name, svc in services.items():
        test = svc.get("healthcheck", {}).get("test")
        assert isinstance(test, list) and test[0] == "CMD", f"{name}: exec-form healthcheck"
        assert svc.get("restart") == "unless-stopped", name


def test_compose_depends_on_names_services_that_start_with_it() -> None:
    services = _compose()["services"]
    want = {
        ("gateway", "llamacpp"): "service_healthy",
        ("prometheus", "gateway"): "service_started",
        ("grafana", "prometheus"): "service_healthy",
    }
    got = {
        (name, dep): spec["condition"]
        for name, svc in services.items()
        for dep, spec in svc.get("depends_on", {}).items()
    }
    assert got == want
    for name, dep in got:
        # a service outside the default profile cannot be a dependency of one inside it
        assert set(services[dep].get("profiles", [])) <= set(services[name].get("profiles", []))


def test_compose_gateway_builds_this_repo_and_drains() -> None:
    gw = _compose()["services"]["gateway"]
    context = (COMPOSE.parent / gw["build"]["context"]).resolve()
    assert context == REPO and (context / gw["build"]["dockerfile"]) == DOCKERFILE
    assert gw["healthcheck"]["test"][1:] == _healthcheck_command()
    _, cfg = _compose_gateway_config()
    assert _seconds(gw["stop_grace_period"]) > cfg.server.shutdown_grace + DRAIN_TAIL_S
    assert gw["stop_signal"] == "SIGTERM"


def test_compose_gateway_keeps_its_state_in_a_named_volume() -> None:
    compose = _compose()
    volumes = compose["services"]["gateway"]["volumes"]
    named = [v.split(":") for v in volumes if v.split(":")[1] == image_state_directory()]
    assert len(named) == 1 and named[0][0] in compose["volumes"], volumes
    # thinking signatures sealed under a key from the environment, as the other keys
    _, cfg = _compose_gateway_config()
    assert cfg.server.signing_key_env == "GATEWAY_SIGNING_KEY"
    given = compose["services"]["gateway"]["environment"]["GATEWAY_SIGNING_KEY"]
    assert given.startswith("${GATEWAY_SIGNING_KEY:?"), given


def test_compose_gateway_config_loads_and_points_at_compose_services() -> None:
    data, cfg = _compose_gateway_config()
    services = _compose()["services"]
    assert cfg.server.host == "0.0.0.0"
    assert f"{cfg.server.port}:{cfg.server.port}" in services["gateway"]["ports"][0]
    for up in cfg.upstreams.values():
        host = up.host.split(":")[0]
        assert host in services, f"{up.name}: {host} is not a compose service"
    # every key variable the config names is given to the container
    assert env_names(data) <= set(services["gateway"]["environment"])
    assert services["vllm"]["profiles"] == ["gpu"]
    gpus = services["vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert gpus[0]["capabilities"] == ["gpu"]


def test_compose_prometheus_scrapes_the_gateway_metrics() -> None:
    prom = _compose()["services"]["prometheus"]
    assert f"./{PROMETHEUS.name}:/etc/prometheus/prometheus.yml:ro" in prom["volumes"]
    _, cfg = _compose_gateway_config()
    jobs = {j["job_name"]: j for j in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]}
    gw = jobs["llm-gateway"]
    assert gw.get("metrics_path", "/metrics") == "/metrics"
    # keys are set, so /metrics has a listener of its own (on the API's it would ask for one)
    assert cfg.server.api_keys and cfg.server.metrics_apart
    assert [f"gateway:{cfg.server.metrics_port}"] == gw["static_configs"][0]["targets"]
    published = _compose()["services"]["gateway"]["ports"]
    assert not [p for p in published if str(cfg.server.metrics_port) in p]
    services = _compose()["services"]
    for job in jobs.values():
        for target in job["static_configs"][0]["targets"]:
            assert target.split(":")[0] in services, target


def test_compose_grafana_is_provisioned_from_the_grafana_folder() -> None:
    volumes = _compose()["services"]["grafana"]["volumes"]
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in volumes if v.endswith(":ro"))
    assert mounts["../grafana/provisioning"] == "/etc/grafana/provisioning"
    dashboards_at = mounts["../grafana/dashboards"]
    # The grafana/ folder's own provisioning must read the dashboards where compose puts them
    # and reach Prometheus by its compose name.
    providers = sorted((REPO / "grafana" / "provisioning" / "dashboards").glob("*.y*ml"))
    datasources = sorted((REPO / "grafana" / "provisioning" / "datasources").glob("*.y*ml"))
    need(providers and datasources, "grafana/provisioning is not written yet")
    for path in providers:
        for provider in yaml.safe_load(path.read_text())["providers"]:
            assert provider["options"]["path"].startswith(dashboards_at), path
    urls = [
        ds.get("url", "")
        for p in datasources
        for ds in yaml.safe_load(p.read_text())["datasources"]
        if ds["type"] == "prometheus"
    ]
    assert urls and all(u.rstrip("/") == "http://prometheus:9090" for u in urls), urls
    # Grafana's $__rate_interval is right only when it knows the real scrape interval.
    scrape = yaml.safe_load(PROMETHEUS.read_text())["global"]["scrape_interval"]
    for p in datasources:
        for ds in yaml.safe_load(p.read_text())["datasources"]:
            if ds["type"] == "prometheus" and "timeInterval" in ds.get("jsonData", {}):
                assert ds["jsonData"]["timeInterval"] == scrape, p
