"""What a TFJob's status and pods say: its phase, which worker failed and how, and the error.

Pure functions and a small state object over the JSON the apiserver returns; `tfjob.py` does
the reading. The messages matched here are the Training Operator v1.9's
(pkg/controller.v1/common/job.go): its Failed conditions for a past deadline or backoff limit
have the same reason, TFJobFailed, as a failed worker's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from components.train.launcher import (
    JobSpec,
    LaunchError,
    LaunchTimeout,
    format_failure,
    input_error,
)
from components.train.tfjob_manifest import CONTAINER, LABEL_REPLICA_INDEX, LABEL_REPLICA_TYPE
from components.train.tfjob_restarts import RestartLedger

DEADLINE_MESSAGE = "active longer than specified deadline"  # runPolicy.activeDeadlineSeconds
BACKOFF_MESSAGE = "reached the specified backoff limit"  # runPolicy.backoffLimit


def replica(pod: Mapping[str, Any]) -> str:
    """The pod's replica as people name it, e.g. "worker-1"."""
    labels = pod["metadata"].get("labels") or {}
    return f"{labels.get(LABEL_REPLICA_TYPE, 'worker')}-{labels.get(LABEL_REPLICA_INDEX, '?')}"


def terminated_exit(pod: Mapping[str, Any]) -> tuple[int, str] | None:
    """(exit code, reason) of the `tensorflow` container if it ended with a non-zero code."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            terminated = (status.get("state") or {}).get("terminated")
            if terminated and terminated.get("exitCode"):
                return int(terminated["exitCode"]), terminated.get("reason") or ""
    return None


def condition_true(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The job's condition of type `kind` if its status is "True"."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


class JobState:
    """What the watcher has learned: the job's conditions, its restarts, its pods' images."""

    def __init__(self, ledger: RestartLedger) -> None:
        self.phase = ""  # type of the newest condition whose status is "True"
        self.condition: Mapping[str, Any] = {}  # that condition
        self.seen: set[tuple[str, str, str]] = set()
        self.ledger = ledger
        self.digests: dict[str, str] = {}  # pod name -> the image digest its kubelet reports

    def update(self, job: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """Take the job's conditions in; return the conditions not seen before."""
        conditions = (job.get("status") or {}).get("conditions") or []
        new = []
        for cond in conditions:
            key = (cond.get("type", ""), cond.get("status", ""), cond.get("lastTransitionTime", ""))
            if key not in self.seen:
                self.seen.add(key)
                new.append(cond)
        # The operator appends the newest condition last and flips earlier ones to "False".
        current = [c for c in conditions if c.get("status") == "True"]
        if current:
            self.condition = current[-1]
            self.phase = self.condition.get("type", "")
        return new

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def failure_error(
    spec: JobSpec,
    condition: Mapping[str, Any],
    failed_pod: Mapping[str, Any] | None,
    tail: Sequence[str],
) -> LaunchError:
    """The error for a Failed job: the operator's reason, the failing worker, its log.

    A past deadline is a `LaunchTimeout` (reason DeadlineExceeded: the operator deleted the
    pods), a past backoff limit has reason BackoffLimitExceeded, as the local launcher says.
    """
    name: str | None = None
    exit_code: int | None = None
    if failed_pod is not None and (ended := terminated_exit(failed_pod)):
        name, exit_code = replica(failed_pod), ended[0]
    if told := input_error(spec, f"TFJob {spec.namespace}/{spec.name}", name, exit_code, tail):
        return told
    reason = condition.get("reason", "Failed")
    message = condition.get("message", "")
    head = f"TFJob {spec.namespace}/{spec.name} failed: {reason}: {message}"
    error = LaunchError
    if DEADLINE_MESSAGE in message:
        error, reason = LaunchTimeout, "DeadlineExceeded"
    elif BACKOFF_MESSAGE in message:
        reason = "BackoffLimitExceeded"
    return error(
        format_failure(head, name, exit_code, tail),
        reason=reason,
        job_name=spec.name,
        replica=name,
        exit_code=exit_code,
        log_tail=tail,
    )


def permanent_error(
    spec: JobSpec, pod: Mapping[str, Any], code: int, why: str, tail: Sequence[str]
) -> LaunchError:
    """The error for a worker that exited with a permanent code while the job was Restarting."""
    job = f"TFJob {spec.namespace}/{spec.name}"
    if told := input_error(spec, job, replica(pod), code, tail):
        return told
    return LaunchError(
        format_failure(
            f"TFJob {spec.namespace}/{spec.name}: a worker exited with permanent code {code} "
            f"({why}) while the job was Restarting; deleted it",
            replica(pod),
            code,
            tail,
        ),
        reason="PermanentWorkerError",
        job_name=spec.name,
        replica=replica(pod),
        exit_code=code,
        log_tail=tail,
    )
