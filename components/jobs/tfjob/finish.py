"""The launcher's finish step: a finished TFJob's result, or the error of a Failed one."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from components.jobs.errors import LaunchError
from components.jobs.launcher import LaunchResult
from components.jobs.tfjob.api import TFJobApi
from components.jobs.tfjob.status import (
    BACKOFF_MESSAGE,
    JobState,
    failure_error,
    said_why,
    terminated_exit,
)


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def failure(
    api: TFJobApi, job_uid: str, state: JobState, worker0_tail: Sequence[str]
) -> LaunchError:
    """The error for a Failed job, with the failing worker's log (worker 0's if none)."""
    failed = [pod for pod in api.pods() if terminated_exit(pod)]
    # A worker that said why it stopped (exit 2 or 3 with its record) first: its peers exit
    # 143 once they lose it, and the operator may list theirs first.
    failed.sort(
        key=lambda pod: (not said_why(pod), (pod.get("status") or {}).get("phase") != "Failed")
    )
    tail = list(worker0_tail)
    cause = None
    if failed:
        tail = api.log_tail(failed[0]["metadata"]["name"]) or tail
    elif BACKOFF_MESSAGE in state.condition.get("message", ""):
        # Past its backoff limit the operator deleted every pod: the exits that took it
        # there are in its events. Past a deadline, no exit is the cause.
        cause = next(iter(api.exits(job_uid, state)), None)
    return failure_error(api.spec, state.condition, failed[0] if failed else None, tail, cause)


def result(
    api: TFJobApi, job: Mapping[str, Any], state: JobState, started: float, reattached: bool
) -> LaunchResult:
    """What the Succeeded job reports: its wall time and GPU-hours, restarts, image digests."""
    spec = api.spec
    status = job.get("status") or {}
    begin, end = _parse_time(status.get("startTime")), _parse_time(status.get("completionTime"))
    # The operator's times cover the whole job, including before a retried launcher attached.
    wall = (end - begin).total_seconds() if begin and end else time.monotonic() - started
    gpu_hours = spec.workers * spec.gpus_per_worker * wall / 3600
    restarts = state.ledger.restarts
    api.say(f"succeeded in {wall:.0f} s after {restarts} restarts, {gpu_hours:.3f} GPU-hours")
    return LaunchResult(
        launcher="tfjob",
        job_name=spec.name,
        workers=spec.workers,
        attempts=restarts + 1,
        restarts=restarts,
        wall_seconds=wall,
        gpu_hours=gpu_hours,
        image_digests=dict(state.digests),
        reattached=reattached,
    )
