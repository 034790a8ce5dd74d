"""The API server double's batch/v1 Jobs: create, get, list, watch and delete.

What the apiserver does with a Job before the Job controller (job_controller.py) sees it, from
the Kubernetes 1.31 source:
- defaults, pkg/apis/batch/v1/defaults.go `SetDefaults_Job`: completions and parallelism 1,
  completionMode NonIndexed, backoffLimit 6 (MaxInt32 when backoffLimitPerIndex is set),
  suspend false, podReplacementPolicy Failed with a podFailurePolicy (else
  TerminatingOrFailed), a pod condition pattern's status True;
- the selector, pkg/registry/batch/job/strategy.go `generateSelector`: matchLabels
  `batch.kubernetes.io/controller-uid: <uid>`, and the template's labels get
  `batch.kubernetes.io/controller-uid`, `batch.kubernetes.io/job-name` and their legacy
  `controller-uid`, `job-name`;
- validation, pkg/apis/batch/validation/validation.go `validateJobSpec`: the template's
  restartPolicy Never or OnFailure, Never under a podFailurePolicy or backoffLimitPerIndex,
  backoffLimitPerIndex only with completionMode Indexed, FailIndex only with it, exit code 0
  never in an `In` rule; a 422 Invalid Status otherwise;
- DELETE without a propagationPolicy orphans the pods (store.py).
Label selectors are equality terms (`a=b,c=d`); watches select by `metadata.name=` or labels.
"""

from __future__ import annotations

import copy
import json
import time
from typing import TYPE_CHECKING, Any

from tests.doubles.kubernetes.store import status_object

if TYPE_CHECKING:
    from tests.doubles.kubernetes.apiserver import _Handler

MAX_INT32 = 2**31 - 1
PREFIX = ["apis", "batch", "v1", "namespaces"]


def is_batch(parts: list[str]) -> bool:
    """/apis/batch/v1/namespaces/{ns}/jobs[/{name}]"""
    return parts[:4] == PREFIX and parts[5:6] == ["jobs"] and len(parts) in (6, 7)


def matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def defaulted(job: dict[str, Any]) -> None:
    """SetDefaults_Job (module docstring), in place."""
    spec = job.setdefault("spec", {})
    spec.setdefault("completions", 1)
    spec.setdefault("parallelism", 1)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("backoffLimit", MAX_INT32 if "backoffLimitPerIndex" in spec else 6)
    spec.setdefault("suspend", False)
    policy = spec.get("podFailurePolicy")
    spec.setdefault("podReplacementPolicy", "Failed" if policy else "TerminatingOrFailed")
    for rule in (policy or {}).get("rules") or []:
        for pattern in rule.get("onPodConditions") or []:
            pattern.setdefault("status", "True")


def prepare(job: dict[str, Any]) -> None:
    """PrepareForCreate: the defaults, then generateSelector (module docstring)."""
    defaulted(job)
    meta, spec = job["metadata"], job["spec"]
    uid, name = meta["uid"], meta["name"]
    spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    template_meta = spec["template"].setdefault("metadata", {})
    template_meta["labels"] = {
        **(template_meta.get("labels") or {}),
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": name,
        "controller-uid": uid,
        "job-name": name,
    }


def invalid(job: dict[str, Any]) -> str:
    """What validateJobSpec refuses in `job` (defaulted), "" if nothing."""
    spec = job["spec"]
    restart = spec["template"].get("spec", {}).get("restartPolicy", "Always")
    per_index = "backoffLimitPerIndex" in spec
    if restart not in ("Never", "OnFailure"):
        return f'spec.template.spec.restartPolicy: Unsupported value: "{restart}"'
    if (spec.get("podFailurePolicy") or per_index) and restart != "Never":
        return "spec.template.spec.restartPolicy: Invalid value: only Never is supported"
    if per_index and spec["completionMode"] != "Indexed":
        return "spec.backoffLimitPerIndex: Invalid value: requires completionMode Indexed"
    for i, rule in enumerate((spec.get("podFailurePolicy") or {}).get("rules") or []):
        if rule["action"] == "FailIndex" and not per_index:
            return f"spec.podFailurePolicy.rules[{i}].action: FailIndex needs backoffLimitPerIndex"
        codes = rule.get("onExitCodes") or {}
        if codes.get("operator") == "In" and 0 in codes.get("values", []):
            return f"spec.podFailurePolicy.rules[{i}].onExitCodes.values: 0 is not allowed"
    return ""


