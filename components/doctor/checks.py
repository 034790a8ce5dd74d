"""`gptpipe doctor`'s checks of a cluster: will a run work here, before any GPU is held?

Each check asks the real service what a run will ask of it and returns a `Finding`: passed,
a blocker (with its fix), or not checkable from here (with why: not a blocker). They run from
a workstation (`gptpipe doctor`, with the kube context's identity) and inside a pod (`gptpipe
doctor --in-cluster`, with the step's own service account), so they import only the shared
layers: the Kubernetes client (components/jobs), storage and lineage.

Upstream behaviour relied on, each where it is used: API discovery of a CRD's group
(apiextensions-apiserver customresource_discovery.go), SelfSubjectAccessReview
(k8s.io/api/authorization/v1), node allocatable and taints (k8s.io/api/core/v1; toleration
matching as k8s.io/api/core/v1/toleration.go `ToleratesTaint`).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from components.jobs.access import STEP_ACCESS
from contracts.errors import UserError

GPU_RESOURCE = "nvidia.com/gpu"
TFJOB_GROUP, TFJOB_VERSION = "kubeflow.org", "v1"  # what the train step's manifests use
PROBE_FOLDER = ".gptpipe-doctor"  # under the pipeline root: the probe object's folder
# KFP's metadata server, as its manifests deploy it (manifests/kustomize/base/metadata/base/
# metadata-grpc-deployment.yaml): the image's tag is ml-metadata's version.
METADATA_DEPLOYMENT = ("kubeflow", "metadata-grpc-deployment")
# Lineage reuses stored contexts by reading them first, which every ml-metadata since 1.14
# (KFP 2.5's) supports; older servers are untested.
MIN_METADATA_VERSION = (1, 14)
MARKS = {True: "✔", False: "✘", None: "–"}  # passed, a blocker, not checkable from here


@dataclass(frozen=True)
class Finding:
    """One check's result, as doctor prints it."""

    check: str  # what was checked, a few words
    ok: bool | None  # True: passed; False: a blocker; None: not checkable from here
    detail: str  # what was found
    fix: str = ""  # what to do about it (a blocker, or a check that could not be made)


def guarded(check: str, make: Callable[[], Finding]) -> Finding:
    """`make()`, or a blocker naming what it raised: one check that fails to run must not
    hide the others' lines. A UserError (a bad input, such as a missing namespace) still ends
    doctor with its one line."""
    try:
        return make()
    except UserError:
        raise
    except Exception as err:  # the check's own failure is its finding
        return Finding(
            check,
            False,
            f"could not be checked: {type(err).__name__}: {_first_line(err)}",
            "see the error; run doctor again once it is mended",
        )


def report(findings: Sequence[Finding], say: Callable[[str], None] = print) -> int:
    """Print one line per finding, then a summary; return how many are blockers."""
    for f in findings:
        fix = f" — {f.fix}" if f.fix and f.ok is not True else ""
        say(f"{MARKS[f.ok]} {f.check}: {f.detail}{fix}")
    blockers = sum(1 for f in findings if f.ok is False)
    say(f"{blockers} blocker(s): fix them before a run" if blockers else "no blocker found")
    return blockers


def _api_status(err: Exception) -> int:
    return int(getattr(err, "status", 0) or 0)


def _get_json(api_client: Any, path: str) -> Any:
    """GET `path` from the API server as JSON (raises the client's ApiException)."""
    response = api_client.call_api(
        path, "GET", auth_settings=["BearerToken"], _preload_content=False
    )[0]
    return json.loads(response.data)


FORBIDDEN, MISSING = 403, 404  # what `_read` answers for a read refused, or of nothing there


def _read(api_client: Any, path: str) -> Any:
    """GET `path` as JSON, or FORBIDDEN or MISSING (the status) where the API server refuses
    the read or has nothing there; any other error raises."""
    from kubernetes.client.exceptions import ApiException

    try:
        return _get_json(api_client, path)
    except ApiException as err:
        if _api_status(err) in (FORBIDDEN, MISSING):
            return _api_status(err)
        raise


def namespace_exists(api_client: Any, namespace: str) -> None:
    """Refuse a namespace the API server says does not exist (a UserError); where reading
    namespaces is forbidden (a profile's identity may not), it cannot tell, and passes."""
    if _read(api_client, f"/api/v1/namespaces/{namespace}") == MISSING:
        raise UserError(
            f"namespace {namespace!r} does not exist on this cluster: pass --namespace, "
            "your profile namespace (`kubectl get namespaces`)"
        )


