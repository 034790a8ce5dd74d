"""What the steps ask of the Kubernetes API: each (API group, resource) and the verbs on it.

The one list of the launcher's calls (the train step's TFJob, tokenize's Indexed Job, the
step's own pod, worker logs and events): deploy/rbac.yaml grants exactly this
(tests/deploy/test_deploy.py), and `gptpipe doctor` asks the API server, one
SelfSubjectAccessReview per verb, whether the run's identity has it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """Verbs on one resource, as an RBAC rule names them."""

    group: str  # the API group: "" for the core group
    resource: str  # plural, with a subresource after a slash ("pods/log")
    verbs: tuple[str, ...]  # what the steps call

    @property
    def title(self) -> str:
        """`tfjobs.kubeflow.org`, `pods/log`: as kubectl names the resource."""
        return f"{self.resource}.{self.group}" if self.group else self.resource


STEP_ACCESS: tuple[Rule, ...] = (
    Rule("kubeflow.org", "tfjobs", ("create", "get", "list", "watch", "patch", "delete")),
    Rule("batch", "jobs", ("create", "get", "list", "watch", "delete")),
    Rule("", "pods", ("get", "list")),
    Rule("", "pods/log", ("get",)),
    Rule("", "events", ("list",)),
)
