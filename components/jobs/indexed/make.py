"""The one place that picks an indexed launcher (`make_indexed_launcher`), and places a job on
the cluster from the step's own pod (`place`).

Only the chosen launcher's module is imported, so a local run loads no Kubernetes client.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from components.jobs import kube
from components.jobs.indexed.launcher import IndexedLauncher
from components.jobs.indexed.spec import IndexedJobSpec
from components.jobs.placement import cluster_placement
from contracts.errors import UserError
from contracts.params import PART_LAUNCHERS


def make_indexed_launcher(kind: str, log_dir: str | None = None) -> IndexedLauncher:
    """The indexed launcher named `kind` (one of `PART_LAUNCHERS`): "local" runs the parts as
    processes here, keeping their logs under `log_dir` (a local folder; None: a temporary one,
    removed after success); "job" runs them as an Indexed Job with the default client
    (in-cluster, then kubeconfig), and the pods keep the logs."""
    if kind == "local":
        from components.jobs.indexed.local import LocalIndexedLauncher

        return LocalIndexedLauncher(log_dir=log_dir)
    if kind == "job":
        from components.jobs.indexed.job import IndexedJobLauncher

        return IndexedJobLauncher()
    raise UserError(f"launcher {kind!r} is unknown: use one of {', '.join(PART_LAUNCHERS)}")


def place(
    spec: IndexedJobSpec,
    pod: kube.PodIdentity,
    service_account: str = "",
    api_client: Any = None,
) -> IndexedJobSpec:
    """`spec` placed from the step's own `pod`, as the train step places its TFJob
    (components/jobs/placement.py `cluster_placement`): its namespace, owned by it, its
    service account (or `service_account`) and image pull secrets. Outside a pod, `spec`."""
    return dataclasses.replace(spec, **cluster_placement(pod, service_account, api_client))
