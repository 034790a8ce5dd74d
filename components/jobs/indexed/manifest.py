"""The batch/v1 Job manifest for an `IndexedJobSpec`: pure, no API calls.

`completionMode: Indexed`: the Job controller runs one pod per index until each succeeded,
`parallelism` at a time, and gives each its index in the `JOB_COMPLETION_INDEX` variable (from
the pod's `batch.kubernetes.io/job-completion-index` annotation). `backoffLimitPerIndex` runs a
failed index again that many times, then fails it alone; the job fails once every index ended.
`podFailurePolicy` (both need `restartPolicy: Never`): a part's exit `INPUT_ERROR_EXIT` fails
the whole job at once (bad input, which no retry cures), and a pod disrupted (preempted,
evicted, its node drained: the `DisruptionTarget` condition) is run again without counting.
A part says why it stopped in its termination message, as the trainer does (the container's
`terminationMessagePath`, and `WORKER_MESSAGE_ENV` pointing at it). The pods are the TFJob
workers' kind (components/jobs/pods.py): restricted, no API token, requests equal to limits.
"""

from __future__ import annotations

from typing import Any

from components.jobs import pods
from components.jobs.indexed.spec import IndexedJobSpec
from contracts.termination import INPUT_ERROR_EXIT, TERMINATION_MESSAGE_PATH, WORKER_MESSAGE_ENV

API_VERSION, KIND, PLURAL = "batch/v1", "Job", "jobs"
CONTAINER = "part"  # the pod's one container
# Set by the API server on a Job's pods (pkg/registry/batch/job/strategy.go `generateSelector`)
LABEL_JOB_NAME = "batch.kubernetes.io/job-name"
LABEL_CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"  # and label, on every pod


def pod_failure_policy() -> dict[str, Any]:
    """Bad input fails the job at once; a disruption is not a failure of the part."""
    return {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": [INPUT_ERROR_EXIT],
                },
            },
            {
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
        ]
    }


def _pod_template(spec: IndexedJobSpec) -> dict[str, Any]:
    env = {"PYTHONUNBUFFERED": "1", **spec.env, WORKER_MESSAGE_ENV: TERMINATION_MESSAGE_PATH}
    resources = {"cpu": spec.cpu, "memory": spec.memory}
    container = {
        "name": CONTAINER,
        "image": spec.image,
        "command": list(spec.command),
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "resources": {"requests": resources, "limits": dict(resources)},
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "File",
        "securityContext": pods.container_security(),
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Never",  # podFailurePolicy and backoffLimitPerIndex need it
        "automountServiceAccountToken": False,
        "securityContext": pods.pod_security(),
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.tolerations]
    if spec.service_account:
        pod_spec["serviceAccountName"] = spec.service_account
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in spec.image_pull_secrets]
    metadata: dict[str, Any] = {"labels": pods.job_labels(spec.run_id, spec.labels)}
    if spec.pod_annotations:
        metadata["annotations"] = dict(spec.pod_annotations)
    return {"metadata": metadata, "spec": pod_spec}


def build_manifest(spec: IndexedJobSpec) -> dict[str, Any]:
    """The batch/v1 Indexed Job for `spec`, as the JSON the API server takes.

    Raises `UserError` if the image is not pinned by digest (unless `spec.allow_unpinned`).
    """
    pods.check_pinned("IndexedJobSpec", spec.image, spec.allow_unpinned)
    metadata: dict[str, Any] = {
        "name": spec.name,
        "namespace": spec.namespace,
        "labels": pods.job_labels(spec.run_id, spec.labels),
    }
    if spec.owner is not None:
        # No blockOwnerDeletion: it needs update rights on pods/finalizers the launcher lacks.
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": spec.owner.name, "uid": spec.owner.uid}
        ]
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": spec.completions,
        "parallelism": min(spec.parallelism, spec.completions),
        "backoffLimitPerIndex": spec.backoff_limit_per_index,
        "podFailurePolicy": pod_failure_policy(),
        "template": _pod_template(spec),
    }
    if spec.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = spec.active_deadline_seconds
    if spec.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": job_spec}
