"""deploy/kubernetes, built and checked without a cluster.

The kustomizations are built by ``tests/deploy/kustomize.py`` (the subset of kustomize they
use), so every check below is on what ``kubectl apply -k`` would send: the base
(``deploy/kubernetes``, which is ``base/``) and the overlay ``overlays/autoscale-streams``.
Where ``kubectl`` is installed its own ``kustomize`` must print the same resources; CI installs
no kubectl, so that one comparison skips there and the rest still runs.

- Built-in kinds match the official JSON schemas of Kubernetes ``K8S_VERSION``
  (kubernetes-validate, strict: an unknown field fails).
- The config is a ``configMapGenerator`` over ``base/gateway.toml``: no static ConfigMap, the
  Deployment mounts the generated name, and a config change changes that name (so the pods
  roll).
- Probes, grace, security, Secret references, selectors and topology spread fit together.
- The overlay's HPA scales on ``llm_gateway_streams_in_flight`` per pod, a gauge the gateway
  really exports, served by the prometheus-adapter rule shipped beside it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gateway.ops import config
from gateway.ops.metrics import Metrics
from tests.deploy import kustomize
from tests.deploy_files import (
    DRAIN_TAIL_S,
    K8S,
    K8S_VERSION,
    UNIT_CONFIG,
    env_names,
    image_state_directory,
    need,
    parse_with_env,
)

BASE = K8S / "base"
OVERLAY = K8S / "overlays" / "autoscale-streams"
ADAPTER_RULES = OVERLAY / "prometheus-adapter-rules.yaml"
STREAMS_METRIC = "llm_gateway_streams_in_flight"
CONFIG_NAME = "llm-gateway-config"

_BUILT_IN = ("ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget")


def _doc(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def _base(kind: str) -> dict[str, Any]:
    return _doc(kustomize.build(K8S), kind)


def _overlay(kind: str) -> dict[str, Any]:
    return _doc(kustomize.build(OVERLAY), kind)


def _gateway_config() -> tuple[dict[str, Any], config.Config]:
    text = _base("ConfigMap")["data"]["gateway.toml"]
    return tomllib.loads(text), parse_with_env(text, "gateway.toml")


def _validator() -> Any:
    try:
        import kubernetes_validate
    except ImportError:
        kubernetes_validate = None
    need(kubernetes_validate, "kubernetes-validate is not installed")
    return kubernetes_validate


def _container() -> dict[str, Any]:
    containers = _base("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _by_name(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(docs, key=lambda d: (d["kind"], d["metadata"]["name"]))


# ---------------------------------------------------------------- the kustomizations


@pytest.mark.parametrize("root", [K8S, BASE, OVERLAY], ids=["root", "base", "overlay"])
def test_kustomize_builds_what_kubectl_builds(root: Path) -> None:
    kubectl = shutil.which("kubectl")
    if not kubectl:  # not need: CI has no kubectl, and the build below does its work there
        pytest.skip("kubectl is not installed; tests/deploy/kustomize.py builds alone")
    run = subprocess.run(
        [kubectl, "kustomize", str(root)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    theirs = [doc for doc in yaml.safe_load_all(run.stdout) if doc]
    assert _by_name(kustomize.build(root)) == _by_name(theirs)


def test_kustomize_hash_is_kustomizes() -> None:
    """Values printed by kustomize 5.0.1 to 5.6.0 (kubectl 1.27 to 1.33). The name does not
    enter the hash (kustomize's lookup of "metadata/name" finds nothing), so two generators
    with the same data get the same suffix."""
    assert kustomize.configmap_hash({"FOO": "Bar"}) == "42cfbf598f"
    # json.Marshal escapes <, > and & and writes other characters as UTF-8
    assert kustomize.configmap_hash({"a": "<&> é"}) == "hdbkhh2dc4"


def test_k8s_every_file_is_in_the_kustomization_and_no_configmap_is_static() -> None:
    k = kustomize.load(BASE)
    generated = {f for gen in k["configMapGenerator"] for f in gen["files"]}
    assert sorted(p.name for p in BASE.iterdir()) == sorted(
        {*k["resources"], *generated, "kustomization.yaml"}
    )
    assert [gen["name"] for gen in k["configMapGenerator"]] == [CONFIG_NAME]
    listed = [
        doc["kind"]
        for f in k["resources"]
        for doc in yaml.safe_load_all((BASE / f).read_text())
        if doc
    ]
    assert "ConfigMap" not in listed
    assert sorted(doc["kind"] for doc in kustomize.build(K8S)) == sorted(
        (*_BUILT_IN, "ServiceMonitor")
    )
    assert kustomize.load(K8S)["resources"] == ["base"]


def test_k8s_config_change_renames_the_configmap_and_rolls_the_pods(tmp_path: Path) -> None:
    copy = tmp_path / "kubernetes"
    shutil.copytree(K8S, copy)
    before = kustomize.build(copy)
    toml = copy / "base" / "gateway.toml"
    toml.write_text(toml.read_text().replace('log_level = "info"', 'log_level = "debug"'))
    after = kustomize.build(copy)
    names = []
    for docs in (before, after):
        cm = _doc(docs, "ConfigMap")
        assert cm["metadata"]["name"].startswith(CONFIG_NAME + "-")
        volumes = _doc(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
        assert {"name": "config", "configMap": {"name": cm["metadata"]["name"]}} in volumes
        names.append(cm["metadata"]["name"])
    assert names[0] != names[1]
    # the pod template changes with it, which is what makes the Deployment roll
    assert (
        _doc(before, "Deployment")["spec"]["template"]
        != _doc(after, "Deployment")["spec"]["template"]
    )
    # the file as written is what the pods read
    assert _doc(after, "ConfigMap")["data"] == {"gateway.toml": toml.read_text()}


def test_kustomize_refuses_what_kustomize_refuses(tmp_path: Path) -> None:
    copy = tmp_path / "kubernetes"
    shutil.copytree(K8S, copy)
    overlay = copy / "overlays" / "autoscale-streams"
    k = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    # a patch whose target does not exist
    k["patches"][0]["target"]["name"] = "no-such-hpa"
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(k))
    with pytest.raises(kustomize.KustomizeError, match="matches 0"):
        kustomize.build(overlay)
    # an overlay inside the base it builds on
    k["patches"][0]["target"]["name"] = "llm-gateway"
    k["resources"] = ["../.."]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(k))
    with pytest.raises(kustomize.KustomizeError, match="cycle"):
        kustomize.build(overlay)
    # a generator file outside the kustomization
    base = yaml.safe_load((copy / "base" / "kustomization.yaml").read_text())
    base["configMapGenerator"][0]["files"] = ["../../gateway.example.toml"]
    (copy / "base" / "kustomization.yaml").write_text(yaml.safe_dump(base))
    with pytest.raises(kustomize.KustomizeError, match="not in or below"):
        kustomize.build(copy)


# ---------------------------------------------------------------- schemas


@pytest.mark.parametrize("kind", _BUILT_IN)
def test_k8s_manifest_matches_the_official_schema(kind: str) -> None:
    kv = _validator()
    kv.validate(_base(kind), K8S_VERSION, strict=True)


def test_k8s_overlay_and_adapter_rules_match_the_official_schema() -> None:
    kv = _validator()
    kv.validate(_overlay("HorizontalPodAutoscaler"), K8S_VERSION, strict=True)
    kv.validate(yaml.safe_load(ADAPTER_RULES.read_text()), K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("kind", "path", "bad"),
    [
        ("Deployment", ("spec", "replica"), 2),  # a misspelled field
        ("Deployment", ("spec", "replicas"), "two"),
        (
            "Deployment",
            ("spec", "template", "spec", "topologySpreadConstraints", 0, "maxSkew"),
            "1",
        ),
        ("Service", ("spec", "ports"), [{"name": "http", "port": "http"}]),
        ("HorizontalPodAutoscaler", ("spec", "minReplicas"), "2"),
    ],
)
def test_k8s_schema_validation_rejects_broken_manifests(
    kind: str, path: tuple[str | int, ...], bad: object
) -> None:
    kv = _validator()
    doc = json.loads(json.dumps(_base(kind)))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = bad
    with pytest.raises(kv.ValidationError):
        kv.validate(doc, K8S_VERSION, strict=True)


# ---------------------------------------------------------------- how the base fits together


def test_k8s_probes_ask_ready_and_health_on_the_named_port() -> None:
    c = _container()
    port_names = {p["name"]: p["containerPort"] for p in c["ports"]}
    _, cfg = _gateway_config()
    assert port_names == {"http": cfg.server.port, "metrics": cfg.server.metrics_port}
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}


def test_k8s_termination_grace_outlasts_prestop_and_drain() -> None:
    pod = _base("Deployment")["spec"]["template"]["spec"]
    sleep = _container()["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    _, cfg = _gateway_config()
    assert pod["terminationGracePeriodSeconds"] > (
        int(sleep[1]) + cfg.server.shutdown_grace + DRAIN_TAIL_S
    )


def test_k8s_container_resources_and_security() -> None:
    c = _container()
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])
    assert "memory" in c["resources"]["limits"]
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]


def test_k8s_config_comes_from_the_generated_configmap_and_keys_from_the_secret() -> None:
    c = _container()
    pod = _base("Deployment")["spec"]["template"]["spec"]
    cm = _base("ConfigMap")
    assert c["args"] == ["--config", UNIT_CONFIG]
    mount = next(m for m in c["volumeMounts"] if UNIT_CONFIG.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    assert cm["metadata"]["name"] == f"{CONFIG_NAME}-{kustomize.configmap_hash(cm['data'])}"
    # deployment.yaml names the generator; only the build knows the hash
    raw = yaml.safe_load((BASE / "deployment.yaml").read_text())["spec"]["template"]["spec"]
    assert {"name": mount["name"], "configMap": {"name": CONFIG_NAME}} in raw["volumes"]
    assert UNIT_CONFIG.rsplit("/", 1)[1] in cm["data"]
    data, cfg = _gateway_config()
    assert cfg.server.host == "0.0.0.0"
    from_secret = {e["name"] for e in c["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert env_names(data) == from_secret == {"GATEWAY_API_KEYS", "GATEWAY_SIGNING_KEY"}


def test_k8s_state_directory_is_a_writable_volume() -> None:
    """STATE_DIRECTORY (the image's, set here too) is a mounted volume, since the root file
    system is read-only: an emptyDir on disk (batches live as long as the pod) or a claim."""
    c = _container()
    pod = _base("Deployment")["spec"]["template"]["spec"]
    state = image_state_directory()
    assert {"name": "STATE_DIRECTORY", "value": state} in c["env"]
    [mount] = [m for m in c["volumeMounts"] if m["mountPath"] == state]
    assert not mount.get("readOnly")
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "persistentVolumeClaim" in volume or volume["emptyDir"].get("medium") != "Memory"
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]


def test_k8s_replicas_spread_over_zones_and_nodes_as_a_preference() -> None:
    template = _base("Deployment")["spec"]["template"]
    spread = template["spec"]["topologySpreadConstraints"]
    assert [s["topologyKey"] for s in spread] == [
        "topology.kubernetes.io/zone",
        "kubernetes.io/hostname",
    ]
    for s in spread:
        # DoNotSchedule would leave replicas Pending on a one-zone or one-node cluster
        assert s["whenUnsatisfiable"] == "ScheduleAnyway" and s["maxSkew"] == 1
        assert s["labelSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
        assert s["matchLabelKeys"] == ["pod-template-hash"]


def test_k8s_service_hpa_pdb_and_servicemonitor_select_the_pods() -> None:
    pod_labels = _base("Deployment")["spec"]["template"]["metadata"]["labels"]
    svc = _base("Service")
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    pdb = _base("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    hpa = _base("HorizontalPodAutoscaler")["spec"]
    deployment = _base("Deployment")
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert 2 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    # the base needs nothing but metrics-server
    assert [m["type"] for m in hpa["metrics"]] == ["Resource"]
    # ServiceMonitor is a CRD: no official schema, so its shape is checked here.
    sm = _base("ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    # keys are set, so /metrics has a listener of its own (on the API port it would ask for
    # one): the ServiceMonitor scrapes that port, by name, through the Service
    _, cfg = _gateway_config()
    assert cfg.server.api_keys and cfg.server.metrics_apart
    targets = {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]}
    assert [(e["port"], e["path"]) for e in sm["spec"]["endpoints"]] == [("metrics", "/metrics")]
    assert targets["metrics"] == "metrics"


# ---------------------------------------------------------------- the autoscale-streams overlay


def test_overlay_changes_only_the_hpa_metrics() -> None:
    base, overlay = _by_name(kustomize.build(K8S)), _by_name(kustomize.build(OVERLAY))
    hpa = _doc(overlay, "HorizontalPodAutoscaler")
    kept = json.loads(json.dumps(hpa))
    kept["spec"]["metrics"] = _base("HorizontalPodAutoscaler")["spec"]["metrics"]
    assert [kept if d["kind"] == "HorizontalPodAutoscaler" else d for d in overlay] == base
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300


def test_overlay_hpa_scales_on_streams_in_flight_per_pod() -> None:
    metrics = _overlay("HorizontalPodAutoscaler")["spec"]["metrics"]
    pods = [m["pods"] for m in metrics if m["type"] == "Pods"]
    assert len(pods) == 1 and pods[0]["metric"] == {"name": STREAMS_METRIC}
    assert pods[0]["target"]["type"] == "AverageValue"
    target = float(pods[0]["target"]["averageValue"])
    # below what one pod admits before it answers 529, so a pod is added first
    _, cfg = _gateway_config()
    admitted = sum(m.max_concurrency for m in cfg.models.values())
    assert 0 < target < admitted
    # CPU stays as a second signal (the HPA takes whichever wants more replicas)
    assert [m["resource"]["name"] for m in metrics if m["type"] == "Resource"] == ["cpu"]


def test_overlay_does_not_apply_the_adapter_config() -> None:
    """An adapter reads one config: applying the snippet with the overlay would replace the
    rules the adapter already has, so it is shipped beside the overlay, not in it."""
    assert all(
        doc["kind"] != "ConfigMap" or doc["metadata"]["name"].startswith(CONFIG_NAME)
        for doc in kustomize.build(OVERLAY)
    )
    assert ADAPTER_RULES.name not in json.dumps(kustomize.load(OVERLAY))


def test_adapter_rule_serves_the_gauge_the_gateway_exports_per_pod() -> None:
    registry = CollectorRegistry()
    Metrics(registry)
    types = {m.name: m.type for m in registry.collect()}
    assert types[STREAMS_METRIC] == "gauge"
    cm = yaml.safe_load(ADAPTER_RULES.read_text())
    rules = yaml.safe_load(cm["data"]["config.yaml"])["rules"]
    rule = next(r for r in rules if STREAMS_METRIC in r["seriesQuery"])
    assert rule["seriesQuery"].startswith(STREAMS_METRIC + "{")
    # the labels the Prometheus Operator puts on every series a ServiceMonitor scrapes
    assert rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }
    assert rule["name"]["as"] == STREAMS_METRIC
    assert (
        rule["metricsQuery"].replace(" ", "")
        == "sum(<<.Series>>{<<.LabelMatchers>>})by(<<.GroupBy>>)"
    )
    pods = [
        m["pods"]
        for m in _overlay("HorizontalPodAutoscaler")["spec"]["metrics"]
        if m["type"] == "Pods"
    ]
    assert pods[0]["metric"]["name"] == rule["name"]["as"]
