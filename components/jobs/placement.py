"""Where a job started from a step's pod goes, and as whom its pods run: `cluster_placement`.

The train step's TFJob and the tokenize step's Indexed Job are placed alike: in the step pod's
namespace, owned by that pod, their pods running as the step's service account (or the one
asked for) and pulling images with the step pod's imagePullSecrets. The fields it returns have
the same names in `spec.JobSpec` and `indexed.spec.IndexedJobSpec`.
"""

from __future__ import annotations

from typing import Any

from components.jobs import kube
from components.jobs.spec import OwnerPod
from contracts.errors import UserError

SINGLE_USER_NAMESPACE = "kubeflow"  # where a single-user KFP runs its steps


def kfp_step_account(namespace: str) -> str:
    """The service account KFP 2.5 runs a run's step pods as: `pipeline-runner` in `kubeflow`
    (single-user), `default-editor` in a profile namespace (multi-user; the profile
    controller makes it). A TFJob's pods get it too, unless train_job.service_account names
    another (`cluster_placement`)."""
    return "pipeline-runner" if namespace == SINGLE_USER_NAMESPACE else "default-editor"


def cluster_placement(
    pod: kube.PodIdentity, service_account: str = "", api_client: Any = None
) -> dict[str, Any]:
    """Where the job goes when the launcher runs in a KFP pod, and as whom its pods run.

    The job goes to the pod's namespace, owned by the pod. Its pods get `service_account`,
    or when that is "" the step pod's own `serviceAccountName`, and the step pod's
    `imagePullSecrets`: the identity and registry access the run was given (read from the pod
    through `api_client`, by default the in-cluster client). Returns job spec fields (namespace,
    owner, service_account, image_pull_secrets); outside a pod it returns {} (plus
    `service_account` if given) and the spec's defaults apply.
    """
    placement: dict[str, Any] = {}
    if service_account:
        placement["service_account"] = service_account
    if pod.name and pod.uid:
        placement["owner"] = OwnerPod(pod.name, pod.uid)
    if pod.namespace:
        placement["namespace"] = pod.namespace
    if pod.name and pod.namespace:
        own = _own_pod_spec(api_client, pod)
        placement.setdefault("service_account", own.get("serviceAccountName") or None)
        secrets = [s["name"] for s in own.get("imagePullSecrets") or [] if s.get("name")]
        placement["image_pull_secrets"] = tuple(secrets)
    return placement


def _own_pod_spec(api_client: Any, pod: kube.PodIdentity) -> dict[str, Any]:
    from kubernetes.client.exceptions import ApiException

    try:
        client = api_client if api_client is not None else kube.default_api_client()
        found = kube.read_pod(client, pod.namespace, pod.name)
    except ApiException as exc:
        raise UserError(
            f"cannot read the step's own pod {pod.namespace}/{pod.name} ({exc.status} "
            f"{exc.reason}) to give its job's pods its service account and image pull "
            "secrets: grant the step's service account 'get' on pods"
        ) from None
    return dict(found.get("spec") or {})
