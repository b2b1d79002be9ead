"""The part of kustomize that deploy/kubernetes uses, so the manifests are built without it.

``kubectl kustomize`` is not installed everywhere the tests run (CI installs none), so this
builds a kustomization the way kustomize 5 does for the features used here, and refuses any
other: the tests check what would really be applied, and ``test_kubernetes.py`` compares
this build with ``kubectl kustomize`` wherever kubectl is installed.

- ``resources``: YAML files and directories holding a kustomization, relative to it. As in
  kustomize, no file may sit outside the kustomization's directory, and a directory may not
  contain the kustomization that names it (kustomize refuses the cycle: an overlay cannot
  live inside its base).
- ``configMapGenerator`` (``files``, ``literals``, ``options.labels``/``annotations``): the
  ConfigMap is named ``<name>-<hash>``. The hash is kustomize's (``api/hasher``): the first
  ten hex digits of the SHA-256 of ``json.Marshal({"data", "kind", "name"})`` with 0, 1, 3,
  a, e replaced by g, h, k, m, t. The name in it is always empty, because kustomize looks
  the name up with the one-key path ``"metadata/name"``, which finds nothing: the hash
  follows the data alone.
- Name references: a pod template's ``configMap`` volumes, ``envFrom.configMapRef`` and
  ``configMapKeyRef`` naming a generator's name are rewritten to the generated name.
- ``patches``: JSON patches (RFC 6902, ``add``/``replace``/``remove``) from ``path`` or
  ``patch``, with a ``target`` that must match exactly one resource.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

Doc = dict[str, Any]

_KEYS = {"apiVersion", "kind", "resources", "configMapGenerator", "patches"}
_GENERATOR_KEYS = {"name", "files", "literals", "options"}
_HASH_LETTERS = str.maketrans("013ae", "ghkmt")


class KustomizeError(Exception):
    """What kustomize would refuse, or a feature this module does not implement."""


def go_json(obj: object) -> bytes:
    """``json.Marshal``: sorted keys, no spaces, UTF-8, and HTML characters escaped."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for ch, esc in (
        ("&", "\\u0026"),
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(ch, esc)
    return text.encode()


def configmap_hash(data: dict[str, str]) -> str:
    """kustomize's name suffix for a generated ConfigMap holding ``data``."""
    digest = hashlib.sha256(go_json({"data": data, "kind": "ConfigMap", "name": ""}))
    return digest.hexdigest()[:10].translate(_HASH_LETTERS)


def load(directory: Path) -> Doc:
    """A directory's kustomization.yaml, checked against the keys this module implements."""
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    if set(k) - _KEYS:
        raise KustomizeError(f"{directory}: not implemented here: {sorted(set(k) - _KEYS)}")
    return k


def build(directory: Path) -> list[Doc]:
    """The resources ``kubectl kustomize directory`` prints, in the order they are listed."""
    return _build(directory.resolve(), ())


def _inside(path: Path, root: Path) -> Path:
    path = path.resolve()
    if not path.is_relative_to(root):
        raise KustomizeError(f"{path} is not in or below {root}")
    return path


def _build(root: Path, seen: tuple[Path, ...]) -> list[Doc]:
    for visited in seen:
        if visited.is_relative_to(root):
            raise KustomizeError(f"cycle: {root} contains {visited}, which names it")
    k = load(root)
    docs: list[Doc] = []
    for entry in k.get("resources", []):
        path = (root / entry).resolve()
        if path.is_dir():
            docs += _build(path, (*seen, root))
        else:
            docs += [d for d in yaml.safe_load_all(_inside(path, root).read_text()) if d]
    renamed: dict[str, str] = {}
    for gen in k.get("configMapGenerator", []):
        cm = _generate(root, gen)
        renamed[gen["name"]] = cm["metadata"]["name"]
        docs.append(cm)
    for doc in docs:
        _rename_configmaps(doc, renamed)
    for patch in k.get("patches", []):
        _patch(root, docs, patch)
    return docs


def _generate(root: Path, gen: Doc) -> Doc:
    if set(gen) - _GENERATOR_KEYS:
        raise KustomizeError(f"configMapGenerator: not implemented: {set(gen) - _GENERATOR_KEYS}")
    data: dict[str, str] = {}
    for entry in gen.get("files", []):
        key, _, path = entry.rpartition("=")
        file = _inside(root / path, root)
        data[key or file.name] = file.read_text()
    for entry in gen.get("literals", []):
        key, _, value = entry.partition("=")
        data[key] = value
    meta: Doc = {"name": f"{gen['name']}-{configmap_hash(data)}"}
    options = gen.get("options", {})
    if set(options) - {"labels", "annotations"}:
        raise KustomizeError(f"generator options: not implemented: {sorted(options)}")
    meta.update(copy.deepcopy(options))
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def _rename_configmaps(doc: Doc, renamed: dict[str, str]) -> None:
    pod = doc.get("spec", {}).get("template", {}).get("spec")
    if not pod or not renamed:
        return

    def fix(ref: Doc | None) -> None:
        if ref and ref.get("name") in renamed:
            ref["name"] = renamed[ref["name"]]

    for volume in pod.get("volumes", []):
        fix(volume.get("configMap"))
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        for source in container.get("envFrom", []):
            fix(source.get("configMapRef"))
        for env in container.get("env", []):
            fix(env.get("valueFrom", {}).get("configMapKeyRef"))


def _matches(doc: Doc, target: Doc) -> bool:
    group, _, version = doc["apiVersion"].rpartition("/")
    want = {
        "group": group,
        "version": version,
        "kind": doc["kind"],
        "name": doc["metadata"]["name"],
    }
    if set(target) - set(want):
        raise KustomizeError(f"patch target: not implemented: {sorted(target)}")
    return all(want[key] == value for key, value in target.items())


def _patch(root: Path, docs: list[Doc], patch: Doc) -> None:
    text = _inside(root / patch["path"], root).read_text() if "path" in patch else patch["patch"]
    ops = yaml.safe_load(text)
    if not isinstance(ops, list):
        raise KustomizeError("only JSON patches (a list of operations) are implemented")
    targets = [d for d in docs if _matches(d, patch.get("target", {}))]
    if len(targets) != 1:
        raise KustomizeError(f"patch target {patch.get('target')} matches {len(targets)}")
    for op in ops:
        _apply(targets[0], op)


def _apply(doc: Doc, op: Doc) -> None:
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"][1:].split("/")]
    node: Any = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    kind, value = op["op"], copy.deepcopy(op.get("value"))
    key: Any = last
    if isinstance(node, list):
        key = len(node) if last == "-" else int(last)
        if kind == "add":
            node.insert(key, value)
            return
        if not 0 <= key < len(node):
            raise KustomizeError(f"{kind} {op['path']}: no such element")
    elif kind != "add" and last not in node:
        raise KustomizeError(f"{kind} {op['path']}: no such field")
    if kind in ("add", "replace"):
        node[key] = value
    elif kind == "remove":
        del node[key]
    else:
        raise KustomizeError(f"JSON patch op {kind!r}: not implemented")
