"""What a training job is: `JobSpec` (and `OwnerPod`), as both launchers understand it, and
its checks, which refuse a job Kubernetes or the operator would refuse, before anything starts.

Restart semantics (the operator's `restartPolicy: ExitCode`): a worker exit code of 1-127 is a
permanent error; 128-255 (a signal: 137 = SIGKILL/OOM, 143 = SIGTERM/preemption) is retryable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from components.jobs.naming import MAX_JOB_NAME
from contracts.errors import UserError
from contracts.k8s_values import (
    DNS1035_LABEL,
    DNS1123_LABEL,
    LABEL_VALUE,
    QUANTITY,
    TOLERATION_FIELDS,
    is_object_name,
)

RESTART_POLICIES = ("ExitCode", "OnFailure", "Never")  # the operator's; "Always" suits no training
CLEAN_POD_POLICIES = ("Running", "All", "None")  # the operator's runPolicy.cleanPodPolicy values
METRICS_FLAG = "--metrics-port"  # the trainer's flag (trainer/task.py) for its /metrics port
METRICS_PORT = 9090  # the port TFJob trainers serve /metrics on (prometheus-client's server)


def is_retryable_exit_code(code: int) -> bool:
    """True for exit codes the operator's ExitCode policy restarts (128-255: killed by a signal;
    kubeflow/training-operator pkg/util/train/train_util.go `IsRetryableExitCode`, as
    pkg/controller.v1/common/pod.go `ReconcilePods` applies it). The trainer exits 2 and 3 on
    what no restart can mend (contracts/termination.py)."""
    return code >= 128


@dataclass(frozen=True)
class OwnerPod:
    """The pod that runs the launcher; a TFJob it owns is garbage-collected with it."""

    name: str  # metadata.name of the launcher's pod (the downward API's metadata.name)
    uid: str  # metadata.uid of the launcher's pod (the downward API's metadata.uid)


@dataclass(frozen=True)
class JobSpec:
    """One distributed training job, as both launchers understand it."""

    name: str  # job name: TFJob metadata.name and the local log folder; see job_name
    command: Sequence[str]  # program every worker runs, e.g. ("python", "-m", "trainer.task", ...)
    image: str = ""  # container image by digest (`repo@sha256:<hex>`); unused by the local launcher
    namespace: str = "kubeflow"  # namespace of the TFJob (KFP's; in a pod, the launcher's own)
    run_id: str = ""  # pipeline run id, set as the label `gptpipe.dev/run-id` on the job and pods
    workers: int = 1  # MultiWorkerMirroredStrategy workers (TFJob Worker replicas); 0 is the chief
    gpus_per_worker: int = 0  # `nvidia.com/gpu` limit of each worker
    cpu: str = "4"  # CPU of each worker, request and limit (a Kubernetes quantity)
    memory: str = "16Gi"  # memory of each worker, request and limit (a Kubernetes quantity)
    # Size of each worker's memory-backed /dev/shm (NCCL and tf.data use shared memory; the
    # container runtime's default is 64Mi); it counts against `memory`. "": no such volume.
    shm_size: str = "2Gi"
    node_selector: Mapping[str, str] = field(default_factory=dict)  # pod nodeSelector
    tolerations: Sequence[Mapping[str, Any]] = ()  # pod tolerations, as Kubernetes JSON
    restart_policy: str = "ExitCode"  # one of RESTART_POLICIES
    backoff_limit: int = 3  # restarts of the worker group allowed before the job fails
    active_deadline_seconds: int | None = None  # job fails after this long; None: no limit
    ttl_seconds_after_finished: int | None = 86400  # operator deletes the finished TFJob after this
    clean_pod_policy: str = "Running"  # one of CLEAN_POD_POLICIES: pods deleted when the job ends
    labels: Mapping[str, str] = field(default_factory=dict)  # extra labels on the job and pods
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment of every worker
    owner: OwnerPod | None = None  # the launcher's own pod, made owner of the TFJob
    volumes: Sequence[Mapping[str, Any]] = ()  # pod volumes, as Kubernetes JSON
    volume_mounts: Sequence[Mapping[str, Any]] = ()  # mounts in the `tensorflow` container
    service_account: str | None = None  # pod serviceAccountName (e.g. for Workload Identity)
    image_pull_secrets: Sequence[str] = ()  # names of Secrets the workers pull the image with
    pod_annotations: Mapping[str, str] = field(
        # Kubeflow profiles inject Istio sidecars, which keep TFJob pods from ever completing.
        default_factory=lambda: {"sidecar.istio.io/inject": "false"}
    )  # annotations on every worker pod
    allow_unpinned: bool = False  # accept an image by tag (never for pipeline runs)

    def __post_init__(self) -> None:
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "tolerations", tuple(self.tolerations))
        object.__setattr__(self, "volumes", tuple(self.volumes))
        object.__setattr__(self, "volume_mounts", tuple(self.volume_mounts))
        object.__setattr__(self, "image_pull_secrets", tuple(self.image_pull_secrets))
        _validate(self)


def _validate(spec: JobSpec) -> None:
    def bad(what: str, fix: str) -> UserError:
        return UserError(f"JobSpec {what}: {fix}")

    check_pod_fields(spec, bad)
    if spec.workers < 1:
        raise bad(f"workers={spec.workers}", "use at least 1")
    if spec.gpus_per_worker < 0:
        raise bad(f"gpus_per_worker={spec.gpus_per_worker}", "use 0 or more")
    if spec.shm_size and not QUANTITY.match(spec.shm_size):
        raise bad(f"shm_size={spec.shm_size!r} is not a Kubernetes quantity", "use e.g. '2Gi'")
    if spec.restart_policy not in RESTART_POLICIES:
        raise bad(f"restart_policy={spec.restart_policy!r}", f"use one of {RESTART_POLICIES}")
    if spec.clean_pod_policy not in CLEAN_POD_POLICIES:
        raise bad(f"clean_pod_policy={spec.clean_pod_policy!r}", f"use one of {CLEAN_POD_POLICIES}")
    if spec.backoff_limit < 0:
        raise bad(f"backoff_limit={spec.backoff_limit}", "use 0 or more")


def check_pod_fields(spec: Any, bad: Callable[[str, str], UserError]) -> None:
    """The checks of the fields every job spec shares (`JobSpec`, components/jobs/indexed
    `IndexedJobSpec`): its name, namespace, command, resources, placement, deadlines, labels
    and owner; `bad(what, fix)` makes the error, named after the spec's class."""
    if len(spec.name) > MAX_JOB_NAME or not DNS1035_LABEL.match(spec.name):
        raise bad(
            f"name {spec.name!r} is invalid",
            f"use at most {MAX_JOB_NAME} lowercase letters, digits and '-', starting with a "
            "letter (naming.job_name builds one)",
        )
    if not DNS1123_LABEL.match(spec.namespace) or len(spec.namespace) > 63:
        raise bad(f"namespace {spec.namespace!r} is invalid", "use a DNS-1123 label")
    if not spec.command or not all(isinstance(a, str) and a for a in spec.command):
        raise bad("command is empty or has a non-string", "give a list of non-empty strings")
    for key, value in (("cpu", spec.cpu), ("memory", spec.memory)):
        if not QUANTITY.match(value):
            raise bad(f"{key}={value!r} is not a Kubernetes quantity", "use e.g. '4', '8Gi'")
    for name in (spec.service_account or "", *spec.image_pull_secrets):
        if name and not is_object_name(name):
            raise bad(f"name {name!r} is not a Kubernetes object name", "use a DNS-1123 subdomain")
    for key in ("active_deadline_seconds", "ttl_seconds_after_finished"):
        value = getattr(spec, key)
        if value is not None and value < (1 if key == "active_deadline_seconds" else 0):
            raise bad(f"{key}={value}", "use a positive number of seconds, or None")
    for key, value in {**spec.labels, "run_id": spec.run_id}.items():
        if len(value) > 63 or not LABEL_VALUE.match(value):
            raise bad(f"label {key}={value!r} is invalid", "use <= 63 of [A-Za-z0-9-_.]")
    selector = spec.node_selector
    if not isinstance(selector, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
    ):
        raise bad(f"node_selector {selector!r}", 'use an object of strings, {"pool": "gpu"}')
    for toleration in spec.tolerations:  # Kubernetes' Toleration: key, operator, value, ...
        if not isinstance(toleration, Mapping) or not set(toleration) <= TOLERATION_FIELDS:
            raise bad(
                f"toleration {toleration!r}",
                f"use objects with the fields {', '.join(sorted(TOLERATION_FIELDS))}",
            )
    if spec.owner is not None and not (spec.owner.name and spec.owner.uid):
        raise bad("owner has an empty name or uid", "pass the pod's metadata.name and metadata.uid")
