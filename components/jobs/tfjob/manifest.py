"""The TFJob manifest for a `JobSpec`: pure, no API calls (`gptpipe tfjob-manifest` prints it).

Replica layout: Worker replicas only, no Chief. Under MultiWorkerMirroredStrategy every worker
is the same program with the same resources, and TensorFlow makes worker 0 the chief when
TF_CONFIG has no "chief" task. With Worker replicas only, the operator writes TF_CONFIG as
{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": i}, "environment": "cloud"}
(exactly what the local launcher writes), labels worker 0 `job-role: master`, and marks the job
Succeeded when worker 0 exits 0 (the default success policy). A Chief replica would need its own
replica spec with the same resources and would put a "chief" task in TF_CONFIG for nothing.

A worker that stops on a mistake in its input says which in its termination message: the
container's `terminationMessagePath` is set, and the trainer finds it in `WORKER_MESSAGE_ENV`
(contracts/termination.py); the launcher reads it back from the pod's status.

The operator injects TF_CONFIG only into the container named `tensorflow`, and sets none when the
job has one replica in all; the trainer must treat a missing TF_CONFIG as single-worker.

Every worker pod meets the "restricted" Pod Security Standard (runs as the image's uid 1000,
no privilege escalation, no capabilities, the runtime's seccomp profile), so the job runs in a
namespace that enforces it; CPU and memory are requests and limits alike (a guaranteed pod,
and a ResourceQuota that counts limits can admit it); /dev/shm is a memory-backed emptyDir.

When the trainer's command serves Prometheus metrics (`--metrics-port N`, which the train
executor adds for TFJobs), the container exposes that port as `metrics` and every worker pod
carries the `prometheus.io/scrape`, `/port` and `/path` annotations that annotation-based scrape
configs look for; deploy/podmonitor.yaml is the Prometheus Operator's way (docs/monitoring.md).
Only the chief (worker 0) serves, but a TFJob's workers share one pod template.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from components.jobs import pods

# Re-exported: the run's jobs are found by these labels (cleanup.py, pipelines/runners/kfp).
from components.jobs.naming import LABEL_MANAGED_BY as LABEL_MANAGED_BY
from components.jobs.naming import LABEL_RUN_ID as LABEL_RUN_ID
from components.jobs.spec import METRICS_FLAG, JobSpec
from contracts.termination import TERMINATION_MESSAGE_PATH, WORKER_MESSAGE_ENV

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1", "tfjobs", "TFJob"
CONTAINER = "tensorflow"  # the only container the operator injects TF_CONFIG into
REPLICA = "Worker"
LABEL_JOB_NAME = "training.kubeflow.org/job-name"  # set by the operator on every pod
LABEL_REPLICA_TYPE = "training.kubeflow.org/replica-type"  # "worker"
LABEL_REPLICA_INDEX = "training.kubeflow.org/replica-index"  # "0", "1", ...
TRAINER_UID = pods.IMAGE_UID
SHM_VOLUME = "dshm"  # the memory-backed emptyDir mounted at /dev/shm
METRICS_PORT_NAME = "metrics"  # the container port's name, which deploy/podmonitor.yaml scrapes
METRICS_PATH = "/metrics"


def worker0_selector(job_name: str) -> str:
    """The label selector of worker 0's pods (each incarnation) of TFJob `job_name`."""
    return f"{LABEL_JOB_NAME}={job_name},{LABEL_REPLICA_TYPE}=worker,{LABEL_REPLICA_INDEX}=0"


def metrics_port(command: Sequence[str]) -> int | None:
    """The port a trainer command serves Prometheus metrics on (`--metrics-port N`), or None."""
    args = list(command)
    for i, arg in enumerate(args):
        value = args[i + 1] if arg == METRICS_FLAG and i + 1 < len(args) else None
        if arg.startswith(METRICS_FLAG + "="):
            value = arg.split("=", 1)[1]
        if value is not None and value.isdigit() and int(value) > 0:
            return int(value)
    return None


