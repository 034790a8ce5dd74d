"""The Job launcher's finish step: a Complete Job's result, or the error of a Failed one.

A Failed Job's error names its reason (PodFailurePolicy, FailedIndexes, DeadlineExceeded,
BackoffLimitExceeded), its failed indexes and the failing part's exit and last log lines. A
part that exited `INPUT_ERROR_EXIT` having written an input-error record in its termination
message makes the error a `WorkerInputError` whose first line is that record's message.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from components.jobs import kube
from components.jobs.errors import LaunchError, LaunchTimeout, format_failure, told_error
from components.jobs.indexed.api import JobApi
from components.jobs.indexed.launcher import IndexedResult
from components.jobs.indexed.manifest import CONTAINER, INDEX_ANNOTATION
from components.jobs.indexed.status import condition, parse_indexes
from contracts import termination


def _parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def _terminated(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The part container's `state.terminated`, {} while it has none."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            return dict((status.get("state") or {}).get("terminated") or {})
    return {}


def _index(pod: Mapping[str, Any]) -> int:
    return int((pod["metadata"].get("annotations") or {}).get(INDEX_ANNOTATION, -1))


def result(api: JobApi, job: Mapping[str, Any], started: float, reattached: bool) -> IndexedResult:
    """What the Complete job reports: its wall time, retries and the pods' image digests."""
    status = job.get("status") or {}
    begin, end = _parse_time(status.get("startTime")), _parse_time(status.get("completionTime"))
    wall = (end - begin).total_seconds() if begin and end else time.monotonic() - started
    digests = {}
    for pod in api.pods(job["metadata"]["uid"]):
        image_id = kube.container_image_ids(pod).get(CONTAINER, "")
        if image_id:
            digests[pod["metadata"]["name"]] = image_id.rsplit("@", 1)[-1]
    retries = int(status.get("failed") or 0)
    api.say(f"succeeded in {wall:.0f} s after {retries} retries")
    spec = api.spec
    return IndexedResult("job", spec.name, spec.completions, wall, retries, digests, reattached)


def failure(api: JobApi, job: Mapping[str, Any]) -> LaunchError:
    """The error for a Failed job (module docstring)."""
    failed = condition(job, "Failed") or {}
    reason, message = failed.get("reason", ""), failed.get("message", "")
    status = job.get("status") or {}
    indexes = status.get("failedIndexes") or ""
    pods = [p for p in api.pods(job["metadata"]["uid"]) if _terminated(p).get("exitCode")]
    pods.sort(key=lambda p: _terminated(p).get("finishedAt") or "")
    told = [p for p in pods if _terminated(p)["exitCode"] == termination.INPUT_ERROR_EXIT]
    in_failed = [p for p in pods if _index(p) in parse_indexes(indexes)]
    pod = next(iter(told or in_failed or pods), None)
    head = f"{api.what} failed ({reason}): {message}"
    if indexes:
        head += f"; failed indexes: {indexes}"
    if reason == "DeadlineExceeded":
        return LaunchTimeout(head, reason=reason, job_name=api.spec.name)
    if pod is None:
        return LaunchError(head, reason=reason, job_name=api.spec.name)
    ended = _terminated(pod)
    code, replica = int(ended["exitCode"]), f"index-{_index(pod)}"
    tail = api.log_tail(pod["metadata"]["name"])
    said = termination.parse(ended.get("message") or "")
    if error := told_error(api.spec, api.what, replica, code, said, tail):
        return error
    return LaunchError(
        format_failure(head, replica, code, tail),
        reason=reason,
        job_name=api.spec.name,
        replica=replica,
        exit_code=code,
        log_tail=tail,
    )
