"""Deleting Indexed Jobs nobody else would stop: the launcher's own clean-up step, and the
pipeline's exit handler (components/train/release.py), which deletes a run's unfinished Jobs.

The launcher deletes its Job when it stops watching it on SIGTERM (a cancelled run) or its own
timeout. A Job that failed stopped its pods itself and is left to `ttlSecondsAfterFinished`,
so its pods' logs stay readable (the error carries the failing part's last lines); an API
error leaves the Job running, for a retried launcher to re-attach to. Deletion is foreground
(the pods first): a batch/v1 Job deleted without a propagationPolicy would orphan its pods.

The exit handler runs however the run ended, so transient API failures are waited out there,
a few times (`kube.retried`), as for TFJobs (components/jobs/tfjob/cleanup.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from components.jobs import kube
from components.jobs.errors import LaunchCancelled, LaunchTimeout
from components.jobs.indexed.api import JobApi
from components.jobs.indexed.status import finished
from components.jobs.naming import LABEL_RUN_ID, run_label
from contracts.errors import UserError

ATTEMPTS = 5  # per API call: about 15 s of backoff in all


def clean_up(api: JobApi, stopped: BaseException) -> None:
    """The launcher's last step when it stops watching its job on `stopped`: delete the job
    on a cancel or the launcher's own timeout (module docstring)."""
    ours = isinstance(stopped, LaunchTimeout | LaunchCancelled | KeyboardInterrupt)
    if ours and getattr(stopped, "reason", "") != "DeadlineExceeded":  # that job stays
        api.delete(why=type(stopped).__name__, propagation="Foreground")


def delete_run_jobs(
    api_client: Any,
    namespace: str,
    run_id: str,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Delete every unfinished batch/v1 Job of run `run_id` in `namespace` (by its run-id
    label), its pods first. A Complete or Failed job runs nothing and is left to its TTL.
    Returns the names of the jobs deleted."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    label = run_label(run_id)
    if not label:
        raise UserError(f"run id {run_id!r} names no run: pass the KFP run id whose jobs to delete")
    batch = client.BatchV1Api(api_client)

    def listed() -> Any:
        return batch.list_namespaced_job(
            namespace, label_selector=f"{LABEL_RUN_ID}={label}", _preload_content=False
        )

    jobs = json.loads(kube.retried(listed, ATTEMPTS, _say, sleep).data).get("items") or []
    deleted = []
    for job in jobs:
        name = job["metadata"]["name"]
        if finished(job):
            continue

        def delete(name: str = name) -> Any:
            return batch.delete_namespaced_job(name, namespace, propagation_policy="Foreground")

        try:
            kube.retried(delete, ATTEMPTS, _say, sleep)
        except ApiException as exc:
            if exc.status != 404:  # gone already (a retried delete that had gone through)
                raise
            continue
        deleted.append(name)
    return deleted


def _say(message: str) -> None:
    print(f"release: {message}")
