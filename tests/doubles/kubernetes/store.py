"""The Kubernetes API server's state in the double: TFJobs, batch/v1 Jobs, pods, their logs, the
watch history, and the Events recorded on them (tests/event_recorder.py).

Each behaviour follows the Kubernetes source named beside it:
- create: uid, creationTimestamp, resourceVersion; a pod without serviceAccountName gets
  "default" (plugin/pkg/admission/serviceaccount/admission.go) and starts Pending;
- PATCH with application/merge-patch+json, what the Python client sends for a custom object
  (staging/src/k8s.io/apimachinery/pkg/util/json merge patch, RFC 7386); status is a subresource
  of the TFJob CRD, so a patch of the object leaves it alone;
- DELETE with a propagationPolicy (staging/src/k8s.io/apiserver/pkg/registry/generic/registry/
  store.go, `Delete` and `updateForGracefulDeletionAndFinalizers`): Foreground marks the job
  (deletionTimestamp, finalizer foregroundDeletion: a MODIFIED event) and removes it (DELETED)
  only once the garbage collector (pkg/controller/garbagecollector/garbagecollector.go) has
  deleted every pod it owns; Background, the default for custom resources, removes it at once
  and the collector deletes its pods after; Orphan leaves them, without their ownerReference
  to it (the collector's `orphanDependents`). A batch/v1 Job deleted without a policy orphans
  its pods (pkg/registry/batch/job/strategy.go `DefaultGarbageCollectionPolicy`: OrphanDependents
  for batch/v1, kept for compatibility; the apiserver warns so);
- a pod's log is its lines, each stamped with the time it was written, as the container
  runtime's CRI log file has them (`2016-10-06T00:17:09.669794202Z stdout F ...`, parsed by
  pkg/kubelet/kuberuntime/logs/logs.go, `parseCRILog`);
- pod deletion is graceful (pkg/registry/core/pod/strategy.go, `CheckGracefulDelete`): the pod
  gets deletionTimestamp and deletionGracePeriodSeconds (its terminationGracePeriodSeconds), and
  the kubelet removes it once its containers stopped (`on_pod_deleting`). Without a kubelet (the
  scripted scenarios) nothing runs, so the pod goes at once.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FOREGROUND = "foregroundDeletion"  # metav1.FinalizerDeleteDependents
DEFAULT_GRACE_SECONDS = 30  # k8s.io/api/core/v1 DefaultTerminationGracePeriodSeconds
RUNNER = "system:serviceaccount:kubeflow:pipeline-runner"  # who the launcher runs as


def now() -> str:
    """metav1.Now() as the apiserver serializes it: RFC 3339, whole seconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def status_object(code: int, reason: str, message: str, name: str = "") -> dict[str, Any]:
    """A metav1.Status, as the apiserver returns for errors."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 400 else "Success",
        "message": message,
        "reason": reason,
        "details": {"name": name, "group": "kubeflow.org", "kind": "tfjobs"},
        "code": code,
    }


def forbidden(verb: str, resource: str, namespace: str, name: str = "") -> dict[str, Any]:
    """The 403 Status the RBAC authorizer's denial becomes: apimachinery's
    errors.NewForbidden ("<resource> [\"<name>\"] is forbidden: <why>") around
    apiserver/pkg/endpoints/handlers/responsewriters/errors.go `forbiddenMessage`, for the
    service account deploy/rbac.yaml binds."""
    why = (
        f'User "{RUNNER}" cannot {verb} resource "{resource}" in API group "" '
        f'in the namespace "{namespace}"'
    )
    kind = resource.split("/")[0]
    what = f'{kind} "{name}"' if name else kind
    return status_object(403, "Forbidden", f"{what} is forbidden: {why}", name)


# An Event's fields a list selects by: pkg/registry/core/event/strategy.go `ToSelectableFields`
# (metadata.name and metadata.namespace from generic.ObjectMetaFieldsSet; `source` falls back to
# reportingComponent), the labels pkg/apis/core/v1/conversion.go
# `AddFieldLabelConversionsForEvent` accepts; any other is 400 "field label not supported".
_INVOLVED = ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")


def event_fields(event: dict[str, Any]) -> dict[str, str]:
    ref = event.get("involvedObject") or {}
    reporting = event.get("reportingComponent", "")
    return {
        "metadata.name": event["metadata"]["name"],
        "metadata.namespace": event["metadata"]["namespace"],
        **{f"involvedObject.{k}": str(ref.get(k, "")) for k in _INVOLVED},
        "reason": event.get("reason", ""),
        "reportingComponent": reporting,
        "source": (event.get("source") or {}).get("component", "") or reporting,
        "type": event.get("type", ""),
    }


def field_terms(selector: str) -> list[tuple[str, str, bool]]:
    """A field selector's terms as (field, value, negated) (apimachinery pkg/fields/selector.go
    `ParseSelector`: terms joined by commas, each `key=value`, `key==value` or `key!=value`)."""
    terms = []
    for term in filter(None, selector.split(",")):
        negated = "!=" in term
        key, _, value = term.replace("!=", "=").replace("==", "=").partition("=")
        terms.append((key, value, negated))
    return terms


def unsupported_event_field(selector: str) -> str:
    """The first field an event list cannot be selected by, "" if none."""
    known = event_fields({"metadata": {"name": "", "namespace": ""}})
    return next((key for key, _, _ in field_terms(selector) if key not in known), "")


def event_matches(event: dict[str, Any], selector: str) -> bool:
    fields = event_fields(event)
    return all((fields[key] == value) != negated for key, value, negated in field_terms(selector))


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def owner_uid(obj: dict[str, Any]) -> str:
    """The uid of the object's controller (its ownerReference with controller: true)."""
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid", ""))
    return ""


