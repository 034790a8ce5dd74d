"""`gptpipe doctor --in-cluster`'s checks, made inside a pod of the run's namespace.

From a workstation, doctor checks with the kube context's identity and the user's Google
credentials; a run's steps use their pod's service account instead, and on GKE its Workload
Identity. This runs the same checks as the step's own identity, from a one-step KFP run
(pipelines/doctor.py): the verbs in the pod's namespace, the pipeline root through the storage
layer's default credentials, the metadata service at the address KFP gives every step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.doctor import checks
from components.jobs import kube
from contracts.errors import UserError


def run(pipeline_root: str, train_job: Mapping[str, Any], env: Mapping[str, str]) -> int:
    """Make the checks as this pod's identity and print them; return the blockers' count."""
    from components.lineage import store as lineage_store
    from contracts.params import TrainJob

    job = TrainJob.from_dict(dict(train_job))
    namespace = kube.pod_identity(env).namespace
    if not namespace:
        raise UserError("doctor's pod has no namespace: run it as `gptpipe doctor --in-cluster`")
    api = kube.default_api_client()
    made = [
        ("TFJob CRD", lambda: checks.tfjob_crd(api)),
        (f"access in {namespace}", lambda: checks.access(api, namespace)),
        ("pipeline root", lambda: checks.pipeline_root(pipeline_root)),
        ("metadata service", lambda: checks.metadata(lineage_store.store_address("", env))),
        ("metadata version", lambda: checks.metadata_version(api)),
        (
            "GPU nodes",
            lambda: checks.gpus(
                api, job.workers, job.gpus_per_worker, job.node_selector, job.tolerations
            ),
        ),
    ]
    return checks.report([checks.guarded(name, make) for name, make in made])


def main(pipeline_root: str, train_job: Mapping[str, Any], env: Mapping[str, str]) -> None:
    """The component's body: a blocker fails the task, so the run says so."""
    blockers = run(pipeline_root, train_job, env)
    if blockers:
        raise SystemExit(f"gptpipe doctor: {blockers} blocker(s) found in the pod: see above")
