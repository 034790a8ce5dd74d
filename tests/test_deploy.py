"""The launcher's RBAC grants exactly what the tfjob launcher calls."""

from pathlib import Path

import yaml

RBAC = Path(__file__).resolve().parent.parent / "deploy" / "rbac.yaml"


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
