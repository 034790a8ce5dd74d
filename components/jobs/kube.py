"""Kubernetes access: the API client, the pod this process runs in, and reading a pod.

A shared layer: provenance (which image the kubelet really ran) and the train step (where its
TFJob goes, and who owns it) use it; it imports no step. The `kubernetes` package is imported
inside the functions, so code that never talks to a cluster (a local run) never loads it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from contracts.errors import UserError

T = TypeVar("T")

POD_NAME_ENV = "KFP_POD_NAME"  # KFP v2 sets it on every executor pod (downward API metadata.name)
POD_UID_ENV = "KFP_POD_UID"  # KFP v2 sets it on every executor pod (downward API metadata.uid)
# KFP sets no namespace variable; the pipeline sets this one from the pod's metadata.namespace
# (kfp-kubernetes use_field_path_as_env, pipelines/pipeline.py). The service account's
# namespace file is the fallback for pods that lack it.
POD_NAMESPACE_ENV = "GPTPIPE_POD_NAMESPACE"
POD_NAMESPACE_FIELD = "metadata.namespace"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class PodIdentity:
    """The pod this process runs in; every field is "" outside a pod (or when not exposed)."""

    name: str = ""  # metadata.name, from POD_NAME_ENV
    uid: str = ""  # metadata.uid, from POD_UID_ENV
    namespace: str = ""  # from POD_NAMESPACE_ENV (metadata.namespace), else the service account


def api_error_brief(exc: Exception) -> str:
    """An API failure in a few words: "403 Forbidden" for an ApiException, else its type."""
    status = getattr(exc, "status", None)
    return f"{status} {getattr(exc, 'reason', '')}".strip() if status else type(exc).__name__


def is_transient(exc: BaseException) -> bool:
    """An API failure that waiting may cure: 429 (the apiserver's max-in-flight filter), a 5xx
    (one restarting or overloaded), or a lost or timed-out connection."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if isinstance(exc, ApiException):
        return exc.status == 429 or (exc.status or 0) >= 500
    return isinstance(exc, HTTPError | ConnectionError | TimeoutError)


def wait_out(
    exc: Exception,
    faults: int,
    limit: int,
    say: Callable[[str], None],
    sleep: Callable[[float], None],
) -> int:
    """Back off after API failure number `faults + 1` in a row, and return that count; re-raise
    `exc` if it is not transient (`is_transient`) or is the `limit`-th in a row. The delays
    double from 1 s up to 30 s; `say` reports each one. The one backoff rule of the launcher's
    watch and the exit handler's cleanup."""
    if not is_transient(exc) or faults + 1 >= limit:
        raise exc
    delay = min(2.0**faults, 30.0)
    say(f"API unavailable ({api_error_brief(exc)}); again in {delay:.0f} s")
    sleep(delay)
    return faults + 1


def retried(
    call: Callable[[], T],
    attempts: int,
    say: Callable[[str], None],
    sleep: Callable[[float], None],
) -> T:
    """`call()`, again after a transient API failure (`wait_out`), up to `attempts` in all."""
    faults = 0
    while True:
        try:
            return call()
        except Exception as exc:
            faults = wait_out(exc, faults, attempts, say, sleep)


def pod_identity(
    env: Mapping[str, str], namespace_file: str = SERVICE_ACCOUNT_NAMESPACE
) -> PodIdentity:
    """Read the pod's identity from the downward-API environment, else the service account."""
    namespace = env.get(POD_NAMESPACE_ENV, "").strip()
    if not namespace:
        try:
            namespace = Path(namespace_file).read_text(encoding="utf-8").strip()
        except OSError:
            namespace = ""
    return PodIdentity(env.get(POD_NAME_ENV, ""), env.get(POD_UID_ENV, ""), namespace)


def default_api_client(context: str | None = None) -> Any:
    """A `kubernetes.client.ApiClient`: the pod's service account in a cluster (unless a kube
    `context` is named), else the kube config ($KUBECONFIG, or ~/.kube/config) at `context` or
    its current one. Neither there is a one-line UserError."""
    from kubernetes import client, config

    in_pod = ""  # why the pod's own account did not serve, in a pod
    try:
        if context is None:
            try:
                config.load_incluster_config()
                return client.ApiClient()
            except config.ConfigException as err:
                if os.environ.get("KUBERNETES_SERVICE_HOST"):
                    in_pod = f"in-cluster: {_first_line(err)}; "
        # kubernetes reads $KUBECONFIG once, at import; read it here, at the edge.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), context=context)
    except (config.ConfigException, OSError) as err:
        raise UserError(
            f"no Kubernetes credentials (in-cluster, $KUBECONFIG or ~/.kube/config): {in_pod}"
            f"{_first_line(err)}; point kubectl at the cluster (`kubectl config use-context ...`)"
        ) from None
    return client.ApiClient()


def _first_line(err: BaseException) -> str:
    return str(err).splitlines()[0].rstrip(".") if str(err) else type(err).__name__


def read_pod(api_client: Any, namespace: str, name: str) -> dict[str, Any]:
    """GET /api/v1/namespaces/{ns}/pods/{name} through the official client, as plain JSON."""
    from kubernetes import client

    response = client.CoreV1Api(api_client).read_namespaced_pod(
        name, namespace, _preload_content=False
    )
    return dict(json.loads(response.data))


def container_image_ids(pod: Mapping[str, Any]) -> dict[str, str]:
    """Container name -> the imageID the kubelet reports (what it really runs), from pod JSON.

    A container that has not started yet is missing, or maps to "".
    """
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return {s.get("name", ""): s.get("imageID") or "" for s in statuses}
