"""The API server double's view of the cluster around the jobs: what `gptpipe doctor` asks.

From the Kubernetes 1.31 source and the API types (k8s.io/api):
- **SelfSubjectAccessReview** (`POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews`):
  k8s.io/api/authorization/v1/types.go (spec.resourceAttributes: namespace, verb, group,
  resource, subresource, name; status: allowed, denied, reason);
  pkg/registry/authorization/selfsubjectaccessreview/rest.go `Create`: the spec is validated
  (pkg/apis/authorization/validation: exactly one of resourceAttributes and
  nonResourceAttributes, else 422 Invalid), the request's user is asked of the authorizer, and
  the object comes back with its status, 201 Created as every create
  (apiserver/pkg/endpoints/handlers/create.go). A review never fails for a namespace that does
  not exist: RBAC decides on names alone. Here `Access.denied` says what RBAC would refuse.
- **API discovery of a CRD's group** (`GET /apis/kubeflow.org`, `/apis/kubeflow.org/v1`):
  apiextensions-apiserver pkg/apiserver/customresource_discovery.go: an APIGroup with its
  versions and preferred version, an APIResourceList of the version's resources; 404 NotFound
  when no CRD serves the group or version. `Access.crd_versions` lists what is installed.
- **Namespaces** (`GET /api/v1/namespaces/{name}`): a Namespace, or 404 NotFound; `Access`
  answers 403 instead where `get namespaces` is denied (cluster-scoped: a profile's
  default-editor has no such right).
- **Nodes** (`GET /api/v1/nodes`): a NodeList (labels, spec.taints, status.allocatable); 403
  where `list nodes` is denied.
- **Deployments** (`GET /apis/apps/v1/namespaces/{ns}/deployments/{name}`): KFP's
  metadata-grpc-deployment, for its server image's tag; 404 or 403 likewise.
- **ServiceAccounts** (`GET /api/v1/namespaces/{ns}/serviceaccounts/{name}`): the steps'
  identity, for its Workload Identity annotation (GKE's `iam.gke.io/gcp-service-account`);
  404 or 403 likewise.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests.doubles.kubernetes.store import status_object

if TYPE_CHECKING:
    from tests.doubles.kubernetes.apiserver import _Handler

SSAR_PATH = ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"]
RUNNER = "system:serviceaccount:kubeflow:pipeline-runner"


@dataclass
class Access:
    """What the cluster around the jobs holds, and what the caller may do in it."""

    # (namespace, verb, group, resource) that RBAC refuses; namespace "" is cluster scope
    denied: set[tuple[str, str, str, str]] = field(default_factory=set)
    namespaces: set[str] | None = None  # the namespaces that exist; None: any does
    crd_versions: dict[str, list[str]] = field(default_factory=lambda: {"kubeflow.org": ["v1"]})
    nodes: list[dict[str, Any]] = field(default_factory=list)
    deployments: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    service_accounts: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    reviews: list[dict[str, Any]] = field(default_factory=list)  # each review's attributes

    def allows(self, namespace: str, verb: str, group: str, resource: str) -> bool:
        """RBAC's answer, for this double's one user."""
        return (namespace, verb, group, resource) not in self.denied

    def deny(self, namespace: str, verb: str, group: str, resource: str) -> None:
        self.denied.add((namespace, verb, group, resource))


def node(
    name: str,
    gpus: int,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A Node as the API serves it: allocatable GPUs, labels and taints."""
    allocatable = {"cpu": "16", "memory": "64Gi"}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": taints} if taints else {},
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }


def is_cluster(parts: list[str]) -> bool:
    """A path this module serves."""
    return (
        parts == SSAR_PATH
        or parts[:1] == ["apis"]
        and len(parts) in (2, 3)
        and parts[1] != "authorization.k8s.io"
        or parts[:3] == ["api", "v1", "nodes"]
        or (parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 4)
        or (parts[:3] == ["apis", "apps", "v1"] and parts[5:6] == ["deployments"])
        or (parts[:3] == ["api", "v1", "namespaces"] and parts[4:5] == ["serviceaccounts"])
    )


