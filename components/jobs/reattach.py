"""A launcher's first step, for either kind of job: create it, or attach to the one an earlier
attempt made (tfjob/submit.py and indexed/submit.py fill in what differs).

A retried launcher (a retried step) finds its job by name (`naming.job_name`): it re-attaches
to one still there and not Failed (running, or finished well: its result is read at once); one
that Failed it deletes and creates again, unless it ran past its deadline, which bounds the job
across retries. A job of another run under the same name is refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from components.jobs.errors import LaunchError
from components.jobs.naming import LABEL_RUN_ID
from contracts.errors import UserError

DELETE_WAIT_SECONDS = 300  # how long a re-attach waits for a Failed job to be deleted
DELETE_POLL_SECONDS = 0.5


class JobCalls(Protocol):
    """What both kinds' API wrappers (tfjob/api.py, indexed/api.py) offer this step."""

    spec: Any  # the job's spec: its name, namespace and run_id
    what: str  # how messages name the job

    def say(self, message: str) -> None: ...
    def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]: ...
    def get(self) -> dict[str, Any]: ...


def create_or_reattach(
    api: JobCalls,
    manifest: Mapping[str, Any],
    *,
    failed: Callable[[Mapping[str, Any]], Mapping[str, Any] | None],
    past_deadline: Callable[[Mapping[str, Any]], LaunchError | None],
    delete_failed: Callable[[], None],
    setup_problem: Callable[[int], str],
    kubectl_kind: str,
) -> tuple[dict[str, Any], bool]:
    """Create the job; if it exists, re-attach to it, or run it again if it Failed. Returns the
    job and whether the launcher re-attached.

    `failed` is the job's Failed condition (None: it has none), `past_deadline` the error for a
    Failed condition that says the job ran past its deadline (None: another failure),
    `delete_failed` deletes the job, `setup_problem` says what a 403 or 404 on create means,
    `kubectl_kind` names the resource in the fix for a job that will not go.
    """
    from kubernetes.client.exceptions import ApiException

    try:
        return api.create(manifest), False
    except ApiException as exc:
        if exc.status in (403, 404):
            raise UserError(setup_problem(exc.status)) from None
        if exc.status != 409:
            raise
    job = api.get()
    _refuse_another_runs(api, job)
    condition = failed(job)
    if condition is None and not job["metadata"].get("deletionTimestamp"):
        api.say(f"re-attached to existing {api.what}")
        return job, True
    if condition is not None:
        if (past := past_deadline(condition)) is not None:
            raise past
        api.say(
            f"{api.what} failed in an earlier attempt "
            f"({condition.get('reason', '')}: {condition.get('message', '')}); running it again"
        )
        delete_failed()
    _wait_gone(api, job["metadata"]["uid"], kubectl_kind)
    return api.create(manifest), False


def _refuse_another_runs(api: JobCalls, job: Mapping[str, Any]) -> None:
    spec = api.spec
    owner_run = (job["metadata"].get("labels") or {}).get(LABEL_RUN_ID, "")
    if spec.run_id and owner_run != spec.run_id:
        raise UserError(
            f"{api.what} already exists for run {owner_run!r}, not "
            f"{spec.run_id!r}: choose another job name (naming.job_name(run_id, task_id))"
        )


def _wait_gone(api: JobCalls, uid: str, kubectl_kind: str) -> None:
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
        time.sleep(DELETE_POLL_SECONDS)
    raise LaunchError(
        f"{api.what} was not deleted within {DELETE_WAIT_SECONDS} s; "
        f"delete it (kubectl delete {kubectl_kind}) and retry",
        reason="DeleteTimeout",
        job_name=api.spec.name,
    )
