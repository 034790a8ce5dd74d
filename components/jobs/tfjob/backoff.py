"""The launcher's restart step: count restarts of the worker group, keep the count on the job,
say each restart, and fail the job once it restarted more than `backoff_limit` times.

Under `restartPolicy: ExitCode` the v1 operator recreates pods forever and cannot count them
against runPolicy.backoffLimit (kubeflow/trainer#2045), so the limit is the launcher's to
enforce, and the manifest leaves the operator's out (manifest.py `operator_backoff_limit`). The
count is the ledger's (restarts.py); the exits that caused the restarts are named from the pod
listings and the operator's events (status.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from components.jobs.errors import LaunchError, format_failure
from components.jobs.spec import JobSpec
from components.jobs.tfjob.api import TFJobApi
from components.jobs.tfjob.status import JobState, WorkerExit


def take_restarts(
    api: TFJobApi, state: JobState, pods: Iterable[Mapping[str, Any]], job_uid: str
) -> None:
    """Take the job's current pods into the restart ledger; raise past the backoff limit."""
    spec, ledger = api.spec, state.ledger
    before = ledger.restarts
    state.unrecorded |= ledger.observe(pods)  # stays set if the patch raises
    if state.unrecorded:
        state.unrecorded = not api.record_restarts(ledger)
    restarted = ledger.restarts > before
    if not restarted and ledger.restarts <= spec.backoff_limit:
        return
    exits = api.exits(job_uid, state)
    if restarted:
        api.say(
            f"all {spec.workers} workers restarted: restart {ledger.restarts}"
            + (f"; worker exits so far: {_listed(exits)}" if exits else "")
        )
    if ledger.restarts > spec.backoff_limit:
        raise backoff_error(spec, ledger.restarts, exits)


def _listed(exits: list[WorkerExit]) -> str:
    return "; ".join(e.describe() for e in exits)


def backoff_error(spec: JobSpec, restarts: int, exits: list[WorkerExit]) -> LaunchError:
    """Restarts past `backoff_limit`: the error names the exits that caused them, if known."""
    head = (
        f"TFJob {spec.namespace}/{spec.name} restarted {restarts} times, "
        f"more than backoff_limit={spec.backoff_limit}; deleted it"
    )
    if exits:
        head += f"\nworker exits: {_listed(exits)}"
    if any(e.code == 137 for e in exits):  # what a user can change about it
        head += (
            f"\neach worker has {spec.memory} of memory (train_job.memory): "
            "raise it, or lower train.batch_size, if the exits were the OOM killer's"
        )
    cause = exits[0] if exits else None
    return LaunchError(
        format_failure(
            head,
            cause.replica if cause else None,
            cause.code if cause else None,
            (),
        ),
        reason="BackoffLimitExceeded",
        job_name=spec.name,
        replica=cause.replica if cause else None,
        exit_code=cause.code if cause else None,
    )
