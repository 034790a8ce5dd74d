"""The Job launcher's first step: create the Job, or attach to the one an earlier attempt made
(components/jobs/reattach.py says the rules; a Job past its activeDeadlineSeconds is Failed
with reason DeadlineExceeded).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.jobs.errors import LaunchError, LaunchTimeout
from components.jobs.indexed.api import JobApi
from components.jobs.indexed.status import condition
from components.jobs.reattach import create_or_reattach


def submit(api: JobApi, manifest: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create the job; if it exists, re-attach to it, or run it again if it Failed. Returns the
    job and whether the launcher re-attached."""
    return create_or_reattach(
        api,
        manifest,
        failed=lambda job: condition(job, "Failed"),
        past_deadline=lambda failed: _past_deadline(api, failed),
        delete_failed=lambda: api.delete(
            why="Failed in an earlier attempt", propagation="Foreground"
        ),
        setup_problem=lambda status: setup_problem(api, status),
        kubectl_kind="job",
    )


def _past_deadline(api: JobApi, failed: Mapping[str, Any]) -> LaunchError | None:
    if failed.get("reason") != "DeadlineExceeded":
        return None
    return LaunchTimeout(
        f"{api.what} ran past its deadline in an earlier attempt: {failed.get('message')}",
        reason="DeadlineExceeded",
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
