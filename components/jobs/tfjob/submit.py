"""The launcher's first step: create the TFJob, or attach to the one an earlier attempt made
(components/jobs/reattach.py says the rules; a TFJob's deadline is the operator's
runPolicy.activeDeadlineSeconds, status.py `past_deadline_error`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.jobs.reattach import create_or_reattach
from components.jobs.tfjob.api import TFJobApi
from components.jobs.tfjob.manifest import GROUP, PLURAL, VERSION
from components.jobs.tfjob.status import condition_true, past_deadline_error


def submit(api: TFJobApi, manifest: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create the job; if it exists, re-attach to it, or run it again if it Failed. Returns the
    job and whether the launcher re-attached."""
    return create_or_reattach(
        api,
        manifest,
        failed=lambda job: condition_true(job, "Failed"),
        past_deadline=lambda failed: past_deadline_error(api.spec, failed),
        delete_failed=lambda: api.delete(why="Failed in an earlier attempt"),
        setup_problem=lambda status: setup_problem(api, status),
        kubectl_kind="tfjob",
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
