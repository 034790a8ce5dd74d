"""The launcher's RBAC grants exactly what the tfjob launcher calls, and every manifest in
deploy/ is valid for the Kubernetes versions KFP 2.5 runs on (kubernetes-validate's offline
schemas), or, for a custom resource, against its CRD's schema (kept in tests/data)."""

import copy
import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.doubles.kubernetes.crd_schema import schema_errors

RBAC = Path(__file__).resolve().parents[2] / "deploy" / "rbac.yaml"
DATA = Path(__file__).resolve().parents[1] / "data"
# Custom resources, which kubernetes-validate has no schema for: (apiVersion, kind) -> schema.
CRD_SCHEMAS = {("monitoring.coreos.com/v1", "PodMonitor"): DATA / "podmonitor_crd_v1_schema.json"}


def _is_custom(doc: dict) -> bool:
    return (doc.get("apiVersion"), doc.get("kind")) in CRD_SCHEMAS


def test_rbac_role_covers_the_launcher_calls():
    role, binding = list(yaml.safe_load_all(RBAC.read_text()))
    rules = {
        (r["apiGroups"][0], res): set(r["verbs"]) for r in role["rules"] for res in r["resources"]
    }
    assert {"create", "get", "watch", "delete"} <= rules[("kubeflow.org", "tfjobs")]
    assert {"list", "get"} <= rules[("", "pods")]
    assert "get" in rules[("", "pods/log")]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["kind"] == "ServiceAccount"


# Kubeflow 1.10 (KFP 2.5) targets Kubernetes 1.31-1.33 and runs on 1.29 and 1.30 as well.
KUBERNETES_VERSIONS = ("1.29", "1.30", "1.31", "1.32", "1.33")
MANIFESTS = sorted(RBAC.parent.glob("*.yaml"))


def manifest_documents() -> list[tuple[str, dict]]:
    found = []
    for path in MANIFESTS:
        for index, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                found.append((f"{path.name}[{index}] {doc.get('kind')}", doc))
    return found


def test_there_are_manifests_to_validate():
    assert RBAC in MANIFESTS
    kinds = [name.split()[-1] for name, _ in manifest_documents()]
    assert {"Role", "RoleBinding"} <= set(kinds)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schema_strictly(version):
    for name, doc in manifest_documents():
        if _is_custom(doc):
            continue  # checked against its CRD below
        # strict: a misspelled or misplaced key is an error, not silently dropped by the server
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = ".".join(str(p) for p in err.path)
            pytest.fail(f"{name} is not valid on Kubernetes {version}: {where}: {err.message}")


def test_every_custom_resource_is_valid_against_its_crd_schema():
    custom = [(name, doc) for name, doc in manifest_documents() if _is_custom(doc)]
    assert [name for name, _ in custom] == ["podmonitor.yaml[0] PodMonitor"]
    for name, doc in custom:
        schema = json.loads(CRD_SCHEMAS[(doc["apiVersion"], doc["kind"])].read_text())
        assert schema_errors(doc, schema) == [], name
        broken = copy.deepcopy(doc)
        broken["spec"]["podMetricsEndpoints"][0]["prot"] = "metrics"  # a typo the server drops
        assert schema_errors(broken, schema), name


@pytest.mark.parametrize(
    ("break_it", "why"),
    [
        (lambda role: role["rules"][0].update(verb=role["rules"][0].pop("verbs")), "verbs"),
        (lambda role: role["metadata"].update(lables={"a": "b"}), "lables"),
        (lambda role: role["rules"][0].update(verbs="get"), "is not of type 'array'"),
    ],
)
def test_the_schema_check_catches_a_broken_manifest(break_it, why):
    role = copy.deepcopy(next(doc for _, doc in manifest_documents() if doc["kind"] == "Role"))
    break_it(role)
    with pytest.raises(kubernetes_validate.ValidationError, match=why):
        kubernetes_validate.validate(role, KUBERNETES_VERSIONS[-1], strict=True)
