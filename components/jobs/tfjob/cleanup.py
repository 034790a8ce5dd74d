"""Deleting TFJobs nobody else would stop: the launcher's own clean-up step, and the pipeline's
exit handler (components/train/release.py), which deletes a run's unfinished TFJobs.

The launcher deletes its job when it stops watching it on SIGTERM (a cancelled run), its own
timeout, or an error by which it ends a job the operator would go on running (`ENDED_BY_US`).
A job the operator failed is left to `ttlSecondsAfterFinished` (its pods keep the logs), as is
one past its deadline, and an API error leaves the job running, for a retried launcher to
re-attach to.

The exit handler runs however the run ended: a cancelled run, a train step killed by OOM or
eviction, or a launcher that crashed would otherwise leave workers holding GPUs until
activeDeadlineSeconds. It also runs after a run that succeeded, so one apiserver hiccup here
must not turn that run into a failed one: transient API failures (`kube.is_transient`) are
waited out, a few times.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from components.jobs import kube
from components.jobs.errors import LaunchCancelled, LaunchError, LaunchTimeout
from components.jobs.naming import run_label
from components.jobs.tfjob.api import TFJobApi
from components.jobs.tfjob.manifest import GROUP, LABEL_RUN_ID, PLURAL, VERSION
from components.jobs.tfjob.status import condition_true
from contracts.errors import UserError

T = TypeVar("T")
# The errors by which the launcher ends a job the operator would go on running (restarts past
# the backoff limit; a worker's permanent exit, or its exit 2 or 3 saying why, while the job
# is Restarting: kubeflow/trainer#2044; a worker that cannot start: start.py): the job is
# deleted, its workers' GPUs freed.
ENDED_BY_US = frozenset(
    {
        "BackoffLimitExceeded",
        "PermanentWorkerError",
        "WorkerInputError",
        "WorkerPermanentError",
        "WorkerCannotStart",
    }
)


def clean_up(api: TFJobApi, stopped: BaseException) -> None:
    """The launcher's last step when it stops watching its job on `stopped`: delete the job if
    nobody else would stop it (module docstring)."""
    if isinstance(stopped, LaunchTimeout | LaunchCancelled | KeyboardInterrupt):
        if getattr(stopped, "reason", "") != "DeadlineExceeded":  # that job stays: a record
            api.delete(why=type(stopped).__name__)
    elif isinstance(stopped, LaunchError) and stopped.reason in ENDED_BY_US:
        api.delete(why=stopped.reason)


ATTEMPTS = 5  # per API call: about 15 s of backoff in all


def delete_run_jobs(
    api_client: Any,
    namespace: str,
    run_id: str,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Delete every unfinished TFJob of run `run_id` in `namespace` (by its run-id label).

    Deletion is foreground (the workers' pods first). A Succeeded or Failed job holds no GPU
    and is left to `ttlSecondsAfterFinished`, so a failed job's pods and logs stay readable.
    Returns the names of the jobs deleted.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    label = run_label(run_id)
    if not label:
        raise UserError(f"run id {run_id!r} names no run: pass the KFP run id whose jobs to delete")
    custom = client.CustomObjectsApi(api_client)
    jobs = _retried(
        lambda: custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, label_selector=f"{LABEL_RUN_ID}={label}"
        ),
        sleep,
    )
    deleted = []
    for job in jobs.get("items", []):
        name = job["metadata"]["name"]
        if condition_true(job, "Succeeded") or condition_true(job, "Failed"):
            continue

        def delete(name: str = name) -> Any:
            return custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, propagation_policy="Foreground"
            )

        try:
            _retried(delete, sleep)
        except ApiException as exc:
            if exc.status != 404:  # gone already (a retried delete that had gone through)
                raise
            continue
        deleted.append(name)
    return deleted


def _retried(call: Callable[[], T], sleep: Callable[[float], None]) -> T:
    """`call()`, again after a transient API failure, up to ATTEMPTS times in all."""
    return kube.retried(call, ATTEMPTS, _say, sleep)


def _say(message: str) -> None:
    print(f"release: {message}")
