"""The launcher's first step: create the TFJob, or attach to the one an earlier attempt made.

A retried launcher (a retried train step) finds its job by name (`naming.job_name`): it
re-attaches to a running one, and one that Failed it deletes and creates again, unless it ran
past its deadline, which bounds the job across retries. A job of another run under the same
name is refused.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from components.jobs.errors import LaunchError
from components.jobs.tfjob.api import TFJobApi
from components.jobs.tfjob.manifest import GROUP, LABEL_RUN_ID, PLURAL, VERSION
from components.jobs.tfjob.status import condition_true, past_deadline_error
from contracts.errors import UserError

DELETE_WAIT_SECONDS = 300  # how long a re-attach waits for a Failed job to be deleted


def submit(api: TFJobApi, manifest: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
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
    failed = condition_true(job, "Failed")
    if failed is None and not job["metadata"].get("deletionTimestamp"):
        api.say(f"re-attached to existing {api.what}")
        return job, True
    if failed is not None and (past := past_deadline_error(api.spec, failed)) is not None:
        raise past
    if failed is not None:
        api.say(
            f"{api.what} failed in an earlier attempt "
            f"({failed.get('reason', '')}: {failed.get('message', '')}); running it again"
        )
        api.delete(why="Failed in an earlier attempt")
    _wait_gone(api, job["metadata"]["uid"])
    return api.create(manifest), False


def _refuse_another_runs(api: TFJobApi, job: Mapping[str, Any]) -> None:
    spec = api.spec
    owner_run = (job["metadata"].get("labels") or {}).get(LABEL_RUN_ID, "")
    if spec.run_id and owner_run != spec.run_id:
        raise UserError(
            f"{api.what} already exists for run {owner_run!r}, not "
            f"{spec.run_id!r}: choose another job name (naming.job_name(run_id, task_id))"
        )


def _wait_gone(api: TFJobApi, uid: str) -> None:
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
        time.sleep(1)
    raise LaunchError(
        f"{api.what} was not deleted within {DELETE_WAIT_SECONDS} s; "
        "delete it (kubectl delete tfjob) and retry",
        reason="DeleteTimeout",
        job_name=api.spec.name,
    )


def setup_problem(api: TFJobApi, status: int) -> str:
    """What a 403 or 404 on creating a TFJob means for the person setting the cluster up."""
    if status == 403:
        return (
            f"not allowed to create TFJobs in namespace {api.spec.namespace}: apply "
            "deploy/rbac.yaml there, for the service account the pipeline's steps run as; run "
            "from your own machine (gptpipe gpu-bench), your kubeconfig's user needs the rights "
            "that file's Role grants"
        )
    return (
        f"the cluster has no TFJob resource ({GROUP}/{VERSION} {PLURAL}): install the Kubeflow "
        "Training Operator 1.9 with its TFJob CRD"
    )