def _scrape_annotations(port: int) -> dict[str, str]:
    """Annotation-based Prometheus discovery (the `kubernetes-pods` job of many setups)."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": METRICS_PATH,
    }


def _labels(spec: JobSpec) -> dict[str, str]:
    return pods.job_labels(spec.run_id, spec.labels)


def _container(spec: JobSpec) -> dict[str, Any]:
    # Unbuffered output so that worker 0's log streams into the step log as it is written.
    env = {"PYTHONUNBUFFERED": "1", **spec.env, WORKER_MESSAGE_ENV: TERMINATION_MESSAGE_PATH}
    limits = {"cpu": spec.cpu, "memory": spec.memory}
    if spec.gpus_per_worker:
        # Extended resources go in limits; Kubernetes sets the request equal to the limit.
        limits["nvidia.com/gpu"] = str(spec.gpus_per_worker)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "command": list(spec.command),
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "resources": {"requests": {"cpu": spec.cpu, "memory": spec.memory}, "limits": limits},
        # Said although both are Kubernetes' defaults: the trainer writes to this path, and only
        # the file, never the log, may be read as its termination message.
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "File",
        "securityContext": pods.container_security(),
    }
    port = metrics_port(spec.command)
    if port is not None:
        container["ports"] = [{"name": METRICS_PORT_NAME, "containerPort": port, "protocol": "TCP"}]
    mounts = [dict(m) for m in spec.volume_mounts]
    if spec.shm_size:
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    if mounts:
        container["volumeMounts"] = mounts
    return container


def _pod_template(spec: JobSpec) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "containers": [_container(spec)],
        # The trainer never calls the Kubernetes API, and the step's service account holds the
        # launcher's Role: no token in the workers (Workload Identity, IRSA and Azure WI get
        # cloud credentials from the metadata server or their own projected token instead).
        "automountServiceAccountToken": False,
        "securityContext": pods.pod_security(),
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.tolerations]
    volumes = [dict(v) for v in spec.volumes]
    if spec.shm_size:
        shm = {"medium": "Memory", "sizeLimit": spec.shm_size}
        volumes.append({"name": SHM_VOLUME, "emptyDir": shm})
    if volumes:
        pod_spec["volumes"] = volumes
    if spec.service_account:
        pod_spec["serviceAccountName"] = spec.service_account
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in spec.image_pull_secrets]
    metadata: dict[str, Any] = {"labels": _labels(spec)}
    port = metrics_port(spec.command)
    annotations = {**spec.pod_annotations, **(_scrape_annotations(port) if port else {})}
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": pod_spec}


def operator_backoff_limit(spec: JobSpec) -> int | None:
    """The TFJob's runPolicy.backoffLimit for `spec`: None (left out) unless the operator is
    the only one that can count the restarts.

    In Training Operator v1.9 (pkg/controller.v1/common/job.go `ReconcileJobs`) a set limit
    fails the job, deleting every pod, when
    - `previousRetry + 1 > backoffLimit` at a new failed pod, where previousRetry is the TFJob
      reconciler's work queue's `NumRequeues`, always 0 (tensorflow/tfjob_controller.go
      `NewReconciler` gives it a `util.FakeWorkQueue`, pkg/common/util/fake_workqueue.go): so
      only a limit of 0, at the first failed pod of any exit code, before the exit code, the
      termination message and the log are read; or
    - the `restartCount`s of the Running pods add up to the limit (pkg/core/job.go
      `PastBackoffLimit`): in-place restarts only, which `ExitCode` pods (restartPolicy Never)
      never have.
    Under ExitCode the launcher's ledger counts restarts of the worker group (backoff.py), and
    the operator's limit could only take a limit of 0's evidence away, so it is left out; under
    Never nothing restarts. Under OnFailure the kubelet restarts containers in place, which
    only the operator counts, one per container: `workers` per restart of the group, so the
    job fails once the group restarted more than `backoff_limit` times.
    """
    if spec.restart_policy != "OnFailure":
        return None
    return spec.workers * (spec.backoff_limit + 1)


def _run_policy(spec: JobSpec) -> dict[str, Any]:
    policy: dict[str, Any] = {"cleanPodPolicy": spec.clean_pod_policy}
    limit = operator_backoff_limit(spec)
    if limit is not None:
        policy["backoffLimit"] = limit
    if spec.active_deadline_seconds is not None:
        policy["activeDeadlineSeconds"] = spec.active_deadline_seconds
    if spec.ttl_seconds_after_finished is not None:
        policy["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    return policy


def build_manifest(spec: JobSpec) -> dict[str, Any]:
    """The kubeflow.org/v1 TFJob for `spec`, as the JSON the apiserver takes.

    Raises `UserError` if the image is not pinned by digest (unless `spec.allow_unpinned`): a
    tag can move between a worker's first start and its restart, and the run's lineage must name
    the bytes that trained the model.
    """
    pods.check_pinned("JobSpec", spec.image, spec.allow_unpinned)
    metadata: dict[str, Any] = {
        "name": spec.name,
        "namespace": spec.namespace,
        "labels": _labels(spec),
    }
    if spec.owner is not None:
        # No blockOwnerDeletion: it needs update rights on pods/finalizers the launcher lacks.
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": spec.owner.name, "uid": spec.owner.uid}
        ]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "runPolicy": _run_policy(spec),
            "tfReplicaSpecs": {
                REPLICA: {
                    "replicas": spec.workers,
                    "restartPolicy": spec.restart_policy,
                    "template": _pod_template(spec),
                }
            },
        },
    }


def render_yaml(spec: JobSpec) -> str:
    """The TFJob manifest as YAML, for `gptpipe tfjob-manifest` and `kubectl apply -f -`."""
    return yaml.safe_dump(build_manifest(spec), sort_keys=False, default_flow_style=False)
