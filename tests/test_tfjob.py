"""The TFJob manifest, its name, and the launcher against an HTTP double of the Kubernetes API."""

from __future__ import annotations

import io
import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_double import IMAGE_DIGEST, FakeKube, scenarios

from components.train import tfjob, tfjob_manifest
from components.train.launcher import (
    JobSpec,
    LaunchCancelled,
    LaunchError,
    LaunchTimeout,
    OwnerPod,
    job_name,
)
from contracts.errors import UserError

IMAGE = "us-docker.pkg.dev/proj/gptpipe/trainer@" + IMAGE_DIGEST
SCHEMA = json.loads((Path(__file__).parent / "data" / "tfjob_crd_v1_schema.json").read_text())
JOB_PATH = "/apis/kubeflow.org/v1/namespaces/ml/tfjobs/train-run-1"


def make_spec(**overrides: Any) -> JobSpec:
    fields: dict[str, Any] = dict(
        name="train-run-1",
        namespace="ml",
        image=IMAGE,
        command=["python", "-m", "trainer.task", "--work-dir", "gs://b/work"],
        run_id="3f2a9c1e-5b7d-4e0a-9c1b-2d3e4f5a6b7c",
        workers=2,
        gpus_per_worker=1,
        cpu="8",
        memory="32Gi",
        node_selector={"cloud.google.com/gke-accelerator": "nvidia-l4"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        backoff_limit=2,
        active_deadline_seconds=7200,
        ttl_seconds_after_finished=3600,
        env={"GPTPIPE_LOG_LEVEL": "info"},
        owner=OwnerPod(name="launcher-pod-abc", uid="0f1e2d3c-aaaa-bbbb-cccc-111122223333"),
    )
    fields.update(overrides)
    return JobSpec(**fields)


# -- a tiny OpenAPI v3 validator: types, required, enum, properties, unknown fields --

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int}