def handle(handler: _Handler, method: str, parts: list[str], body: Any) -> None:
    access: Access = handler.kube.access
    if method == "POST" and parts == SSAR_PATH:
        return _review(handler, access, body)
    if method != "GET":
        return handler._send_json(405, status_object(405, "MethodNotAllowed", method))
    if parts[:1] == ["apis"] and len(parts) in (2, 3):
        return _discovery(handler, access, parts[1], parts[2] if len(parts) == 3 else "")
    if parts[:3] == ["api", "v1", "nodes"]:
        if not access.allows("", "list", "", "nodes"):
            return handler._send_json(403, _forbidden("list", "nodes", ""))
        items = copy.deepcopy(access.nodes)
        return handler._send_json(200, {"kind": "NodeList", "apiVersion": "v1", "items": items})
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 6:
        return _named(handler, access.service_accounts, parts[3], "", "serviceaccounts", parts[5])
    if parts[:3] == ["api", "v1", "namespaces"]:
        name = parts[3]
        if not access.allows("", "get", "", "namespaces"):
            return handler._send_json(403, _forbidden("get", "namespaces", "", name))
        if access.namespaces is not None and name not in access.namespaces:
            msg = f'namespaces "{name}" not found'
            return handler._send_json(404, status_object(404, "NotFound", msg, name))
        found = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        return handler._send_json(200, {**found, "status": {"phase": "Active"}})
    ns, name = parts[4], parts[6] if len(parts) > 6 else ""
    return _named(handler, access.deployments, ns, "apps", "deployments", name)


def _named(
    handler: _Handler,
    objects: dict[tuple[str, str], dict[str, Any]],
    ns: str,
    group: str,
    resource: str,
    name: str,
) -> None:
    """GET one namespaced object: 403 where RBAC denies it, 404 where there is none."""
    access: Access = handler.kube.access
    if not access.allows(ns, "get", group, resource):
        return handler._send_json(403, _forbidden("get", resource, ns, name, group))
    found = objects.get((ns, name))
    if found is None:
        title = f"{resource}.{group}" if group else resource
        msg = f'{title} "{name}" not found'
        return handler._send_json(404, status_object(404, "NotFound", msg, name))
    return handler._send_json(200, copy.deepcopy(found))


def _review(handler: _Handler, access: Access, body: Any) -> None:
    spec = (body or {}).get("spec") or {}
    attributes = spec.get("resourceAttributes")
    if (attributes is None) == (spec.get("nonResourceAttributes") is None):
        msg = (
            "SelfSubjectAccessReview.authorization.k8s.io is invalid: spec: Invalid value: "
            "exactly one of nonResourceAttributes or resourceAttributes must be specified"
        )
        return handler._send_json(422, status_object(422, "Invalid", msg))
    attributes = attributes or {}
    access.reviews.append(dict(attributes))
    resource = attributes.get("resource", "")
    if attributes.get("subresource"):
        resource = f"{resource}/{attributes['subresource']}"
    allowed = access.allows(
        attributes.get("namespace", ""),
        attributes.get("verb", ""),
        attributes.get("group", ""),
        resource,
    )
    # The RBAC authorizer gives a reason when it allows (the binding) and none when it has no
    # opinion, which the union authorizer reports as allowed=false without `denied`
    # (plugin/pkg/auth/authorizer/rbac/rbac.go `Authorize`).
    status: dict[str, Any] = {"allowed": allowed}
    if allowed:
        status["reason"] = f'RBAC: allowed by RoleBinding "gptpipe-launcher" of {RUNNER}'
    answer = {
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": status,
    }
    handler._send_json(201, answer)


def _discovery(handler: _Handler, access: Access, group: str, version: str) -> None:
    versions = access.crd_versions.get(group)
    if not versions or (version and version not in versions):
        path = "/".join(p for p in ("apis", group, version) if p)
        msg = "the server could not find the requested resource"
        return handler._send_json(404, status_object(404, "NotFound", f"{msg} ({path})"))
    if not version:
        listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return handler._send_json(
            200,
            {
                "kind": "APIGroup",
                "apiVersion": "v1",
                "name": group,
                "versions": listed,
                "preferredVersion": listed[0],
            },
        )
    resources = [
        {
            "name": "tfjobs",
            "singularName": "tfjob",
            "namespaced": True,
            "kind": "TFJob",
            "verbs": ["delete", "deletecollection", "get", "list", "patch", "create", "update"]
            + ["watch"],
        }
    ]
    answer = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}"}
    handler._send_json(200, {**answer, "resources": resources})


def _forbidden(verb: str, resource: str, ns: str, name: str = "", group: str = "") -> dict:
    """A 403 Status as the RBAC authorizer's denial becomes one (store.forbidden's form)."""
    where = f'in the namespace "{ns}"' if ns else "at the cluster scope"
    why = f'User "{RUNNER}" cannot {verb} resource "{resource}" in API group "{group}" {where}'
    what = f'{resource} "{name}"' if name else resource
    return status_object(403, "Forbidden", f"{what} is forbidden: {why}", name)
