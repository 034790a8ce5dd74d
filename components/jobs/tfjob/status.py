"""What a TFJob's status, pods and events say: its phase, which worker failed and how, the error.

Pure functions and a small state object over the JSON the apiserver returns; the launcher's
steps do the reading (api.py). The messages matched here are the Training Operator v1.9's
(pkg/controller.v1/common/job.go): its Failed conditions for a past deadline or backoff limit
have the same reason, TFJobFailed, as a failed worker's.

Why a worker failed outlives its pod only in the operator's events: under `restartPolicy:
ExitCode` the operator deletes a failed pod in the same reconcile that marks the job
Restarting, and past a deadline or backoff limit it deletes them all, so a listing of the pods
seldom shows the exit. Each reconcile that finds a pod's `tensorflow` container terminated
records an `ExitedWithCode` event on the TFJob (common/pod.go `ReconcilePods`: "Pod:
<namespace>.<pod> exited with code <n>"). Events are best effort: client-go drops some under
its spam filter, and after 10 distinct messages of one reason in 10 minutes it replaces them
with one "(combined from similar events): " message (tools/record/events_cache.go), so these
are read as a supplement to what the pod listings showed, never as the only record.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from components.jobs.errors import (
    LaunchError,
    LaunchTimeout,
    format_failure,
    told,
    told_error,
)
from components.jobs.spec import JobSpec
from components.jobs.tfjob.manifest import CONTAINER, LABEL_REPLICA_INDEX, LABEL_REPLICA_TYPE
from components.jobs.tfjob.restarts import RestartLedger
from components.jobs.tfjob.start import StartWatch
from contracts.termination import TerminationMessage, parse

DEADLINE_MESSAGE = "active longer than specified deadline"  # runPolicy.activeDeadlineSeconds
BACKOFF_MESSAGE = "reached the specified backoff limit"  # runPolicy.backoffLimit
EXITED_REASON = "ExitedWithCode"  # common/pod.go exitedWithCodeReason
_EXITED = re.compile(r"Pod: (?P<namespace>[^.\s]+)\.(?P<pod>\S+) exited with code (?P<code>-?\d+)")
# The operator names a replica's pod `<job>-<replica type>-<index>` (common/util.go GenGeneralName).
_REPLICA_SUFFIX = re.compile(r"-(?P<type>[a-z]+)-(?P<index>\d+)$")
# What a signal's exit code usually means for a worker; the kubelet's reason, when a pod listing
# showed it (OOMKilled, Error), is more exact and is shown instead.
SIGNAL_MEANING = {
    137: "SIGKILL: out of memory, or the node evicted it",
    # the trainer exits 143 itself, to be retried, on a lost peer or a failed export
    143: "SIGTERM or the trainer's retry: preempted, lost a peer worker, or an export failed",
}


def replica(pod: Mapping[str, Any]) -> str:
    """The pod's replica as people name it, e.g. "worker-1"."""
    labels = pod["metadata"].get("labels") or {}
    return f"{labels.get(LABEL_REPLICA_TYPE, 'worker')}-{labels.get(LABEL_REPLICA_INDEX, '?')}"