def handle(handler: _Handler, method: str, parts: list[str], query: dict[str, str], body: Any):
    """Serve one batch/v1 Jobs request (`is_batch(parts)`)."""
    cluster = handler.kube.cluster
    ns, name = parts[4], parts[6] if len(parts) == 7 else ""
    if method == "POST" and not name:
        return _create(handler, ns, body)
    if method == "GET" and name:
        with cluster.cond:
            job = copy.deepcopy(cluster.jobs.get((ns, name)))
        if job is None:
            return handler._send_json(404, _not_found(name))
        return handler._send_json(200, job)
    if method == "GET" and query.get("watch", "").lower() in ("true", "1"):
        return _watch(handler, ns, query)
    if method == "GET":
        return _list(handler, ns, query)
    if method == "DELETE" and name:
        policy = query.get("propagationPolicy") or (body or {}).get("propagationPolicy")
        with cluster.cond:
            if (ns, name) not in cluster.jobs:
                return handler._send_json(404, _not_found(name))
            job = cluster.delete_job((ns, name), policy or "Orphan", resource="jobs")
        return handler._send_json(200, job)
    return handler._send_json(405, status_object(405, "MethodNotAllowed", method))


def _not_found(name: str) -> dict[str, Any]:
    return status_object(404, "NotFound", f'jobs.batch "{name}" not found', name)


def _create(handler: _Handler, ns: str, body: dict[str, Any]) -> None:
    cluster = handler.kube.cluster
    name = body["metadata"]["name"]
    with cluster.cond:
        if (ns, name) in cluster.jobs:
            msg = f'jobs.batch "{name}" already exists'
            return handler._send_json(409, status_object(409, "AlreadyExists", msg, name))
        body["metadata"]["namespace"] = ns
        probe = copy.deepcopy(body)
        defaulted(probe)
        if problem := invalid(probe):
            message = f'Job.batch "{name}" is invalid: {problem}'
            return handler._send_json(422, status_object(422, "Invalid", message, name))
        job = copy.deepcopy(cluster.add_job(body, resource="jobs", prepare=prepare))
    handler._send_json(201, job)
    return None


def _list(handler: _Handler, ns: str, query: dict[str, str]) -> None:
    cluster = handler.kube.cluster
    selector = query.get("labelSelector", "")
    with cluster.cond:
        items = [
            copy.deepcopy(job)
            for (n, _), job in cluster.jobs.items()
            if n == ns and matches(job["metadata"].get("labels") or {}, selector)
        ]
        rv = str(cluster.rv)
    body = {"apiVersion": "batch/v1", "kind": "JobList", "metadata": {"resourceVersion": rv}}
    handler._send_json(200, {**body, "items": items})


def _selected(job: dict[str, Any], ns: str, query: dict[str, str]) -> bool:
    meta = job["metadata"]
    name = query.get("fieldSelector", "").removeprefix("metadata.name=")
    return (
        job.get("apiVersion") == "batch/v1"
        and meta["namespace"] == ns
        and (not name or meta["name"] == name)
        and matches(meta.get("labels") or {}, query.get("labelSelector", ""))
    )


def _watch(handler: _Handler, ns: str, query: dict[str, str]) -> None:
    """A watch of the namespace's Jobs from `resourceVersion` (none: the current ones first,
    as ADDED), for `timeoutSeconds`, newline-delimited in a chunked response."""
    cluster = handler.kube.cluster
    until = time.monotonic() + float(query.get("timeoutSeconds", 1800))
    since = int(query.get("resourceVersion") or 0)
    handler._start_stream("application/json")
    try:
        with cluster.cond:
            if since == 0:
                for job in cluster.jobs.values():
                    if _selected(job, ns, query):
                        handler._chunk(_line("ADDED", job))
                since = cluster.rv
            while not cluster.closed and time.monotonic() < until:
                for rv, kind, obj in cluster.events:
                    if rv > since and _selected(obj, ns, query):
                        handler._chunk(_line(kind, obj))
                    since = max(since, rv)
                cluster.cond.wait(timeout=max(0.0, min(0.2, until - time.monotonic())))
        handler._chunk(b"")
    except (BrokenPipeError, ConnectionResetError):
        handler.close_connection = True


def _line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"
