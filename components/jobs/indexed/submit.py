"""The Job launcher's first step: create the Job, or attach to the one an earlier attempt made.

A retried launcher (a retried step) finds its Job by name (`naming.job_name`): it re-attaches
to one still there and not Failed (running, or Complete: its result is read at once); one that
Failed it deletes and creates again, unless it ran past its deadline, which bounds the job
across retries. A Job of another run under the same name is refused.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from components.jobs.errors import LaunchError, LaunchTimeout
from components.jobs.indexed.api import JobApi
from components.jobs.indexed.status import condition
from components.jobs.naming import LABEL_RUN_ID
from contracts.errors import UserError

DELETE_WAIT_SECONDS = 300  # how long a re-attach waits for a Failed job to be deleted


def submit(api: JobApi, manifest: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create the job; if it exists, re-attach to it, or run it again if it Failed. Returns the
    job and whether the launcher re-attached."""
    from kubernetes.client.exceptions import ApiException

    try:
        return api.create(manifest), False
    except ApiException as exc:
        if exc.status in (403, 404):
            raise UserError(setup_problem(api, exc.status)) from None
        if exc.status != 409:
            raise
    job = api.get()
    _refuse_another_runs(api, job)
    failed = condition(job, "Failed")
    if failed is None and not job["metadata"].get("deletionTimestamp"):
        api.say(f"re-attached to existing {api.what}")
        return job, True
    if failed is not None and failed.get("reason") == "DeadlineExceeded":
        raise LaunchTimeout(
            f"{api.what} ran past its deadline in an earlier attempt: {failed.get('message')}",
            reason="DeadlineExceeded",
            job_name=api.spec.name,
        )
    if failed is not None:
        api.say(
            f"{api.what} failed in an earlier attempt "
            f"({failed.get('reason', '')}: {failed.get('message', '')}); running it again"
        )
        api.delete(why="Failed in an earlier attempt", propagation="Foreground")
    _wait_gone(api, job["metadata"]["uid"])
    return api.create(manifest), False


def _refuse_another_runs(api: JobApi, job: Mapping[str, Any]) -> None:
    spec = api.spec
    owner_run = (job["metadata"].get("labels") or {}).get(LABEL_RUN_ID, "")
    if spec.run_id and owner_run != spec.run_id:
        raise UserError(
            f"{api.what} already exists for run {owner_run!r}, not "
            f"{spec.run_id!r}: choose another job name (naming.job_name(run_id, task_id))"
        )


def _wait_gone(api: JobApi, uid: str) -> None:
    """Wait until the job with `uid` is deleted (its pods first: foreground deletion)."""
    from kubernetes.client.exceptions import ApiException

    until = time.monotonic() + DELETE_WAIT_SECONDS
    while time.monotonic() < until:
        try:
            if api.get()["metadata"]["uid"] != uid:
                return
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(0.5)
    raise LaunchError(
        f"{api.what} was not deleted within {DELETE_WAIT_SECONDS} s; "
        "delete it (kubectl delete job) and retry",
        reason="DeleteTimeout",
        job_name=api.spec.name,
    )


def setup_problem(api: JobApi, status: int) -> str:
    """What a 403 or 404 on creating a Job means for the person setting the cluster up."""
    if status == 403:
        return (
            f"not allowed to create Jobs in namespace {api.spec.namespace}: apply "
            "deploy/rbac.yaml there, for the service account the pipeline's steps run as"
        )
    return (
        "the cluster serves no batch/v1 Jobs: an Indexed Job with backoffLimitPerIndex needs "
        "Kubernetes 1.29 or later"
    )