def job_label(pod: dict[str, Any]) -> str:
    return (pod["metadata"].get("labels") or {}).get("training.kubeflow.org/job-name", "")


class PodLog(list):
    """One pod's log records, with `stamps`: when each was written (ns since the epoch), and
    `partial`: whether it is a partial record, output not ended by a newline (the runtime's
    "P" tag, pkg/kubelet/kuberuntime/logs/logs.go `parseCRILog`), served without one."""

    def __init__(self) -> None:
        super().__init__()
        self.stamps: list[int] = []
        self.partial: list[bool] = []

    def append(self, line: str, partial: bool = False) -> None:
        super().append(line)
        self.stamps.append(time.time_ns())
        self.partial.append(partial)

    def extend(self, lines: Any) -> None:
        for line in lines:
            self.append(line)


@dataclass
class Cluster:
    """The double's objects. Callers hold `cond` (the one lock) while reading or changing them."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    tfjobs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    jobs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # batch/v1 Jobs
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    logs: dict[str, PodLog] = field(default_factory=dict)  # pod uid -> lines
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)  # rv, type, obj
    # Event objects (core/v1), what event_recorder.py records: (namespace, name) -> event
    kube_events: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    rv: int = 100
    closed: bool = False
    job_key: tuple[str, str] = ("", "")  # the TFJob created last (the one a scenario drives)
    # terminationGracePeriodSeconds of a pod that sets none: 30 in Kubernetes; tests shorten it
    default_grace_seconds: int = DEFAULT_GRACE_SECONDS
    # The kubelet's hook for a pod marked for deletion; without one the pod is removed at once.
    on_pod_deleting: Callable[[dict[str, Any]], None] | None = None

    # -- TFJobs and batch/v1 Jobs (resource "tfjobs" or "jobs") --

    def store(self, resource: str) -> dict[tuple[str, str], dict[str, Any]]:
        return self.jobs if resource == "jobs" else self.tfjobs

    def _emit(self, kind: str, job: dict[str, Any]) -> None:
        self.rv += 1
        job["metadata"]["resourceVersion"] = str(self.rv)
        self.events.append((self.rv, kind, copy.deepcopy(job)))
        self.cond.notify_all()

    def add_job(
        self,
        body: dict[str, Any],
        resource: str = "tfjobs",
        prepare: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Create the object; `prepare` is the resource's PrepareForCreate, once it has a uid."""
        job = copy.deepcopy(body)
        meta = job["metadata"]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        job["status"] = {}
        if prepare is not None:
            prepare(job)
        self.store(resource)[(meta["namespace"], meta["name"])] = job
        if resource == "tfjobs":
            self.job_key = (meta["namespace"], meta["name"])
        self._emit("ADDED", job)
        return job

    def patch_job(self, key: tuple[str, str], patch: dict[str, Any]) -> dict[str, Any]:
        job = self.tfjobs[key]
        patch = {k: v for k, v in patch.items() if k != "status"}  # the status subresource
        patched = merge_patch(job, patch)
        job.clear()
        job.update(patched)
        self._emit("MODIFIED", job)
        return job

    def set_job_status(
        self, key: tuple[str, str], status: dict[str, Any], resource: str = "tfjobs"
    ) -> None:
        """PUT .../status (the operator's UpdateJobStatusInApiServer): an event if it changed."""
        job = self.store(resource).get(key)
        if job is not None and job.get("status") != status:
            job["status"] = copy.deepcopy(status)
            self._emit("MODIFIED", job)

    def delete_job(
        self, key: tuple[str, str], propagation: str = "Background", resource: str = "tfjobs"
    ) -> dict[str, Any]:
        job = self.store(resource)[key]
        uid = job["metadata"]["uid"]
        if propagation == "Foreground":
            meta = job["metadata"]
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = now()
                meta["finalizers"] = [*meta.get("finalizers", []), FOREGROUND]
                self._emit("MODIFIED", job)
            self._collect(uid)
            self._finish_foreground()
            return copy.deepcopy(job)
        self.store(resource).pop(key)
        self._emit("DELETED", job)
        if propagation != "Orphan":
            self._collect(uid)
        else:
            self._orphan(uid)
        return copy.deepcopy(job)

    def _orphan(self, uid: str) -> None:
        """The garbage collector's orphanDependents: the pods lose their ownerReference."""
        for pod in self.pods.values():
            refs = pod["metadata"].get("ownerReferences") or []
            if any(r.get("uid") == uid for r in refs):
                pod["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid]

    def _collect(self, uid: str) -> None:
        """The garbage collector: delete every pod the (deleted) object controls."""
        for pod in [p for p in self.pods.values() if owner_uid(p) == uid]:
            self.delete_pod(pod)

    def _finish_foreground(self) -> None:
        """Remove foreground-deleted jobs whose dependents are gone (the collector's last step)."""
        for resource, key, job in [
            (r, k, j) for r in ("tfjobs", "jobs") for k, j in self.store(r).items()
        ]:
            meta = job["metadata"]
            if FOREGROUND not in meta.get("finalizers", []):
                continue
            if any(owner_uid(p) == meta["uid"] for p in self.pods.values()):
                continue
            meta["finalizers"] = [f for f in meta["finalizers"] if f != FOREGROUND]
            if not meta["finalizers"]:
                del meta["finalizers"]
                self.store(resource).pop(key)
                self._emit("DELETED", job)

    # -- pods --

    def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """POST /api/v1/namespaces/{ns}/pods: admission defaults, then Pending for the kubelet."""
        pod = copy.deepcopy(pod)
        meta = pod["metadata"]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), resourceVersion=str(self.rv))
        pod["spec"].setdefault("serviceAccountName", "default")
        pod["spec"].setdefault("terminationGracePeriodSeconds", self.default_grace_seconds)
        pod["status"] = {"phase": "Pending"}
        self.pods[(meta["namespace"], meta["name"])] = pod
        self.logs[meta["uid"]] = PodLog()
        self.cond.notify_all()
        return pod

    def delete_pod(self, pod: dict[str, Any]) -> None:
        """Graceful deletion: mark the pod; the kubelet stops its containers and removes it."""
        meta = pod["metadata"]
        if not meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = now()
            meta["deletionGracePeriodSeconds"] = pod["spec"].get(
                "terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS
            )
        if self.on_pod_deleting is None:
            self.remove_pod(pod)
        else:
            self.on_pod_deleting(pod)
        self.cond.notify_all()

    def remove_pod(self, pod: dict[str, Any]) -> None:
        """The pod object goes away (the kubelet's final delete with grace period 0)."""
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        if self.pods.get(key) is pod:
            del self.pods[key]
        self._finish_foreground()
        self.cond.notify_all()

    def owned_pods(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """The pods the job controls (the operator's GetPodsForJob, without adoption)."""
        uid = job["metadata"]["uid"]
        return [p for p in self.pods.values() if owner_uid(p) == uid]

    def add_pod(
        self,
        namespace: str,
        name: str,
        images: dict[str, tuple[str, str]],
        *,
        service_account: str = "default",
        image_pull_secrets: tuple[str, ...] = (),
    ) -> None:
        """A running pod outside any TFJob (a KFP executor pod): container -> (image, imageID)."""
        with self.cond:
            stamp = now()
            spec: dict[str, Any] = {
                "containers": [{"name": c, "image": image} for c, (image, _) in images.items()],
                "serviceAccountName": service_account,
            }
            if image_pull_secrets:
                spec["imagePullSecrets"] = [{"name": s} for s in image_pull_secrets]
            statuses = [
                {
                    "name": c,
                    "image": image,
                    "imageID": image_id,
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": stamp}},
                }
                for c, (image, image_id) in images.items()
            ]
            self.pods[(namespace, name)] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": str(uuid.uuid4()),
                    "labels": {},
                    "creationTimestamp": stamp,
                },
                "spec": spec,
                "status": {"phase": "Running", "startTime": stamp, "containerStatuses": statuses},
            }
            self.cond.notify_all()
