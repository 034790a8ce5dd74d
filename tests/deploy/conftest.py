"""Shared setup of the deploy/ tests: every manifest, as the cluster would get it.

- `manifests` (session): every resource in deploy/, `{name: document}`. A file in a folder
  without a kustomization.yaml is applied alone (`kubectl apply -f`): `<file>[<index>] <Kind>`.
  A folder with one is applied as `kubectl apply -k` would render it
  (tests/doubles/kubernetes/kustomize.py):
  `<folder>: <Kind> <name>`, so deploy/serving/gpu's Deployment is the patched one.
- `kustomized` (session): each kustomization folder (relative to deploy/) -> its rendered
  documents.
- `pins` (session): images/bases.json, name -> pinned image reference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.doubles.kubernetes.kustomize import KUSTOMIZATION, load, render

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def kustomization_folders() -> list[Path]:
    return sorted(path.parent for path in DEPLOY.rglob(KUSTOMIZATION))


@pytest.fixture(scope="session")
def kustomized() -> dict[str, list[dict[str, Any]]]:
    return {str(folder.relative_to(DEPLOY)): render(folder) for folder in kustomization_folders()}


@pytest.fixture(scope="session")
def manifests(kustomized: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if not (path.parent / KUSTOMIZATION).exists():
            for index, doc in enumerate(load(path)):
                found[f"{path.relative_to(DEPLOY)}[{index}] {doc.get('kind')}"] = doc
    for folder, docs in kustomized.items():
        for doc in docs:
            found[f"{folder}: {doc['kind']} {doc['metadata']['name']}"] = doc
    return found


@pytest.fixture(scope="session")
def pins() -> dict[str, str]:
    return dict(json.loads((REPO / "images" / "bases.json").read_text()))