def tfjob_crd(api_client: Any) -> Finding:
    """The Training Operator's TFJob is served, at the version the train step submits."""
    check = "TFJob CRD"
    fix = (
        "install the Kubeflow Training Operator v1.9 (`kubectl apply --server-side -k "
        '"github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.0"`)'
    )
    group = _read(api_client, f"/apis/{TFJOB_GROUP}")
    if group == MISSING:
        return Finding(check, False, f"the API server serves no {TFJOB_GROUP} group", fix)
    if group == FORBIDDEN:
        return Finding(
            check, None, f"discovery of {TFJOB_GROUP} is forbidden to this identity", fix
        )
    versions = [v.get("version", "") for v in group.get("versions") or []]
    if TFJOB_VERSION not in versions:
        served = ", ".join(versions) or "none"
        return Finding(check, False, f"{TFJOB_GROUP} serves {served}, not {TFJOB_VERSION}", fix)
    resources = _get_json(api_client, f"/apis/{TFJOB_GROUP}/{TFJOB_VERSION}")
    if "tfjobs" not in {r.get("name") for r in resources.get("resources") or []}:
        return Finding(check, False, f"{TFJOB_GROUP}/{TFJOB_VERSION} has no tfjobs", fix)
    return Finding(check, True, f"tfjobs.{TFJOB_GROUP}/{TFJOB_VERSION} is served")


def access(api_client: Any, namespace: str) -> Finding:
    """Every verb the steps call is allowed in `namespace`: one SelfSubjectAccessReview each."""
    from kubernetes import client

    api = client.AuthorizationV1Api(api_client)
    denied = []
    for rule in STEP_ACCESS:
        resource, _, sub = rule.resource.partition("/")
        for verb in rule.verbs:
            attributes = client.V1ResourceAttributes(
                namespace=namespace, verb=verb, group=rule.group, resource=resource
            )
            if sub:
                attributes.subresource = sub
            review = client.V1SelfSubjectAccessReview(
                spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attributes)
            )
            answer = api.create_self_subject_access_review(review)
            if not answer.status.allowed:
                denied.append(f"{verb} {rule.title}")
    check = f"access in {namespace}"
    if denied:
        return Finding(
            check,
            False,
            f"denied: {', '.join(denied)}",
            f"apply deploy/rbac.yaml in {namespace} (`kubectl -n {namespace} apply -f "
            "deploy/rbac.yaml`), binding it to the run's service account",
        )
    verbs = sum(len(rule.verbs) for rule in STEP_ACCESS)
    return Finding(check, True, f"all {verbs} verbs the steps use are allowed")


def pipeline_root(root: str) -> Finding:
    """The pipeline root takes a write, a read and a delete (a probe object, removed)."""
    from components import storage

    probe = storage.join(root, f"{PROBE_FOLDER}/{uuid.uuid4().hex}")
    data = b"gptpipe doctor probe\n"
    check = "pipeline root"
    fix = (
        "grant the run's Google service account roles/storage.objectAdmin on the bucket "
        "(docs/operations.md, Workload Identity)"
    )
    step = "write"
    try:
        storage.write_bytes(probe, data)
        step = "read"
        if storage.read_bytes(probe) != data:
            return Finding(check, False, f"{probe} read back other bytes", fix)
        step = "delete"
        storage.delete_file(probe)
    except Exception as err:  # a UserError from storage, or google.auth's RefreshError (a
        # Workload Identity binding missing), a transport error: each is the finding
        why = str(err) if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
        return Finding(check, False, f"cannot {step} {probe}: {_first_line(Exception(why))}", fix)
    return Finding(check, True, f"{root} takes a write, a read and a delete")


WORKLOAD_IDENTITY = "iam.gke.io/gcp-service-account"  # GKE: the Google account a KSA acts as


def workload_identity(api_client: Any, namespace: str, account: str) -> Finding:
    """The steps' service account names the Google account it acts as (GKE Workload
    Identity). Whether Google honours it (the IAM binding, the bucket role) only a pod can
    prove: `--in-cluster`'s probe of the pipeline root does."""
    check = "workload identity"
    fix = (
        f"on GKE: `kubectl -n {namespace} annotate serviceaccount {account} "
        f"{WORKLOAD_IDENTITY}=GSA@PROJECT.iam.gserviceaccount.com` and bind the Google account "
        "(docs/operations.md, Workload Identity); then `gptpipe doctor --in-cluster` proves it"
    )
    found = _read(api_client, f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}")
    if found == MISSING:
        return Finding(check, False, f"no service account {namespace}/{account}", fix)
    if found == FORBIDDEN:
        return Finding(check, None, f"service account {namespace}/{account} not readable", fix)
    google = ((found.get("metadata") or {}).get("annotations") or {}).get(WORKLOAD_IDENTITY)
    if not google:
        return Finding(
            check,
            None,
            f"{namespace}/{account} names no Google account ({WORKLOAD_IDENTITY}): its pods "
            "need Google credentials some other way",
            fix,
        )
    return Finding(check, True, f"{namespace}/{account} acts as {google}")


