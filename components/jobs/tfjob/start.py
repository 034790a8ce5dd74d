"""Workers that do not start: a container the kubelet cannot create, a pod no node takes.

The Training Operator v1 judges a job by its pods' phases and exit codes, so a worker whose
image cannot be pulled, or whose container refers to a missing Secret, keeps the job Created
(or Running, with the other workers up) until `activeDeadlineSeconds`, 24 hours by default,
and the workers that did start, and every worker already placed on a node, hold their GPUs all
that time (kubeflow/trainer#2001, #1136). The launcher reads why from the pods it lists anyway:

- the kubelet's waiting reasons for a container it cannot create (pkg/kubelet/images/types.go:
  ErrImagePull, ImagePullBackOff, RegistryUnavailable, SignatureValidationFailed,
  InvalidImageName, ErrImageNeverPull, ImageInspectError; pkg/kubelet/kuberuntime/
  kuberuntime_container.go: CreateContainerConfigError, CreateContainerError). It retries
  them with a back-off from 10 s up to 5 minutes (kubelet.go MaxImageBackOff), a failing pull
  showing ErrImagePull at each try and ImagePullBackOff between them (images/image_manager.go
  pullImage), so a worker is timed by its pod, whatever the reason of the moment. A registry
  hiccup clears within that; a worker that cannot start for START_GRACE_SECONDS will not, and
  the launcher fails the job;
- the scheduler's `PodScheduled: False, reason Unschedulable` (pkg/scheduler/schedule_one.go
  `handleSchedulingFailure`), with why no node fits. That one can resolve (a node scaled up, a
  job ended), so the launcher only says it, once per pod.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from components.jobs.errors import LaunchError
from components.jobs.spec import JobSpec

# Waiting reasons of a container the kubelet cannot create, and what a user checks for each.
_IMAGE = (
    "check that the trainer image exists in its registry, and that the train step's pod has a "
    "pull secret for it (gptpipe compile --image-pull-secret: the workers take the step pod's "
    "imagePullSecrets)"
)
STUCK_REASONS = {
    "ErrImagePull": _IMAGE,
    "ImagePullBackOff": _IMAGE,
    "RegistryUnavailable": _IMAGE,
    "SignatureValidationFailed": _IMAGE,
    "InvalidImageName": _IMAGE,
    "ErrImageNeverPull": _IMAGE,
    "ImageInspectError": _IMAGE,
    "CreateContainerConfigError": (
        "a Secret or ConfigMap the worker refers to (its environment, its volumes) is missing "
        "from the namespace"
    ),
    "CreateContainerError": "the container runtime refused the worker's container",
}
UNSCHEDULABLE = "Unschedulable"
START_GRACE_SECONDS = 600.0  # a worker that cannot start for this long fails the job


class NotStarting(NamedTuple):
    """Why one pod's worker is not running yet."""

    uid: str  # the pod's: a recreated pod is a new worker
    replica: str  # "worker-1"
    reason: str  # the kubelet's waiting reason, or "Unschedulable"
    message: str  # what the kubelet or the scheduler said

    def describe(self) -> str:
        return f"{self.replica}: {self.reason}: {self.message}".rstrip(": ")


def not_starting(pod: Mapping[str, Any], replica: str) -> NotStarting | None:
    """Why `pod`'s worker does not start, if the kubelet or the scheduler says it cannot."""
    status = pod.get("status") or {}
    uid = str((pod.get("metadata") or {}).get("uid", ""))
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_REASONS:
            return NotStarting(uid, replica, waiting["reason"], waiting.get("message", ""))
    for condition in status.get("conditions") or []:
        if (condition.get("type"), condition.get("status")) == ("PodScheduled", "False") and (
            condition.get("reason") == UNSCHEDULABLE
        ):
            return NotStarting(uid, replica, UNSCHEDULABLE, condition.get("message", ""))
    return None


class StartWatch:
    """Since when each worker has not been starting (monotonic clock), by its pod and whether
    it cannot start or waits for a node: not by the reason of the moment, which alternates."""

    def __init__(self) -> None:
        self.since: dict[tuple[str, bool], tuple[NotStarting, float]] = {}
        self.said: set[tuple[str, bool]] = set()

    def observe(self, found: Iterable[NotStarting], now: float) -> list[str]:
        """Take the current listing's problems in; return the lines to say about new ones."""
        current = {(n.uid, n.reason == UNSCHEDULABLE): n for n in found}
        self.since = {
            key: (current[key], self.since[key][1] if key in self.since else now) for key in current
        }
        lines = []
        for key, problem in current.items():
            if key in self.said:
                continue
            self.said.add(key)
            if problem.reason == UNSCHEDULABLE:
                lines.append(
                    f"{problem.replica} is not scheduled: {problem.message} (it waits for a "
                    "node; the job's deadline, activeDeadlineSeconds, bounds the wait)"
                )
            else:
                lines.append(f"{problem.describe()} (failing the job if it lasts)")
        return lines

    def stuck(self, now: float, grace: float) -> tuple[NotStarting, float] | None:
        """The longest-waiting worker that cannot start (not a pending one) past `grace`."""
        waited = [
            (problem, now - since)
            for problem, since in self.since.values()
            if problem.reason != UNSCHEDULABLE and now - since >= grace
        ]
        return max(waited, key=lambda found: found[1]) if waited else None


def cannot_start_error(spec: JobSpec, problem: NotStarting, waited: float) -> LaunchError:
    """The error for a worker that has not been able to start for `waited` seconds."""
    took = f"{waited:.0f} s" if waited < 120 else f"{waited / 60:.0f} min"
    return LaunchError(
        f"TFJob {spec.namespace}/{spec.name}: {problem.replica} could not start for "
        f"{took} ({problem.reason}: {problem.message}); deleted it: "
        f"{STUCK_REASONS.get(problem.reason, '')}",
        reason="WorkerCannotStart",
        job_name=spec.name,
        replica=problem.replica,
    )