def _failed_state(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The `tensorflow` container's `terminated` state if it ended with a non-zero code."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            terminated = (status.get("state") or {}).get("terminated")
            if terminated and terminated.get("exitCode"):
                return dict(terminated)
    return None


def said_why(pod: Mapping[str, Any]) -> bool:
    """True if the pod's `tensorflow` container exited 2 or 3 with its termination record
    saying why (components/jobs/errors.py `told`)."""
    ended = terminated_exit(pod)
    return ended is not None and told(ended[0], worker_said(pod))


def terminated_exit(pod: Mapping[str, Any]) -> tuple[int, str] | None:
    """(exit code, reason) of the `tensorflow` container if it ended with a non-zero code."""
    terminated = _failed_state(pod)
    return (int(terminated["exitCode"]), terminated.get("reason") or "") if terminated else None


def worker_said(pod: Mapping[str, Any]) -> TerminationMessage | None:
    """The record the `tensorflow` container left in its termination message, which the kubelet
    copies from the file into `state.terminated.message` (or, once the container was restarted
    in place, `lastState.terminated.message`); None if it left none of ours."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") != CONTAINER:
            continue
        for state in ("state", "lastState"):
            terminated = (status.get(state) or {}).get("terminated")
            if terminated:
                return parse(str(terminated.get("message") or ""))
    return None


@dataclass(frozen=True)
class WorkerExit:
    """A worker's container ended with a non-zero code: `reason` is the kubelet's, if a pod
    listing showed it; `at` is when, to the second (RFC 3339, UTC), if known."""

    replica: str  # e.g. "worker-1"
    code: int
    reason: str = ""
    at: str = ""

    def describe(self) -> str:
        why = self.reason if self.reason not in ("", "Error") else SIGNAL_MEANING.get(self.code, "")
        return (
            f"{self.replica} exited with code {self.code}"
            + (f" ({why})" if why else "")
            + (f" at {self.at}" if self.at else "")
        )


def utc_stamp(value: object) -> str:
    """An apiserver time ("...Z", or "+00:00" as the client serialises it) as "...Z", to the
    second, so that stamps from pods and events compare as strings; "" if it is none."""
    try:
        when = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        if when.tzinfo is None:
            return ""
        return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError):  # not a time, or one at the calendar's edge
        return ""


def pod_exit(pod: Mapping[str, Any]) -> WorkerExit | None:
    """The pod's failed exit as a `WorkerExit`, None if its container did not fail."""
    terminated = _failed_state(pod)
    if terminated is None:
        return None
    code, reason = int(terminated["exitCode"]), terminated.get("reason") or ""
    return WorkerExit(replica(pod), code, reason, utc_stamp(terminated.get("finishedAt")))


def event_exits(events: Iterable[Mapping[str, Any]], job_name: str) -> list[WorkerExit]:
    """The failed exits the operator's ExitedWithCode events on job `job_name` record, each
    (replica, code) once, at its latest recorded time. Exit code 0 is left out."""
    found = []
    for event in events:
        if event.get("reason") != EXITED_REASON:
            continue
        match = _EXITED.search(event.get("message") or "")
        if not match or int(match["code"]) == 0:
            continue
        pod = match["pod"]
        suffix = _REPLICA_SUFFIX.search(pod)
        if not suffix or pod[: suffix.start()] != job_name:
            continue
        when = event.get("lastTimestamp") or event.get("eventTime") or ""
        worker = f"{suffix['type']}-{suffix['index']}"
        found.append(WorkerExit(worker, int(match["code"]), at=utc_stamp(when)))
    return _ordered(found)


def merge_exits(seen: Iterable[WorkerExit], recorded: Iterable[WorkerExit]) -> list[WorkerExit]:
    """The exits the launcher saw in pod listings and those the operator's events recorded."""
    return _ordered([*seen, *recorded])


def _ordered(exits: Iterable[WorkerExit]) -> list[WorkerExit]:
    """Each (replica, code) once, with its latest time and any reason; the likely cause first.

    That is the newest exit other than 143, since under MultiWorkerMirroredStrategy the other
    workers exit 143 once they lose the one that failed (docs/training.md); then the rest,
    newest first.
    """
    kept: dict[tuple[str, int], WorkerExit] = {}
    for e in exits:
        old = kept.get((e.replica, e.code))
        if old is not None:
            e = WorkerExit(e.replica, e.code, old.reason or e.reason, max(old.at, e.at))
        kept[(e.replica, e.code)] = e
    newest = sorted(kept.values(), key=lambda e: e.at, reverse=True)
    return sorted(newest, key=lambda e: e.code == 143)


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
        self.unrecorded = False  # the ledger's last change is not on the job yet (a failed patch)
        self.digests: dict[str, str] = {}  # pod name -> the image digest its kubelet reports
        self.exits: set[WorkerExit] = set()  # failed exits seen in pod listings
        self.events_failures: set[str] = set()  # how listing the job's events failed (said once)
        self.starts = StartWatch()  # workers the kubelet cannot start, or no node takes

    def saw_exit(self, pod: Mapping[str, Any]) -> None:
        """Keep the pod's failed exit, if it has one (`merge_exits` orders them)."""
        if (ended := pod_exit(pod)) is not None:
            self.exits.add(ended)

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
    cause: WorkerExit | None = None,
) -> LaunchError:
    """The error for a Failed job: the operator's reason, the failing worker, its log.

    A past deadline is a `LaunchTimeout` (reason DeadlineExceeded: the operator deleted the
    pods), a past backoff limit has reason BackoffLimitExceeded, as the local launcher says.
    Without a failed pod (the operator deleted them), `cause` names the worker, if known, and
    `tail` is worker 0's.
    """
    name: str | None = None
    exit_code: int | None = None
    tail_of = None
    if failed_pod is not None and (ended := terminated_exit(failed_pod)):
        name, exit_code = replica(failed_pod), ended[0]
    elif cause is not None:
        name, exit_code, tail_of = cause.replica, cause.code, "worker-0"
    job = f"TFJob {spec.namespace}/{spec.name}"
    said = worker_said(failed_pod) if failed_pod is not None else None
    if told := told_error(spec, job, name, exit_code, said, tail):
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
        format_failure(head, name, exit_code, tail, tail_of=tail_of),
        reason=reason,
        job_name=spec.name,
        replica=name,
        exit_code=exit_code,
        log_tail=tail,
    )


def past_deadline_error(spec: JobSpec, failed: Mapping[str, Any]) -> LaunchTimeout | None:
    """For a retried launcher that finds its job Failed (condition `failed`): the error if it
    ran past its deadline, which bounds the job across the step's retries (KFP 2.14+ honours
    them), not each one: such a job is not run again with a fresh deadline. Else None."""
    message = failed.get("message", "")
    if DEADLINE_MESSAGE not in message:
        return None
    return LaunchTimeout(
        f"TFJob {spec.namespace}/{spec.name} ran past its deadline in an earlier attempt "
        f"({message}); not running it again: raise deadline_seconds, or start a new run",
        reason="DeadlineExceeded",
        job_name=spec.name,
    )


def permanent_error(
    spec: JobSpec, pod: Mapping[str, Any], code: int, why: str, tail: Sequence[str]
) -> LaunchError:
    """The error for a worker that exited with a permanent code while the job was Restarting."""
    job = f"TFJob {spec.namespace}/{spec.name}"
    if told := told_error(spec, job, replica(pod), code, worker_said(pod), tail):
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