def metadata(store_uri: str) -> Finding:
    """The metadata service answers (a cheap read: its context types)."""
    from components.lineage import store as lineage_store

    check = "metadata service"
    try:
        found = lineage_store.open_store(store_uri, timeout_s=10.0)
        found.get_context_types()
    except Exception as err:  # any failure to answer is the finding; its type says which
        return Finding(
            check,
            False,
            f"{store_uri} does not answer ({type(err).__name__}: {_first_line(err)})",
            "check the metadata-grpc-service (`kubectl -n kubeflow get svc "
            "metadata-grpc-service`) and --metadata",
        )
    return Finding(check, True, f"{store_uri} answers")


def metadata_version(api_client: Any) -> Finding:
    """ml-metadata's version, from the metadata server's image tag, where it can be read."""
    check = "metadata version"
    ns, name = METADATA_DEPLOYMENT
    found = _read(api_client, f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")
    if found in (FORBIDDEN, MISSING):
        why = "not readable" if found == FORBIDDEN else "not found"
        return Finding(
            check,
            None,
            f"deployment {ns}/{name} {why}: version unknown",
            "lineage works with ml-metadata 1.14 (KFP 2.5's) and later",
        )
    containers = found.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
    image = containers[0].get("image", "") if containers else ""
    match = re.search(r":(\d+)\.(\d+)\.(\d+)", image)
    if match is None:
        return Finding(check, None, f"{image or 'no image'}: no version in its tag")
    version = tuple(int(n) for n in match.groups())
    text = ".".join(match.groups())
    if version[:2] < MIN_METADATA_VERSION:
        least = ".".join(map(str, MIN_METADATA_VERSION))
        return Finding(
            check,
            False,
            f"ml-metadata {text} ({image})",
            f"upgrade KFP's metadata server to ml-metadata {least} or later (KFP 2.5 ships it)",
        )
    return Finding(check, True, f"ml-metadata {text}")


def gpus(
    api_client: Any,
    workers: int,
    gpus_per_worker: int,
    node_selector: Mapping[str, str],
    tolerations: Sequence[Mapping[str, Any]],
) -> Finding:
    """Enough allocatable GPUs, on nodes the workers may land on, for every worker at once."""
    check = "GPU nodes"
    if gpus_per_worker <= 0:
        return Finding(check, True, "the run's workers ask for no GPU")
    listed = _read(api_client, "/api/v1/nodes")
    if listed == FORBIDDEN:
        return Finding(
            check,
            None,
            "listing nodes is forbidden to this identity (a cluster-scoped read)",
            "ask an admin for `kubectl get nodes -o wide`, or run doctor as one",
        )
    nodes = (listed.get("items") if isinstance(listed, dict) else None) or []
    # A pod asking for nvidia.com/gpu gets a toleration of the nvidia.com/gpu taint from the
    # ExtendedResourceToleration admission plugin (plugin/pkg/admission/
    # extendedresourcetoleration/admission.go), which GKE turns on for its GPU node pools.
    granted = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    allowed = [*tolerations, *granted]
    fit = [n for n in nodes if _selected(n, node_selector) and _tolerated(n, allowed)]
    slots = sum(_allocatable_gpus(n) // gpus_per_worker for n in fit)
    total = sum(_allocatable_gpus(n) for n in fit)
    need = f"{workers} worker(s) x {gpus_per_worker} {GPU_RESOURCE}"
    where = _describe_placement(node_selector, tolerations)
    if slots < workers:
        return Finding(
            check,
            False,
            f"{need} do not fit: {len(fit)} node(s){where} have {total} allocatable GPU(s), "
            f"room for {slots} worker(s)",
            "add GPU nodes, or pass fewer train_job.workers, or fix train_job.node_selector "
            "and train_job.tolerations",
        )
    return Finding(check, True, f"{need} fit on {len(fit)} node(s){where} ({total} GPUs)")


def _allocatable_gpus(node: Mapping[str, Any]) -> int:
    value = str((node.get("status") or {}).get("allocatable", {}).get(GPU_RESOURCE, "0"))
    return int(value) if value.isdigit() else 0


def _selected(node: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _tolerated(node: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """Every taint that keeps pods off (NoSchedule, NoExecute) is tolerated."""
    taints = (node.get("spec") or {}).get("taints") or []
    blocking = [t for t in taints if t.get("effect") in ("NoSchedule", "NoExecute")]
    return all(any(_tolerates(t, taint) for t in tolerations) for taint in blocking)


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """k8s.io/api/core/v1/toleration.go `ToleratesTaint`: the effect matches (empty: any),
    the key matches (empty with Exists: any), and Exists, or Equal (the default) with the
    same value."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if key and key != taint.get("key"):
        return False
    if not key and operator != "Exists":
        return False
    if operator == "Exists":
        return True
    return (toleration.get("value") or "") == (taint.get("value") or "")


def _describe_placement(
    selector: Mapping[str, str], tolerations: Sequence[Mapping[str, Any]]
) -> str:
    parts = [f"{k}={v}" for k, v in sorted(selector.items())]
    if tolerations:
        parts.append(f"{len(tolerations)} toleration(s)")
    return f" matching {', '.join(parts)}" if parts else ""


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__