def schema_errors(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Errors of `obj` against a structural schema; unknown fields are errors (the apiserver
    would silently prune them, which is how misplaced fields get lost)."""
    if "anyOf" in schema:
        if all(schema_errors(obj, s, path) for s in schema["anyOf"]):
            return [f"{path}: {obj!r} matches none of {schema['anyOf']}"]
        return []
    kind = schema.get("type")
    if kind:
        ok = isinstance(obj, _TYPES[kind]) and not (kind == "integer" and isinstance(obj, bool))
        if not ok:
            return [f"{path}: expected {kind}, got {type(obj).__name__}"]
    if "enum" in schema and obj not in schema["enum"]:
        return [f"{path}: {obj!r} not in {schema['enum']}"]
    errors: list[str] = []
    if isinstance(obj, dict):
        errors += [f"{path}.{k}: required" for k in schema.get("required", []) if k not in obj]
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        names = schema.get("propertyNames")
        for key, value in obj.items():
            if names and key not in names["enum"]:
                errors.append(f"{path}.{key}: key not in {names['enum']}")
            elif key in props:
                errors += schema_errors(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                errors += schema_errors(value, extra, f"{path}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f"{path}.{key}: unknown field")
    if isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            errors += schema_errors(item, schema["items"], f"{path}[{i}]")
    return errors


# -- the manifest --


def test_manifest_has_the_operator_layout():
    manifest = tfjob_manifest.build_manifest(make_spec())
    assert manifest["apiVersion"] == "kubeflow.org/v1" and manifest["kind"] == "TFJob"
    spec = manifest["spec"]
    assert set(spec) == {"runPolicy", "tfReplicaSpecs"}  # nothing of runPolicy at spec's top
    assert spec["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "backoffLimit": 2,
        "activeDeadlineSeconds": 7200,
        "ttlSecondsAfterFinished": 3600,
    }
    assert list(spec["tfReplicaSpecs"]) == ["Worker"]
    worker = spec["tfReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 2 and worker["restartPolicy"] == "ExitCode"
    pod = worker["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "tensorflow"
    assert container["image"] == IMAGE
    assert container["command"] == list(make_spec().command)
    assert container["resources"] == {
        "requests": {"cpu": "8", "memory": "32Gi"},
        "limits": {"nvidia.com/gpu": "1"},
    }
    assert {"name": "GPTPIPE_LOG_LEVEL", "value": "info"} in container["env"]
    assert not any(e["name"] == "TF_CONFIG" for e in container["env"])  # the operator's job
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    run_label = {"gptpipe.dev/run-id": "3f2a9c1e-5b7d-4e0a-9c1b-2d3e4f5a6b7c"}
    assert run_label.items() <= manifest["metadata"]["labels"].items()
    assert run_label.items() <= worker["template"]["metadata"]["labels"].items()
    assert worker["template"]["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    assert manifest["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "launcher-pod-abc",
            "uid": "0f1e2d3c-aaaa-bbbb-cccc-111122223333",
        }
    ]


def test_manifest_without_gpus_owner_or_deadline_leaves_them_out():
    manifest = tfjob_manifest.build_manifest(
        make_spec(gpus_per_worker=0, owner=None, active_deadline_seconds=None)
    )
    container = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert "limits" not in container["resources"]
    assert "ownerReferences" not in manifest["metadata"]
    assert "activeDeadlineSeconds" not in manifest["spec"]["runPolicy"]


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"clean_pod_policy": "All", "restart_policy": "OnFailure", "workers": 1},
        {
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}],
            "volume_mounts": [{"name": "shm", "mountPath": "/dev/shm"}],
            "service_account": "trainer",
        },
    ],
)
def test_manifest_validates_against_the_tfjob_v1_crd_schema(overrides):
    assert schema_errors(tfjob_manifest.build_manifest(make_spec(**overrides)), SCHEMA) == []


def test_schema_check_catches_run_policy_at_the_top_of_spec():
    """The last community launcher's mistake: the apiserver would prune these silently."""
    manifest = tfjob_manifest.build_manifest(make_spec())
    manifest["spec"]["ttlSecondsAfterFinished"] = 3600
    manifest["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = "2"
    errors = schema_errors(manifest, SCHEMA)
    assert ".spec.ttlSecondsAfterFinished: unknown field" in errors
    assert any(
        e.startswith(".spec.tfReplicaSpecs.Worker.replicas: expected integer") for e in errors
    )


def test_render_yaml_is_the_manifest():
    spec = make_spec()
    assert yaml.safe_load(tfjob_manifest.render_yaml(spec)) == tfjob_manifest.build_manifest(spec)


@pytest.mark.parametrize("image", ["gcr.io/p/trainer:latest", "gcr.io/p/trainer@sha256:abc", ""])
def test_unpinned_image_is_a_user_error(image):
    with pytest.raises(UserError, match="image"):
        tfjob_manifest.build_manifest(make_spec(image=image))


def test_unpinned_image_is_allowed_when_asked():
    manifest = tfjob_manifest.build_manifest(make_spec(image="trainer:dev", allow_unpinned=True))
    pod = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "trainer:dev"


@pytest.mark.parametrize(
    "overrides",
    [
        {"name": "Train_Run"},
        {"name": "x" * 53},
        {"workers": 0},
        {"restart_policy": "Always"},
        {"clean_pod_policy": "Sometimes"},
        {"cpu": "eight"},
        {"command": []},
        {"run_id": "not a label value"},
    ],
)
def test_bad_job_spec_is_a_user_error(overrides):
    with pytest.raises(UserError, match="JobSpec"):
        make_spec(**overrides)


# -- the job name --

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@pytest.mark.parametrize(
    "run_id",
    ["3f2a9c1e-5b7d-4e0a-9c1b-2d3e4f5a6b7c", "My Run #7 (retry)", "-" * 80, "A" * 200, ""],
)
def test_job_name_is_a_valid_deterministic_name(run_id):
    name = job_name(run_id, "train")
    assert name == job_name(run_id, "train")
    assert DNS1035.match(name) and len(name) <= 52  # room for "-worker-NNN" within 63
    assert name != job_name(run_id, "train-2")
    make_spec(name=name)  # JobSpec accepts it


def test_job_names_of_long_run_ids_that_share_a_prefix_differ():
    a, b = "r" * 100 + "a", "r" * 100 + "b"
    assert job_name(a, "train") != job_name(b, "train")


# -- the launcher against the Kubernetes API double --


def run_tfjob(kube: FakeKube, spec: JobSpec | None = None, **kwargs: Any) -> Any:
    out = io.StringIO()
    launcher = tfjob.TFJobLauncher(kube.api_client(), out=out, poll_seconds=5)
    try:
        return launcher.run(spec or make_spec(), **kwargs), out.getvalue()
    finally:
        kube.output = out.getvalue()  # for asserts after an exception


def test_success_reports_gpu_hours_digests_and_streams_worker0_log():
    with FakeKube(scenarios.success()) as kube:
        result, out = run_tfjob(kube)
    # 2 workers x 1 GPU x 1800 s (the operator's startTime to completionTime) / 3600
    assert result.gpu_hours == pytest.approx(1.0)
    assert result.wall_seconds == pytest.approx(1800)
    assert (result.attempts, result.restarts, result.reattached) == (1, 0, False)
    assert result.image_digests == {
        "train-run-1-worker-0": IMAGE_DIGEST,
        "train-run-1-worker-1": IMAGE_DIGEST,
    }
    assert "[train-run-1-worker-0] step 2 loss 3.1" in out
    (post,) = kube.calls("POST")
    assert schema_errors(post.body, SCHEMA) == []
    assert not kube.calls("DELETE")  # a finished job is left to ttlSecondsAfterFinished


def test_failure_carries_reason_exit_code_and_last_log_lines():
    with FakeKube(scenarios.failure(index=1, code=1)) as kube, pytest.raises(LaunchError) as err:
        run_tfjob(kube)
    e = err.value
    assert e.reason == "TFJobFailed"
    assert (e.replica, e.exit_code) == ("worker-1", 1)
    assert e.log_tail[-1] == "ValueError: bad shard"
    message = str(e)
    assert "has failed because 1 Worker replica(s) failed" in message
    assert "exit code: 1" in message and "ValueError: bad shard" in message
    assert not kube.calls("DELETE")


def test_restarting_then_success_succeeds_and_counts_the_restart():
    with FakeKube(scenarios.restart_then_success(index=1, code=137)) as kube:
        result, out = run_tfjob(kube)
    assert (result.attempts, result.restarts) == (2, 1)
    assert "Restarting: TFJobRestarting" in out


def test_restarts_past_backoff_limit_delete_the_job():
    """Under ExitCode the v1 operator ignores backoffLimit (kubeflow/trainer#2045)."""
    with FakeKube(scenarios.restart_then_success(times=3)) as kube:
        with pytest.raises(LaunchError) as err:
            run_tfjob(kube, make_spec(backoff_limit=1))
        assert err.value.reason == "BackoffLimitExceeded"
        assert kube.calls("DELETE", JOB_PATH)
        assert kube.cluster.tfjobs == {}


def test_permanent_exit_while_restarting_fails_and_deletes_the_job():
    """A job stuck in Restarting after a permanent exit code (kubeflow/trainer#2044)."""
    steps = [
        *scenarios.hang(),
        lambda c: c.log(1, "ValueError: bad shard"),
        lambda c: c.exit(1, 2),
        lambda c: c.condition("Restarting"),
    ]
    with FakeKube(steps) as kube:
        with pytest.raises(LaunchError) as err:
            run_tfjob(kube)
        assert (err.value.reason, err.value.replica, err.value.exit_code) == (
            "PermanentWorkerError",
            "worker-1",
            2,
        )
        assert "ValueError: bad shard" in str(err.value)
        assert kube.calls("DELETE", JOB_PATH)


def test_hang_times_out_and_deletes_the_job():
    with FakeKube(scenarios.hang()) as kube:
        with pytest.raises(LaunchTimeout, match="timeout"):
            run_tfjob(kube, timeout_seconds=1)
        (delete,) = kube.calls("DELETE", JOB_PATH)
        assert kube.cluster.tfjobs == {}
        assert "deleted TFJob ml/train-run-1 (LaunchTimeout)" in kube.output


def test_sigterm_deletes_the_job_and_fails():
    before = signal.getsignal(signal.SIGTERM)
    with FakeKube(scenarios.cancel()) as kube:
        with pytest.raises(LaunchCancelled, match="SIGTERM"):
            run_tfjob(kube)
        assert kube.calls("DELETE", JOB_PATH)
        assert kube.cluster.tfjobs == {}
    assert signal.getsignal(signal.SIGTERM) is before


def test_retried_launcher_reattaches_on_409_instead_of_creating_a_second_job():
    spec = make_spec()
    existing = tfjob_manifest.build_manifest(spec)
    with FakeKube(scenarios.success(), existing=existing) as kube:
        result = tfjob.TFJobLauncher(kube.api_client(), out=io.StringIO()).run(spec)
        assert result.reattached
        assert result.gpu_hours == pytest.approx(1.0)
        (post,) = kube.calls("POST")
        assert len(kube.cluster.tfjobs) == 1


def test_an_existing_job_of_another_run_is_not_adopted():
    existing = tfjob_manifest.build_manifest(make_spec(run_id="some-other-run"))
    with FakeKube(scenarios.hang(), existing=existing) as kube, pytest.raises(UserError):
        run_tfjob(kube)
    assert not kube.calls("DELETE")
