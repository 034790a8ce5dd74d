"""The launcher's RBAC grants exactly what the tfjob launcher calls, and every manifest in
deploy/ (deploy/serving/ too, each kustomization rendered as `kubectl apply -k` would:
tests/doubles/kubernetes/kustomize.py)
is valid for the Kubernetes versions KFP 2.5 runs on (kubernetes-validate's offline schemas),
or, for a custom resource, against its CRD's schema (each file's $comment naming its upstream
source and version, both in tests/data: the PodMonitor's from prometheus-operator, the
InferenceService's a fragment of KServe v0.20.0's). test_serving.py checks what the serving
manifests promise."""

import copy
import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from components.jobs.access import STEP_ACCESS
from tests.doubles.kubernetes.crd_schema import schema_errors
from tests.doubles.kubernetes.kustomize import KUSTOMIZATION, load

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RBAC = DEPLOY / "rbac.yaml"
DATA = Path(__file__).resolve().parents[1] / "data"
# Custom resources, which kubernetes-validate has no schema for: (apiVersion, kind) -> schema.
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "PodMonitor"): DATA / "podmonitor_crd_v1_schema.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): (
        DATA / "inferenceservice_crd_v1beta1_schema.json"
    ),
}


def _is_custom(doc: dict) -> bool:
    return (doc.get("apiVersion"), doc.get("kind")) in CRD_SCHEMAS


def test_rbac_role_grants_exactly_the_launcher_calls():
    """deploy/rbac.yaml and components/jobs/access.py (what doctor reviews) are one list."""
    role, binding = list(yaml.safe_load_all(RBAC.read_text()))
    rules = {
        (r["apiGroups"][0], res): set(r["verbs"]) for r in role["rules"] for res in r["resources"]
    }
    assert rules == {(rule.group, rule.resource): set(rule.verbs) for rule in STEP_ACCESS}
    assert {"create", "get", "watch", "delete"} <= rules[("kubeflow.org", "tfjobs")]
    assert {"list", "get"} <= rules[("", "pods")]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["kind"] == "ServiceAccount"


# Kubeflow 1.10 (KFP 2.5) targets Kubernetes 1.31-1.33 and runs on 1.29 and 1.30 as well.
KUBERNETES_VERSIONS = ("1.29", "1.30", "1.31", "1.32", "1.33")


def test_there_are_manifests_to_validate(manifests):
    assert "rbac.yaml[0] Role" in manifests
    kinds = {doc["kind"] for doc in manifests.values()}
    assert {"Role", "RoleBinding", "PodMonitor", "ServiceAccount", "Deployment"} <= kinds
    assert {"Service", "PodDisruptionBudget", "InferenceService"} <= kinds
    assert {"serving/cpu", "serving/gpu", "serving/kserve"} <= {
        name.split(":")[0] for name in manifests if ":" in name
    }


def test_every_yaml_file_in_deploy_is_applied_and_so_validated():
    # A file neither applied alone nor named by its folder's kustomization would be missed by
    # `kubectl apply -k` and by the schema checks below alike.
    used = set()
    for kustomization in DEPLOY.rglob(KUSTOMIZATION):
        spec = yaml.safe_load(kustomization.read_text())
        entries = spec.get("resources", []) + [p["path"] for p in spec.get("patches", [])]
        used |= {(kustomization.parent / entry).resolve() for entry in entries}
    for path in DEPLOY.rglob("*.yaml"):
        if path.name != KUSTOMIZATION and (path.parent / KUSTOMIZATION).exists():
            assert path.resolve() in used, f"{path}: not in its folder's {KUSTOMIZATION}"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schema_strictly(version, manifests):
    for name, doc in manifests.items():
        if _is_custom(doc):
            continue  # checked against its CRD below
        # strict: a misspelled or misplaced key is an error, not silently dropped by the server
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = ".".join(str(p) for p in err.path)
            pytest.fail(f"{name} is not valid on Kubernetes {version}: {where}: {err.message}")


def _typo_in_podmonitor(doc: dict) -> None:
    doc["spec"]["podMetricsEndpoints"][0]["prot"] = "metrics"  # a typo the server drops


def _typo_in_inferenceservice(doc: dict) -> None:
    tensorflow = doc["spec"]["predictor"]["tensorflow"]
    tensorflow["runtimeVerison"] = tensorflow.pop("runtimeVersion")  # KServe's default, silently


TYPOS = {"PodMonitor": _typo_in_podmonitor, "InferenceService": _typo_in_inferenceservice}


def test_every_custom_resource_is_valid_against_its_crd_schema(manifests):
    custom = {name: doc for name, doc in manifests.items() if _is_custom(doc)}
    assert sorted(custom) == [
        "podmonitor.yaml[0] PodMonitor",
        "serving/kserve: InferenceService gpt",
    ]
    for name, doc in custom.items():
        schema = json.loads(CRD_SCHEMAS[(doc["apiVersion"], doc["kind"])].read_text())
        assert schema_errors(doc, schema) == [], name
        broken = copy.deepcopy(doc)
        TYPOS[doc["kind"]](broken)
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
    role = copy.deepcopy(load(RBAC)[0])
    break_it(role)
    with pytest.raises(kubernetes_validate.ValidationError, match=why):
        kubernetes_validate.validate(role, KUBERNETES_VERSIONS[-1], strict=True)


def test_workload_identity_annotates_the_account_doctor_checks():
    from components.doctor.checks import WORKLOAD_IDENTITY
    from components.jobs.placement import kfp_step_account

    (account,) = load(DEPLOY / "workload-identity.yaml")
    meta = account["metadata"]
    assert account["kind"] == "ServiceAccount"
    assert meta["name"] == kfp_step_account(meta["namespace"])
    assert meta["annotations"][WORKLOAD_IDENTITY].endswith(".iam.gserviceaccount.com")
