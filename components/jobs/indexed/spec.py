"""What an indexed job is: `IndexedJobSpec`, as both indexed launchers understand it, checked
as `JobSpec` is (components/jobs/spec.py), before anything starts.

Semantics, Kubernetes' for a batch/v1 Job with `completionMode: Indexed` and
`backoffLimitPerIndex`: every index 0..completions-1 must succeed once, at most `parallelism`
run at a time. A part that fails is run again, up to `backoff_limit_per_index` times, then its
index is failed, and the job fails once every index has succeeded or failed. A part that exits
`INPUT_ERROR_EXIT` (contracts/termination.py: bad input, which no retry cures) fails the whole
job at once; a pod's disruption (preemption, eviction, a drained node) does not count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from components.jobs.spec import OwnerPod, check_pod_fields
from contracts.errors import UserError

INDEX_ENV = "JOB_COMPLETION_INDEX"  # the part's index, as Kubernetes sets it for Indexed Jobs
MAX_COMPLETIONS = 100_000  # Kubernetes' limit for completions with backoffLimitPerIndex


@dataclass(frozen=True)
class IndexedJobSpec:
    """One program run as `completions` indexed parts, as both indexed launchers understand it."""

    name: str  # the Job's metadata.name and the local log folder (naming.job_name builds one)
    command: Sequence[str]  # what every part runs; it reads its index from INDEX_ENV
    completions: int = 1  # parts: indexes 0..completions-1, each to succeed once
    parallelism: int = 1  # parts that run at once
    image: str = ""  # container image by digest (`repo@sha256:<hex>`); unused locally
    namespace: str = "kubeflow"  # namespace of the Job (in a pod, the launcher's own)
    run_id: str = ""  # pipeline run id, set as the label `gptpipe.dev/run-id` on job and pods
    cpu: str = "2"  # CPU of each part's pod, request and limit (a Kubernetes quantity)
    memory: str = "4Gi"  # memory of each part's pod, request and limit (a Kubernetes quantity)
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment of every part
    labels: Mapping[str, str] = field(default_factory=dict)  # extra labels on the job and pods
    owner: OwnerPod | None = None  # the launcher's own pod, made owner of the Job
    service_account: str | None = None  # pod serviceAccountName (e.g. for Workload Identity)
    image_pull_secrets: Sequence[str] = ()  # names of Secrets the pods pull the image with
    node_selector: Mapping[str, str] = field(default_factory=dict)  # pod nodeSelector
    tolerations: Sequence[Mapping[str, Any]] = ()  # pod tolerations, as Kubernetes JSON
    pod_annotations: Mapping[str, str] = field(
        # Kubeflow profiles inject Istio sidecars, which keep a Job's pods from ever completing.
        default_factory=lambda: {"sidecar.istio.io/inject": "false"}
    )  # annotations on every part's pod
    backoff_limit_per_index: int = 2  # runs of a failing index after its first, then it fails
    active_deadline_seconds: int | None = None  # the job fails after this long; None: no limit
    ttl_seconds_after_finished: int | None = 86400  # Kubernetes deletes the finished Job then
    allow_unpinned: bool = False  # accept an image by tag (never for pipeline runs)

    def __post_init__(self) -> None:
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "tolerations", tuple(self.tolerations))
        object.__setattr__(self, "image_pull_secrets", tuple(self.image_pull_secrets))
        _validate(self)


def _validate(spec: IndexedJobSpec) -> None:
    def bad(what: str, fix: str) -> UserError:
        return UserError(f"IndexedJobSpec {what}: {fix}")

    check_pod_fields(spec, bad)
    for key in ("completions", "parallelism"):
        value = getattr(spec, key)
        if not 1 <= value <= MAX_COMPLETIONS:
            raise bad(f"{key}={value}", f"use 1 to {MAX_COMPLETIONS}")
    if spec.backoff_limit_per_index < 0:
        raise bad(f"backoff_limit_per_index={spec.backoff_limit_per_index}", "use 0 or more")
