"""Provenance: image digests (pinned and as the kubelet pulled them) and the code version."""

import subprocess

import pytest

from components import provenance
from tests.doubles.kubernetes.apiserver import FakeKube

PINNED = "ghcr.io/gptpipe/gptpipe-pipeline@sha256:" + "1" * 64
OTHER = "sha256:" + "9" * 64


def test_digest_of_references_and_image_ids():
    assert provenance.digest_of(PINNED) == "sha256:" + "1" * 64
    assert provenance.digest_of("docker-pullable://repo/x@" + OTHER) == OTHER
    assert provenance.digest_of(OTHER) == OTHER  # containerd may report the bare digest
    for unpinned in ("repo/x:latest", provenance.LOCAL_IMAGE, "repo/x@sha256:short", ""):
        assert provenance.digest_of(unpinned) == ""
        assert not provenance.is_pinned(unpinned)
    assert provenance.is_pinned(PINNED)


def test_local_run_records_unpinned_and_never_a_digest(tmp_path):
    found = provenance.detect(provenance.LOCAL_IMAGE, {}, namespace_file=str(tmp_path / "none"))
    assert found.properties() == {
        "image": provenance.LOCAL_IMAGE,
        "code_version": provenance.code_version({}),
        "unpinned": 1,
    }


def test_code_version_baked_then_git_then_unknown(tmp_path):
    assert provenance.code_version({provenance.CODE_VERSION_ENV: "abc123"}) == "abc123"
    assert provenance.code_version({}, repo_dir=tmp_path) == "unknown"
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "f.txt").write_text("one")
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert provenance.code_version({}, repo_dir=tmp_path) == head
    (tmp_path / "f.txt").write_text("two")
    assert provenance.code_version({}, repo_dir=tmp_path) == head + "-dirty"


@pytest.fixture
def pod_env(tmp_path):
    namespace = tmp_path / "namespace"
    namespace.write_text("team-a\n")
    return {"KFP_POD_NAME": "gptpipe-run-train-123"}, str(namespace)


@pytest.mark.parametrize("pulled, mismatch", [("sha256:" + "1" * 64, 0), (OTHER, 1)])
def test_pod_image_id_is_checked_against_the_pinned_digest(pod_env, pulled, mismatch):
    env, namespace_file = pod_env
    warnings: list[str] = []
    with FakeKube() as kube:
        kube.cluster.add_pod(
            "team-a",
            env["KFP_POD_NAME"],
            {
                "kfp-launcher": ("ghcr.io/kubeflow/kfp-launcher:2.4.0", "x@sha256:" + "3" * 64),
                "main": (PINNED, "docker-pullable://ghcr.io/gptpipe/gptpipe-pipeline@" + pulled),
            },
        )
        found = provenance.detect(
            PINNED,
            {**env, provenance.CODE_VERSION_ENV: "c0ffee"},
            namespace_file=namespace_file,
            api_client=kube.api_client(),
            warn=warnings.append,
        )
        (get,) = kube.calls("GET", "/api/v1/namespaces/team-a/pods/gptpipe-run-train-123")
    assert get.method == "GET"
    assert found.properties() == {
        "image": PINNED,
        "image_digest": "sha256:" + "1" * 64,
        "code_version": "c0ffee",
        "image_digest_observed": pulled,
        "image_digest_mismatch": mismatch,
    }
    assert len(warnings) == mismatch
    if mismatch:
        assert OTHER in warnings[0] and PINNED in warnings[0]


def test_an_unreadable_pod_is_recorded_not_raised(pod_env):
    env, namespace_file = pod_env
    with FakeKube() as kube:  # serves no such pod: 404 NotFound
        found = provenance.detect(
            PINNED, env, namespace_file=namespace_file, api_client=kube.api_client()
        )
    props = found.properties()
    assert "image_digest_observed" not in props
    assert props["image_digest"] == "sha256:" + "1" * 64
    assert "ApiException" in props["image_digest_observe_error"]


def test_no_pod_name_means_no_api_call(tmp_path):
    namespace = tmp_path / "namespace"
    namespace.write_text("team-a")
    found = provenance.detect(
        PINNED, {}, namespace_file=str(namespace), api_client=object()
    )  # would fail if used
    assert found.image_digest_observed == "" and found.observe_error == ""
