"""The TFJob manifest (schema, Pod Security, resources, identity), JobSpec checks, job names."""

from __future__ import annotations

import re

import pytest
import yaml

from components.jobs.naming import job_name, run_label
from components.jobs.spec import METRICS_PORT
from components.jobs.tfjob import manifest as tfjob_manifest
from contracts.errors import UserError
from tests.components.jobs.tfjob.specs import IMAGE, make_spec, worker_template
from tests.doubles.kubernetes.crd_schema import SCHEMA, schema_errors
from tests.doubles.kubernetes.pod_security import restricted_violations

# -- the manifest --


def test_manifest_has_the_operator_layout():
    manifest = tfjob_manifest.build_manifest(make_spec())
    assert manifest["apiVersion"] == "kubeflow.org/v1" and manifest["kind"] == "TFJob"
    spec = manifest["spec"]
    assert set(spec) == {"runPolicy", "tfReplicaSpecs"}  # nothing of runPolicy at spec's top
    assert spec["runPolicy"] == {  # no backoffLimit: the launcher counts (backoff.py)
        "cleanPodPolicy": "Running",
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
        "limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},  # a Guaranteed pod
    }
    assert pod["serviceAccountName"] == "trainer"
    assert pod["imagePullSecrets"] == [{"name": "registry-pull"}]
    assert pod["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}
    ]
    assert container["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert pod["securityContext"]["runAsUser"] == 1000  # images/Dockerfile's USER
    assert {"name": "GPTPIPE_LOG_LEVEL", "value": "info"} in container["env"]
    assert not any(e["name"] == "TF_CONFIG" for e in container["env"])  # the operator's job
    # Where the trainer writes why it stopped, and only that file is its termination message.
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "File"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["GPTPIPE_TERMINATION_MESSAGE"] == container["terminationMessagePath"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    label = {"gptpipe.dev/run-id": "3f2a9c1e-5b7d-4e0a-9c1b-2d3e4f5a6b7c"}
    assert label.items() <= manifest["metadata"]["labels"].items()
    assert label.items() <= worker["template"]["metadata"]["labels"].items()
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
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert "ownerReferences" not in manifest["metadata"]
    assert "activeDeadlineSeconds" not in manifest["spec"]["runPolicy"]


def test_manifest_without_shm_service_account_or_pull_secrets_leaves_them_out():
    manifest = tfjob_manifest.build_manifest(
        make_spec(shm_size="", service_account=None, image_pull_secrets=())
    )
    pod = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    assert not {"volumes", "serviceAccountName", "imagePullSecrets"} & set(pod)
    assert "volumeMounts" not in pod["containers"][0]


def test_extra_volumes_keep_their_place_beside_dev_shm():
    extra = {"name": "data", "persistentVolumeClaim": {"claimName": "corpus"}}
    manifest = tfjob_manifest.build_manifest(
        make_spec(volumes=[extra], volume_mounts=[{"name": "data", "mountPath": "/data"}])
    )
    pod = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["data", "dshm"]
    assert [m["mountPath"] for m in pod["containers"][0]["volumeMounts"]] == ["/data", "/dev/shm"]


def test_a_trainer_serving_metrics_gets_a_named_port_and_scrape_annotations():
    command = [*make_spec().command, "--metrics-port", "9090"]
    manifest = tfjob_manifest.build_manifest(make_spec(command=command))
    template = worker_template(manifest)
    (container,) = template["spec"]["containers"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
    assert template["metadata"]["annotations"] == {
        "sidecar.istio.io/inject": "false",  # JobSpec's own annotations stay
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9090",
        "prometheus.io/path": "/metrics",
    }
    assert schema_errors(manifest, SCHEMA) == []
    assert restricted_violations(template["spec"], template["metadata"]["annotations"]) == []
    # No flag (or port 0): nothing to scrape, no port and no annotation.
    for quiet in (make_spec().command, [*make_spec().command, "--metrics-port=0"]):
        template = worker_template(tfjob_manifest.build_manifest(make_spec(command=quiet)))
        assert "ports" not in template["spec"]["containers"][0]
        assert not any(k.startswith("prometheus.io/") for k in template["metadata"]["annotations"])


def test_the_train_step_turns_metrics_on_for_tfjobs_only():
    from components.train.executor import job_spec
    from trainer.config import resolve_config

    cfg = resolve_config("tiny")
    tfjob = job_spec(
        "gs://b/ex", "gs://b/m", "gs://b/w", cfg, launcher="tfjob", run_id="r", image=IMAGE
    )
    assert tfjob_manifest.metrics_port(tfjob.command) == METRICS_PORT == 9090
    assert tfjob.command[-2:] == ("--metrics-port", "9090")
    local = job_spec("ex", "m", "w", cfg, launcher="local", run_id="r")
    assert tfjob_manifest.metrics_port(local.command) is None


def test_worker_pods_meet_the_restricted_pod_security_standard():
    template = worker_template(tfjob_manifest.build_manifest(make_spec()))
    assert restricted_violations(template["spec"], template["metadata"].get("annotations")) == []


@pytest.mark.parametrize(
    "change, check",
    [
        (lambda pod, c: c["securityContext"].pop("allowPrivilegeEscalation"), "allow_privilege"),
        (lambda pod, c: c["securityContext"]["capabilities"].update(drop=[]), "capabilities_r"),
        (lambda pod, c: c["securityContext"].update(privileged=True), "privileged"),
        (lambda pod, c: pod["securityContext"].pop("runAsNonRoot"), "run_as_non_root"),
        (lambda pod, c: pod["securityContext"].update(runAsUser=0), "run_as_user"),
        (lambda pod, c: pod["securityContext"].pop("seccompProfile"), "seccomp_restricted"),
        (lambda pod, c: pod.update(hostNetwork=True), "host_namespaces"),
        (lambda pod, c: pod["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "host_p"),
        (lambda pod, c: c.update(ports=[{"containerPort": 1, "hostPort": 80}]), "host_ports"),
    ],
)
def test_the_pod_security_check_catches_each_violation(change, check):
    pod = worker_template(tfjob_manifest.build_manifest(make_spec()))["spec"]
    change(pod, pod["containers"][0])
    violations = restricted_violations(pod)
    assert any(v.startswith(check) for v in violations), violations


@pytest.mark.parametrize(
    ("policy", "workers", "limit", "expected"),
    [
        ("ExitCode", 2, 0, None),  # 0 would delete every pod at the first failed one
        ("ExitCode", 2, 3, None),  # the operator never counts recreated pods
        ("Never", 2, 3, None),  # nothing restarts
        ("OnFailure", 1, 0, 1),  # in-place restarts: one per container, only the operator sees
        ("OnFailure", 4, 3, 16),  # the 4th restart of 4 containers is the 16th
    ],
)
def test_the_operators_backoff_limit_is_set_only_where_only_it_counts(
    policy, workers, limit, expected
):
    spec = make_spec(restart_policy=policy, workers=workers, backoff_limit=limit)
    run_policy = tfjob_manifest.build_manifest(spec)["spec"]["runPolicy"]
    assert run_policy.get("backoffLimit") == expected


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"clean_pod_policy": "All", "restart_policy": "OnFailure", "workers": 1},
        {"shm_size": "", "service_account": None, "image_pull_secrets": ()},
    ],
)
def test_manifest_validates_against_the_tfjob_v1_crd_schema(overrides):
    manifest = tfjob_manifest.build_manifest(make_spec(**overrides))
    assert schema_errors(manifest, SCHEMA) == []
    if not overrides:  # the fields this schema check is there for are all present
        pod = worker_template(manifest)["spec"]
        assert manifest["spec"]["runPolicy"]["activeDeadlineSeconds"] == 7200
        assert {"serviceAccountName", "imagePullSecrets", "volumes", "securityContext"} <= set(pod)
        assert set(pod["containers"][0]["resources"]) == {"requests", "limits"}
        assert {"terminationMessagePath", "terminationMessagePolicy"} <= set(pod["containers"][0])


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
        {"memory": "16 GB"},
        {"shm_size": "lots"},
        {"image_pull_secrets": ["Registry_Pull"]},
        {"service_account": "Trainer SA"},
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


def test_run_label_is_a_valid_label_value():
    assert (
        run_label("3f2a9c1e-5b7d-4e0a-9c1b-2d3e4f5a6b7c") == "3f2a9c1e-5b7d-4e0a-9c1b-2d3e4f5a6b7c"
    )
    assert run_label("Run 1/retry") == "Run-1-retry"
    assert run_label("é-" + "x" * 80) == "x" * 61
