"""`kubectl kustomize` (kustomize v5, as kubectl 1.32 bundles it: v5.5.0), played for what the
kustomizations in deploy/ use: `resources` (files, and folders rendered in turn) and `patches`
by path, each a strategic-merge patch of one resource. Anything else in a kustomization.yaml
(namePrefix, labels, images, generators, JSON 6902 patches, components) is an error here, not
ignored; so are patch directives (`$patch`, `$setElementOrder`) and deletions (a null),
which none of them use. The
output of deploy/serving's kustomizations was compared with kubectl's once, equal as sets of
documents (kustomize also sorts them by kind, which nothing here depends on)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION = "kustomization.yaml"

# How strategic merge patch merges the lists a patch here could touch: by this key of each item
# (the patchMergeKey of k8s.io/api core/v1 types.go). Any other list is replaced whole, as
# strategic merge patch replaces lists without a merge strategy (args, command, tolerations).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}


def load(path: Path) -> list[dict[str, Any]]:
    """The non-empty YAML documents of one file."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def strategic_merge(base: Any, patch: Any, key: str = "") -> Any:
    """`patch` merged into `base` as kustomize's strategic-merge patches are: maps key by key,
    the lists of MERGE_KEYS item by item, any other value replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for k, value in patch.items():
            assert not k.startswith("$") and value is not None, f"not played: {k}: {value}"
            merged[k] = strategic_merge(base[k], value, k) if k in base else value
        return merged
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        by = MERGE_KEYS[key]
        merged_list = list(base)
        for item in patch:
            at = [i for i, old in enumerate(merged_list) if old[by] == item[by]]
            if at:
                merged_list[at[0]] = strategic_merge(merged_list[at[0]], item)
            else:
                merged_list.append(item)
        return merged_list
    return patch


def render(folder: Path) -> list[dict[str, Any]]:
    """What `kubectl apply -k folder` applies: its resources (files, or folders rendered in
    turn), then each patch merged into the resource of its kind and name. Only the fields the
    kustomizations here use are played; any other is an error, not ignored."""
    spec = yaml.safe_load((folder / KUSTOMIZATION).read_text())
    played = {"apiVersion", "kind", "resources", "patches"}
    assert set(spec) <= played, f"{folder}: render() does not play {set(spec) - played}"
    docs: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = folder / entry
        docs += render(path) if path.is_dir() else load(path)
    for entry in spec.get("patches", []):
        assert set(entry) == {"path"}, f"{folder}: render() plays only patches by path"
        (patch,) = load(folder / entry["path"])
        which = (patch["kind"], patch["metadata"]["name"])
        at = [i for i, doc in enumerate(docs) if (doc["kind"], doc["metadata"]["name"]) == which]
        assert len(at) == 1, f"{folder}: the patch {entry['path']} matches {len(at)} resources"
        docs[at[0]] = strategic_merge(docs[at[0]], patch)
    return copy.deepcopy(docs)
