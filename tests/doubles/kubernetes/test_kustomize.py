"""The kustomize double merges as strategic merge patch does for the lists deploy/ patches, and
refuses what it does not play."""

import pytest
import yaml

from tests.doubles.kubernetes.kustomize import render, strategic_merge

BASE = {
    "spec": {
        "containers": [
            {"name": "a", "image": "x:1", "args": ["--p=1", "--q=2"], "env": [{"name": "E"}]},
            {"name": "b", "image": "y:1"},
        ],
        "tolerations": [{"key": "k1"}],
    }
}


def test_containers_merge_by_name_and_other_lists_are_replaced():
    patch = {
        "spec": {
            "containers": [{"name": "a", "image": "x:2", "args": ["--p=3"]}, {"name": "c"}],
            "tolerations": [{"key": "k2"}],
        }
    }
    merged = strategic_merge(BASE, patch)
    assert merged["spec"]["containers"] == [
        {"name": "a", "image": "x:2", "args": ["--p=3"], "env": [{"name": "E"}]},
        {"name": "b", "image": "y:1"},
        {"name": "c"},
    ]
    assert merged["spec"]["tolerations"] == [{"key": "k2"}]
    assert BASE["spec"]["containers"][0]["image"] == "x:1"  # the base is left as it was


def test_patch_directives_and_deletions_are_refused():
    with pytest.raises(AssertionError, match="not played"):
        strategic_merge(BASE, {"spec": {"$patch": "replace"}})
    with pytest.raises(AssertionError, match="not played"):
        strategic_merge(BASE, {"spec": {"tolerations": None}})


def test_a_kustomization_field_it_does_not_play_is_refused(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({"namePrefix": "x-"}))
    with pytest.raises(AssertionError, match="namePrefix"):
        render(tmp_path)


def test_a_patch_applies_to_the_resource_of_its_kind_and_name(tmp_path):
    base, overlay = tmp_path / "base", tmp_path / "overlay"
    base.mkdir()
    overlay.mkdir()
    (base / "kustomization.yaml").write_text(yaml.safe_dump({"resources": ["d.yaml"]}))
    deployments = [{"kind": "Deployment", "metadata": {"name": n}, **BASE} for n in ("p", "q")]
    (base / "d.yaml").write_text(yaml.safe_dump_all(deployments))
    spec = {"resources": ["../base"], "patches": [{"path": "p.yaml"}]}
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    patch = {"kind": "Deployment", "metadata": {"name": "q"}, "spec": {"tolerations": []}}
    (overlay / "p.yaml").write_text(yaml.safe_dump(patch))
    p, q = render(overlay)
    assert p["spec"]["tolerations"] == [{"key": "k1"}]
    assert q["spec"]["tolerations"] == []
